"""Tensor usage records: the input of every activation memory planner.

A record is Pisarchyk & Lee's triple ``(first_op, last_op, size)`` plus the tensor's
``id``: the tensor is live from the operator that first uses it to the operator that
last uses it, both inclusive, in one fixed execution order. Two tensors whose usage
intervals intersect can never share memory. Sizes are the *aligned* sizes in bytes
(64 bytes by default, the cache line and the alignment ``torch`` uses for CPU buffers),
so every offset a planner computes from them is aligned too.

Records are plain frozen dataclasses; bad values raise :class:`~layerfit.errors.PlanError`
naming the record, so a planner never sees a nonsensical input. Every plan is a set of
int64 byte offsets (NumPy, OR-Tools), so sizes — and their sum, which bounds every
plan's total — are at most ``2**63 - 1`` bytes, and operator indices at most
``2**31 - 1``; the alignment is a power of two up to ``2**30``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerfit import sizes
from layerfit.errors import PlanError

DEFAULT_ALIGNMENT = 64
MAX_BYTES = 2**63 - 1  # int64: a size, and the sum of all sizes (every plan's total fits)
MAX_OP = 2**31 - 1  # operator indices are positions in one execution order
MAX_ALIGNMENT = 2**30


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_alignment(alignment: Any, name: str = "alignment") -> int:
    """``alignment`` if it is a power of two from 1 to ``2**30`` bytes, else PlanError.

    ``name`` is how the caller spells the value (``--align`` on the command line).
    """
    if not _is_int(alignment) or not 1 <= alignment <= MAX_ALIGNMENT or alignment & (alignment - 1):
        raise PlanError(
            f"{name} must be a power of two from 1 to 2**30 bytes (1, 2, 4, …, 64, …), "
            f"got {alignment!r}"
        )
    return alignment


def check_time_limit(seconds: Any, name: str = "time_limit") -> float:
    """``seconds`` if it is a positive, finite number, else PlanError: an infinite limit
    would let a solver or search run for hours. ``name`` as in :func:`check_alignment`."""
    if (
        not isinstance(seconds, int | float)
        or isinstance(seconds, bool)
        or not math.isfinite(seconds)
        or not seconds > 0
    ):
        raise PlanError(f"{name} must be a positive, finite number of seconds, got {seconds!r}")
    return float(seconds)


def align_up(size: int, alignment: int = DEFAULT_ALIGNMENT) -> int:
    """``size`` rounded up to a multiple of ``alignment``, checked to be a power of two:
    :func:`layerfit.sizes.align_up` as ``layerfit.memory`` exports it (with its default
    and its check, as before the rule had one home)."""
    check_alignment(alignment)
    return sizes.align_up(size, alignment)


@dataclass(frozen=True, order=False)
class TensorUsageRecord:
    """One activation tensor: live from op ``first_op`` to op ``last_op`` inclusive.

    ``size`` is in bytes and already aligned; ``id`` is any integer unique within a
    record set (a tensor id of the captured graph).
    """

    id: int
    first_op: int
    last_op: int
    size: int

    def __post_init__(self) -> None:
        for name in ("id", "first_op", "last_op", "size"):
            if not _is_int(getattr(self, name)):
                raise PlanError(
                    f"tensor usage record {self.id!r}: {name} must be an integer, "
                    f"got {getattr(self, name)!r}"
                )
        if self.first_op < 0:
            raise PlanError(
                f"tensor usage record {self.id}: first_op {self.first_op} is negative; "
                "operator indices start at 0"
            )
        for name in ("first_op", "last_op"):
            if getattr(self, name) > MAX_OP:
                raise PlanError(
                    f"tensor usage record {self.id}: {name} {getattr(self, name)} is beyond "
                    f"{MAX_OP} (2**31 - 1); number operators by their position in the "
                    "execution order"
                )
        if self.first_op > self.last_op:
            raise PlanError(
                f"tensor usage record {self.id}: first_op {self.first_op} is after "
                f"last_op {self.last_op}; a tensor must be produced before its last use"
            )
        if self.size < 0:
            raise PlanError(
                f"tensor usage record {self.id}: size {self.size} is negative; "
                "sizes are byte counts"
            )
        if self.size > MAX_BYTES:
            raise PlanError(
                f"tensor usage record {self.id}: size {self.size} is beyond {MAX_BYTES} "
                "(2**63 - 1) bytes, more than any arena can address"
            )

    def intersects(self, other: TensorUsageRecord) -> bool:
        """Whether the two usage intervals share an operator (then memory can't be shared)."""
        return self.first_op <= other.last_op and other.first_op <= self.last_op

    def to_dict(self) -> dict[str, int]:
        return {
            "id": self.id,
            "first_op": self.first_op,
            "last_op": self.last_op,
            "size": self.size,
        }


def check_records(records: Sequence[TensorUsageRecord]) -> None:
    """Raise PlanError unless ``records`` is a sequence of records with unique ids whose
    sizes add up to at most ``2**63 - 1`` bytes (so every plan's offsets fit int64)."""
    seen: set[int] = set()
    total = 0
    for rec in records:
        if not isinstance(rec, TensorUsageRecord):
            raise PlanError(
                f"expected TensorUsageRecord items, got {type(rec).__name__} {rec!r}; "
                "build records with layerfit.memory.make_records"
            )
        if rec.id in seen:
            raise PlanError(
                f"duplicate tensor id {rec.id} in the usage records; ids must be unique"
            )
        seen.add(rec.id)
        total += rec.size
    if total > MAX_BYTES:
        largest = max(records, key=lambda r: r.size)
        raise PlanError(
            f"the {len(records)} tensor usage records add up to {total} bytes, beyond "
            f"{MAX_BYTES} (2**63 - 1) that int64 offsets can address (largest: record "
            f"{largest.id} of {largest.size} bytes); check the sizes and the alignment"
        )


_FIELDS = ("id", "first_op", "last_op", "size")


def _record_from(item: Any, position: int) -> TensorUsageRecord:
    if isinstance(item, TensorUsageRecord):
        return item
    if isinstance(item, Mapping):
        missing = [k for k in _FIELDS if k not in item]
        if missing:
            raise PlanError(
                f"tensor usage record #{position} {dict(item)!r} lacks {', '.join(missing)}; "
                'each record needs "id", "first_op", "last_op" and "size"'
            )
        unknown = [k for k in item if k not in _FIELDS]
        if unknown:
            raise PlanError(
                f"tensor usage record #{position} {dict(item)!r} has unknown field(s) "
                f"{', '.join(map(repr, unknown))}; a record has exactly "
                '"id", "first_op", "last_op" and "size"'
            )
        return TensorUsageRecord(item["id"], item["first_op"], item["last_op"], item["size"])
    if isinstance(item, Sequence) and not isinstance(item, str | bytes) and len(item) == 4:
        return TensorUsageRecord(*item)
    raise PlanError(
        f"tensor usage record #{position} {item!r} is neither a mapping with "
        '"id", "first_op", "last_op", "size" nor an (id, first_op, last_op, size) tuple'
    )


def make_records(
    items: Iterable[TensorUsageRecord | Mapping[str, Any] | Sequence[int]],
    alignment: int = DEFAULT_ALIGNMENT,
) -> list[TensorUsageRecord]:
    """Records from tuples ``(id, first_op, last_op, size)``, dicts or records.

    Sizes are rounded up to ``alignment`` bytes (pass 1 to keep them exact); ids must
    be unique. The order of ``items`` is kept: it is the tie-break order of every
    strategy, as in TFLite.
    """
    check_alignment(alignment)
    out = []
    for position, item in enumerate(items):
        rec = _record_from(item, position)
        size = sizes.align_up(rec.size, alignment) if rec.size > 0 else rec.size
        if size > MAX_BYTES:
            raise PlanError(
                f"tensor usage record {rec.id}: size {rec.size} rounded up to {alignment} "
                f"bytes is {size}, beyond {MAX_BYTES} (2**63 - 1) bytes"
            )
        out.append(
            rec if size == rec.size else TensorUsageRecord(rec.id, rec.first_op, rec.last_op, size)
        )
    check_records(out)
    return out


def load_records(path: str | Path, alignment: int = DEFAULT_ALIGNMENT) -> list[TensorUsageRecord]:
    """Records from a JSON file holding a list of ``{"id", "first_op", "last_op", "size"}``."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise PlanError(f"records file {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise PlanError(
            f"records file {str(path)!r} is a directory; give a JSON file of "
            '{"id", "first_op", "last_op", "size"} records'
        ) from None
    except RecursionError:
        raise PlanError(
            f"cannot read records file {str(path)!r} as JSON: it is nested too deeply"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"cannot read records file {str(path)!r} as JSON: {exc}") from None
    if isinstance(data, Mapping) and "records" in data:
        data = data["records"]
    if not isinstance(data, list):
        raise PlanError(
            f"records file {str(path)!r} must hold a JSON list of "
            '{"id", "first_op", "last_op", "size"} objects'
        )
    return make_records(data, alignment)


def mirror(records: Sequence[TensorUsageRecord]) -> list[TensorUsageRecord]:
    """The same records with time reversed (op ``t`` becomes ``T - t``).

    Reversal maps a legal plan to a legal plan with the same size, so running a
    heuristic on the mirrored records is a cheap second opinion (used by ``best``).
    """
    horizon = max((r.last_op for r in records), default=0)
    return [
        TensorUsageRecord(r.id, horizon - r.last_op, horizon - r.first_op, r.size) for r in records
    ]
