"""Offsets, greedy by size: Pisarchyk & Lee, Algorithm 3 (TFLite ``GreedyBySizeAssignment``).

Algorithm:
  1. Visit tensors in non-increasing order of size (ties in record order).
  2. Among the already placed tensors whose usage intervals intersect the current one,
     find the smallest gap in memory between them that the tensor fits in.
  3. If there is one, place the tensor at the start of that gap; otherwise place it
     right after the rightmost intersecting tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

from layerfit.memory.placement import GapPlacer
from layerfit.memory.plans import OffsetsPlan
from layerfit.memory.records import TensorUsageRecord
from layerfit.memory.registry import register


@register(
    "offsets",
    "greedy_by_size",
    "Pisarchyk & Lee Alg. 3: largest first into the smallest fitting gap",
)
def greedy_by_size_offsets(records: Sequence[TensorUsageRecord]) -> OffsetsPlan:
    placer = GapPlacer()
    for i in sorted(range(len(records)), key=lambda i: (-records[i].size, i)):
        placer.place(records[i])
    return OffsetsPlan(placer.arena_size, placer.offsets)
