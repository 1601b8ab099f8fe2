"""Offsets, greedy in order: a best-fit runtime allocator replayed ahead of time.

Algorithm:
  1. Visit tensors in execution order (by ``first_op``, ties in record order), as an
     allocator sees ``malloc`` calls during inference.
  2. Place each with the smallest-gap rule of Algorithm 3 among the tensors still live
     (see ``placement.py``): best fit into a free hole, else on top.

It is the baseline that knows no future: what a good dynamic allocator achieves, and
the reference the size- and breadth-ordered strategies improve on.
"""

from __future__ import annotations

from collections.abc import Sequence

from layerfit.memory.placement import GapPlacer
from layerfit.memory.plans import OffsetsPlan
from layerfit.memory.records import TensorUsageRecord
from layerfit.memory.registry import register


@register(
    "offsets", "greedy_in_order", "best-fit allocation in execution order (an online allocator)"
)
def greedy_in_order_offsets(records: Sequence[TensorUsageRecord]) -> OffsetsPlan:
    placer = GapPlacer()
    for i in sorted(range(len(records)), key=lambda i: (records[i].first_op, i)):
        placer.place(records[i])
    return OffsetsPlan(placer.arena_size, placer.offsets)
