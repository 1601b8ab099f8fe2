"""Parse and format byte quantities such as ``24MB``, ``1.5GiB`` or ``512KiB``.

Decimal units (kB, MB, GB) are powers of 1000 and binary units (KiB, MiB, GiB) powers of
1024, so a budget means exactly what its unit says. Parsing is strict: anything else is
a :class:`~layerfit.errors.BudgetError` naming the accepted forms.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

from layerfit.errors import BudgetError

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
# ASCII digits only: "١٢MB" (Arabic-Indic digits) is not read as 12 MB
_PATTERN = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$", re.ASCII)
MAX_BYTES = 2**63 - 1  # larger than any memory or file: a typo, refused


def parse_bytes(text: str | int) -> int:
    """Return the number of bytes ``text`` denotes; raise BudgetError on nonsense."""
    if isinstance(text, bool):
        raise BudgetError(f"not a byte quantity: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise BudgetError(f"a byte quantity cannot be negative: {text}")
        if text > MAX_BYTES:
            raise BudgetError("a byte quantity larger than any machine's memory")
        return text
    match = _PATTERN.match(str(text))
    unit = match.group(2).lower() if match else None
    if match is None and is_share(text):
        raise BudgetError(
            f"{text.strip()} is a share of a model's weights, which only one model's weight budget "
            "takes (run, inspect, load): give a size here, e.g. 24MB, 1.5GiB"
        )
    if match is None or unit not in _UNITS:
        raise BudgetError(
            f"cannot read {text!r} as a size: write a number and a unit, e.g. 24MB, "
            "1.5GiB, 512KiB (units: B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)"
        )
    number = Decimal(match.group(1))
    if unit in ("", "b") and number != number.to_integral_value():
        raise BudgetError(f"a number of bytes must be whole: {text!r}")
    value = int((number * _UNITS[unit]).to_integral_value())
    if value > MAX_BYTES:
        raise BudgetError(f"{match.group(1)[:20]}... {unit or 'B'} is more bytes than any machine has")
    return value


_SHARE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*%\s*$", re.ASCII)


def is_share(text: object) -> bool:
    """Whether ``text`` is a share such as ``50%`` rather than a byte quantity."""
    return isinstance(text, str) and _SHARE.match(text) is not None


@dataclass(frozen=True)
class Budget:
    """One model's weight budget, read once at the boundary (command line, HTTP, Python
    API): a number of bytes, or a share of the model's weights (``percent``), which
    becomes bytes only once the model is known (:meth:`bytes_for`). Below the boundary
    code passes this value, never the text."""

    nbytes: int | None = None
    percent: Decimal | None = None

    def __post_init__(self) -> None:
        if (self.nbytes is None) == (self.percent is None):
            raise BudgetError("a budget is either a number of bytes or a share of the weights")

    @classmethod
    def parse(cls, value: str | int | Budget) -> Budget:
        """The budget ``value`` denotes: a :class:`Budget`, bytes, a size (``24MB``) or a
        share up to 100 % (``50%``, ``12.5%``; 100 % holds every weight, which is what
        ``preload`` holds, so more means nothing); raise BudgetError naming the accepted
        forms."""
        if isinstance(value, Budget):
            return value
        if isinstance(value, str) and (match := _SHARE.match(value)):
            share = Decimal(match.group(1))
            if share > 100:  # silently the same as 100% would hide a typo (150% for 15%)
                raise BudgetError(
                    f"{value.strip()} of the model's weights is more than all of them: 100% already keeps every "
                    "weight resident (preload); give a share up to 100%"
                )
            return cls(percent=share)
        try:
            return cls(nbytes=parse_bytes(value))
        except BudgetError as exc:
            if isinstance(value, str):
                raise BudgetError(f"{exc}; or a share of the model's weights, e.g. 50%") from None
            raise

    @property
    def is_share(self) -> bool:
        return self.percent is not None

    def bytes_for(self, weights_bytes: int) -> int:
        """The budget in bytes for a model of ``weights_bytes`` bytes of weights (a share
        is rounded down to a whole byte)."""
        if self.percent is None:
            return self.nbytes
        return int(self.percent * weights_bytes / 100)

    def __str__(self) -> str:
        return f"{self.percent}%" if self.percent is not None else str(self.nbytes)


def parse_budget(text: str | int | Budget, weights_bytes: int) -> int:
    """A model's weight budget in bytes: a byte quantity (:func:`parse_bytes`), or a share
    of its weights, ``weights_bytes`` (``50%``, ``12.5%``), rounded down to a whole byte,
    so that one can try a model at a fraction of its size without working out the bytes."""
    return Budget.parse(text).bytes_for(weights_bytes)


def align_up(size: int, alignment: int) -> int:
    """``size`` rounded up to a multiple of ``alignment`` (a positive number of bytes).

    The one rounding rule of the store's segment and tensor offsets and of the memory
    planner's tensor sizes; the planner checks a user's alignment first
    (:func:`layerfit.memory.records.check_alignment`).
    """
    return -(-size // alignment) * alignment


def format_bytes(n: int | float) -> str:
    """Human-readable size in decimal megabytes, the unit the papers report in."""
    n = float(n)
    if abs(n) >= 1000**3:
        return f"{n / 1000**3:.2f} GB"
    if abs(n) >= 1000**2:
        return f"{n / 1000**2:.1f} MB"
    if abs(n) >= 1000:
        return f"{n / 1000:.1f} kB"
    return f"{int(n)} B"


def format_bytes_exact(n: int) -> str:
    """:func:`format_bytes` with the exact count beside it where rounding hides it,
    ``412.3 MB (412300000 bytes)``: for a figure people type back, such as a minimum
    budget in an error (``--budget 412.3MB`` would be short of it)."""
    return format_bytes(n) if abs(n) < 1000 else f"{format_bytes(n)} ({int(n)} bytes)"
