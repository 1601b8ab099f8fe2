"""Shared objects, greedy in order: TFLite GPU's ``GreedyInOrderAssignment`` (Lee et al. 2019).

Algorithm — tensors are visited in execution order (by ``first_op``, ties in record
order), like a runtime allocator with a pool of free objects:
  1. Before tensor ``i`` starts, every object whose last tensor ended before
     ``first_op(i)`` goes back to the pool of free objects.
  2. If the pool is empty, create a new object of ``size(i)`` for tensor ``i``.
  3. Otherwise take the free object that wastes least: the smallest one not smaller
     than ``size(i)``, or the largest one smaller than ``size(i)`` if that is closer in
     size (ties go to the not-smaller object, then to the lower object id); the object
     grows to ``size(i)`` if needed.
  4. The object is in use until ``last_op(i)``.

This is the paper's "Greedy (Lee et al. 2019)" baseline of Table 1.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence

from layerfit.memory.plans import SharedObjectsPlan
from layerfit.memory.records import TensorUsageRecord
from layerfit.memory.registry import register


@register(
    "objects",
    "greedy_in_order",
    "TFLite greedy: reuse the closest-sized free object in execution order",
)
def greedy_in_order_objects(records: Sequence[TensorUsageRecord]) -> SharedObjectsPlan:
    sizes: list[int] = []
    object_of: dict[int, int] = {}
    pool: list[tuple[int, int]] = []  # sorted (object size, object id) of free objects
    in_use: list[tuple[int, int]] = []  # heap of (last_op, object id)
    for i in sorted(range(len(records)), key=lambda i: (records[i].first_op, i)):
        rec = records[i]
        while in_use and in_use[0][0] < rec.first_op:
            obj = heapq.heappop(in_use)[1]
            bisect.insort(pool, (sizes[obj], obj))
        if not pool:
            obj = len(sizes)
            sizes.append(rec.size)
        else:
            pos = bisect.bisect_left(pool, (rec.size, 0))
            best = None
            diff = 0
            if pos < len(pool):  # smallest free object with size >= tensor size
                best, diff = pos, pool[pos][0] - rec.size
            if pos > 0 and (best is None or rec.size - pool[pos - 1][0] < diff):
                best = pos - 1  # largest free object smaller than the tensor
            obj = pool.pop(best)[1]
            sizes[obj] = max(sizes[obj], rec.size)
        object_of[rec.id] = obj
        heapq.heappush(in_use, (rec.last_op, obj))
    return SharedObjectsPlan(tuple(sizes), object_of)
