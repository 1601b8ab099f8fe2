"""The two kinds of memory plan of Pisarchyk & Lee.

* :class:`SharedObjectsPlan` — each tensor lives in one *shared object* (a buffer,
  or a GPU texture); an object is as large as the largest tensor assigned to it, and
  the plan costs the sum of object sizes.
* :class:`OffsetsPlan` — every tensor gets an offset inside one arena; the plan costs
  the arena size.

Both carry how they were made: the strategy name, a ``status`` (``heuristic``, or for
the exact solver ``optimal`` / ``feasible``), the best proven ``lower_bound`` when one is
known, and the planning time in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

HEURISTIC = "heuristic"
OPTIMAL = "optimal"
FEASIBLE = "feasible"


class _Provenance:
    """What both kinds of plan say about how they were made, and how good they are."""

    approach: str
    strategy: str
    status: str
    lower_bound: int | None
    seconds: float
    note: str

    @property
    def total(self) -> int:
        raise NotImplementedError

    @property
    def gap(self) -> float | None:
        """Relative distance to the proven lower bound (0 when optimal), if known."""
        return _gap(self.total, self.lower_bound)

    def _described(self) -> dict[str, Any]:
        return {
            "approach": self.approach,
            "strategy": self.strategy,
            "total": self.total,
            "status": self.status,
            "lower_bound": self.lower_bound,
            "seconds": self.seconds,
            "note": self.note,
        }


@dataclass(frozen=True)
class SharedObjectsPlan(_Provenance):
    """Tensor id → shared object index, and the size of every object."""

    object_sizes: tuple[int, ...]
    object_ids: dict[int, int]
    strategy: str = ""
    status: str = HEURISTIC
    lower_bound: int | None = None
    seconds: float = 0.0
    note: str = field(default="", compare=False)

    approach = "objects"

    @property
    def total(self) -> int:
        """Bytes the plan needs: the sum of all shared object sizes."""
        return sum(self.object_sizes)

    def to_offsets(self, strategy: str | None = None) -> OffsetsPlan:
        """Lay the shared objects end to end in one arena (TFLite's ``ObjectsToOffsets``)."""
        starts = []
        total = 0
        for size in self.object_sizes:
            starts.append(total)
            total += size
        return OffsetsPlan(
            arena_size=total,
            offsets={tid: starts[obj] for tid, obj in self.object_ids.items()},
            strategy=strategy if strategy is not None else f"objects:{self.strategy}",
            status=HEURISTIC,
            seconds=self.seconds,
            note=self.note,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            **self._described(),
            "object_sizes": list(self.object_sizes),
            "assignment": {str(t): o for t, o in sorted(self.object_ids.items())},
        }


@dataclass(frozen=True)
class OffsetsPlan(_Provenance):
    """Tensor id → byte offset inside one arena of ``arena_size`` bytes."""

    arena_size: int
    offsets: dict[int, int]
    strategy: str = ""
    status: str = HEURISTIC
    lower_bound: int | None = None
    seconds: float = 0.0
    note: str = field(default="", compare=False)

    approach = "offsets"

    @property
    def total(self) -> int:
        """Bytes the plan needs: the arena size."""
        return self.arena_size

    def to_dict(self) -> dict[str, Any]:
        return {
            **self._described(),
            "assignment": {str(t): o for t, o in sorted(self.offsets.items())},
        }


Plan = SharedObjectsPlan | OffsetsPlan


def _gap(total: int, bound: int | None) -> float | None:
    if bound is None:
        return None
    if total == 0:
        return 0.0
    return max(0.0, (total - bound) / total)
