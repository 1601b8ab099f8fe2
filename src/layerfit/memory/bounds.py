"""Theoretical lower bounds of Pisarchyk & Lee (sections 4.1 and 5.1).

* Shared objects: the sum of positional maxima. In any plan the ``k`` largest tensors
  of a profile sit in ``k`` distinct objects, so at least ``k`` objects are as large as
  the ``k``-th positional maximum; summing over ``k`` bounds the total.
* Offsets: the largest operator breadth — everything in one profile is live at once.

Neither bound is always achievable; the exact solver (``cpsat``) tells how far off it is.
"""

from __future__ import annotations

from collections.abc import Sequence

from layerfit.memory.profiles import max_breadth, positional_maximums
from layerfit.memory.records import TensorUsageRecord
from layerfit.memory.registry import check_approach


def objects_lower_bound(records: Sequence[TensorUsageRecord]) -> int:
    """Sum of positional maxima: no shared-objects plan can be smaller."""
    return sum(positional_maximums(records))


def offsets_lower_bound(records: Sequence[TensorUsageRecord]) -> int:
    """Maximum operator breadth: no offsets plan can be smaller."""
    return max_breadth(records)


def lower_bound(records: Sequence[TensorUsageRecord], approach: str) -> int:
    """The lower bound of ``approach`` (``objects`` or ``offsets``)."""
    check_approach(approach)
    return objects_lower_bound(records) if approach == "objects" else offsets_lower_bound(records)


def naive_total(records: Sequence[TensorUsageRecord]) -> int:
    """Bytes needed without any sharing: the sum of all tensor sizes."""
    return sum(r.size for r in records)
