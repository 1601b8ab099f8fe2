"""Offsets, greedy by breadth: Pisarchyk & Lee section 5.3.

Algorithm:
  1. Compute every operator profile and its breadth.
  2. Visit operators in non-increasing order of breadth (ties: lower operator first).
  3. Within an operator visit its not-yet-placed tensors, largest first.
  4. Place each with the smallest-gap rule of Algorithm 3 (see ``placement.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from layerfit.memory.placement import GapPlacer
from layerfit.memory.plans import OffsetsPlan
from layerfit.memory.profiles import operator_profiles
from layerfit.memory.records import TensorUsageRecord
from layerfit.memory.registry import register


@register(
    "offsets",
    "greedy_by_breadth",
    "Pisarchyk & Lee 5.3: operators by breadth, smallest fitting gap",
)
def greedy_by_breadth_offsets(records: Sequence[TensorUsageRecord]) -> OffsetsPlan:
    placer = GapPlacer()
    placed = [False] * len(records)
    for profile in sorted(operator_profiles(records), key=lambda p: (-p.breadth, p.op)):
        for i in profile.members:
            if not placed[i]:
                placed[i] = True
                placer.place(records[i])
    return OffsetsPlan(placer.arena_size, placer.offsets)
