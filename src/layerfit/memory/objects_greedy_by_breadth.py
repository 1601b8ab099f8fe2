"""Shared objects, greedy by breadth: Pisarchyk & Lee, Algorithm 1 (TFLite ``GreedyByBreadthAssignment``).

Algorithm:
  1. Compute every operator profile; an operator's breadth is the sum of its sizes.
  2. Visit operators in non-increasing order of breadth (ties: lower operator first).
  3. Within an operator visit its not-yet-assigned tensors, largest first.
  4. An object is *suitable* for tensor ``t`` when no tensor already in it has a usage
     interval intersecting ``t``'s. Among suitable objects:
       - if some are not smaller than ``t``, assign the smallest of those;
       - else, if all are smaller, assign the largest and grow it to ``size(t)``;
       - if none is suitable, create a new object of ``size(t)``.
     Ties between equally sized objects go to the lower object id.
"""

from __future__ import annotations

from collections.abc import Sequence

from layerfit.memory.plans import SharedObjectsPlan
from layerfit.memory.profiles import operator_profiles
from layerfit.memory.records import TensorUsageRecord
from layerfit.memory.registry import register


def _fits_schedule(schedule: list[TensorUsageRecord], rec: TensorUsageRecord) -> bool:
    return all(not rec.intersects(other) for other in schedule)


@register(
    "objects",
    "greedy_by_breadth",
    "Pisarchyk & Lee Alg. 1: operators by breadth, largest tensors first",
)
def greedy_by_breadth_objects(records: Sequence[TensorUsageRecord]) -> SharedObjectsPlan:
    profiles = sorted(operator_profiles(records), key=lambda p: (-p.breadth, p.op))
    sizes: list[int] = []
    schedules: list[list[TensorUsageRecord]] = []
    assigned: list[int | None] = [None] * len(records)
    for profile in profiles:
        for i in profile.members:
            if assigned[i] is not None:
                continue
            rec = records[i]
            best = -1
            for obj in range(len(sizes)):
                if best >= 0:  # skip objects no better than the best found so far
                    best_size, cur_size = sizes[best], sizes[obj]
                    if best_size < rec.size:
                        if cur_size <= best_size:
                            continue
                    elif cur_size < rec.size or cur_size >= best_size:
                        continue
                if _fits_schedule(schedules[obj], rec):
                    best = obj
            if best < 0:
                best = len(sizes)
                sizes.append(rec.size)
                schedules.append([rec])
            else:
                schedules[best].append(rec)
                sizes[best] = max(sizes[best], rec.size)
            assigned[i] = best
    return SharedObjectsPlan(
        tuple(sizes), {records[i].id: obj for i, obj in enumerate(assigned) if obj is not None}
    )
