"""Shared objects, greedy by size: Pisarchyk & Lee, Algorithm 2.

Algorithm:
  1. Visit tensors in non-increasing order of size (ties in record order).
  2. An object is *suitable* for tensor ``t`` when no tensor already in it has a usage
     interval intersecting ``t``'s.
  3. Assign ``t`` to the smallest suitable object (ties: lower object id). Larger
     tensors come first, so an object never has to grow.
  4. If no object is suitable, create a new object of ``size(t)``.
"""

from __future__ import annotations

from collections.abc import Sequence

from layerfit.memory.plans import SharedObjectsPlan
from layerfit.memory.records import TensorUsageRecord
from layerfit.memory.registry import register


@register(
    "objects",
    "greedy_by_size",
    "Pisarchyk & Lee Alg. 2: largest tensors first into the smallest suitable object",
)
def greedy_by_size_objects(records: Sequence[TensorUsageRecord]) -> SharedObjectsPlan:
    sizes: list[int] = []
    members: list[list[TensorUsageRecord]] = []
    object_of: dict[int, int] = {}
    for i in sorted(range(len(records)), key=lambda i: (-records[i].size, i)):
        rec = records[i]
        best = -1
        for obj, size in enumerate(sizes):
            if (best < 0 or size < sizes[best]) and all(
                not rec.intersects(o) for o in members[obj]
            ):
                best = obj
        if best < 0:
            best = len(sizes)
            sizes.append(rec.size)
            members.append([])
        members[best].append(rec)
        object_of[rec.id] = best
    return SharedObjectsPlan(tuple(sizes), object_of)
