"""Offsets, strip packing best-fit: Sekiyama et al. 2018 (the paper's Table 2 baseline).

Offset calculation is 2D strip packing with every rectangle's time coordinates fixed;
the best-fit heuristic (Burke et al. 2004) fills the lowest free spot first. The packed
area is described by its *skyline*: for every operator, the top of the memory in use.

Algorithm:
  1. The skyline starts as one segment covering all operators at height 0.
  2. Take the lowest skyline segment (a maximal run of operators at one height; ties:
     the leftmost).
  3. Candidates are the unplaced tensors whose usage interval lies inside the segment.
     Pick the best fit: the longest usage interval (it fills the segment best), then the
     largest size, then record order (``priority="lifetime"``); ``priority="size"``
     swaps the first two keys.
  4. Place it at the segment's height and raise the skyline over its interval.
  5. If nothing fits, lift the segment to its lower neighbour and merge them (the space
     below is wasted).
  6. Repeat until every tensor is placed; the arena is the highest point reached.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from layerfit.errors import PlanError
from layerfit.memory.plans import OffsetsPlan
from layerfit.memory.records import TensorUsageRecord
from layerfit.memory.registry import register

PRIORITIES = ("lifetime", "size")


@register(
    "offsets",
    "strip_packing",
    "Sekiyama et al. 2018 best-fit strip packing on the skyline",
    options=("priority",),
)
def strip_packing_offsets(
    records: Sequence[TensorUsageRecord], priority: str = "lifetime"
) -> OffsetsPlan:
    if priority not in PRIORITIES:
        raise PlanError(
            f"unknown strip packing priority {priority!r}; choose one of: {', '.join(PRIORITIES)}"
        )
    if not records:
        return OffsetsPlan(0, {})

    def fit_key(i: int) -> tuple[int, int, int]:
        r = records[i]
        life = r.last_op - r.first_op
        return (-life, -r.size, i) if priority == "lifetime" else (-r.size, -life, i)

    # skyline: parallel lists of segment starts, ends (inclusive) and heights
    starts = [min(r.first_op for r in records)]
    ends = [max(r.last_op for r in records)]
    heights = [0]
    unplaced = sorted((r.first_op, i) for i, r in enumerate(records))
    offsets: dict[int, int] = {}
    arena = 0
    while unplaced:
        seg = min(range(len(heights)), key=lambda s: (heights[s], s))
        lo = bisect.bisect_left(unplaced, (starts[seg], -1))
        hi = bisect.bisect_right(unplaced, (ends[seg], len(records)))
        fits = [i for _, i in unplaced[lo:hi] if records[i].last_op <= ends[seg]]
        if fits:
            i = min(fits, key=fit_key)
            rec = records[i]
            height = heights[seg]
            offsets[rec.id] = height
            arena = max(arena, height + rec.size)
            unplaced.remove((rec.first_op, i))
            pieces = []
            if rec.first_op > starts[seg]:
                pieces.append((starts[seg], rec.first_op - 1, height))
            pieces.append((rec.first_op, rec.last_op, height + rec.size))
            if rec.last_op < ends[seg]:
                pieces.append((rec.last_op + 1, ends[seg], height))
            starts[seg : seg + 1] = [p[0] for p in pieces]
            ends[seg : seg + 1] = [p[1] for p in pieces]
            heights[seg : seg + 1] = [p[2] for p in pieces]
        else:
            neighbours = [heights[s] for s in (seg - 1, seg + 1) if 0 <= s < len(heights)]
            heights[seg] = min(neighbours)
        _merge(starts, ends, heights)
    return OffsetsPlan(arena, offsets)


def _merge(starts: list[int], ends: list[int], heights: list[int]) -> None:
    """Join neighbouring skyline segments of equal height."""
    s = 1
    while s < len(heights):
        if heights[s] == heights[s - 1]:
            ends[s - 1] = ends[s]
            del starts[s], ends[s], heights[s]
        else:
            s += 1
