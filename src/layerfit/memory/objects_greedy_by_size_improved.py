"""Shared objects, greedy by size improved: Pisarchyk & Lee section 4.4 (TFLite
``GreedyBySizeDistPriorityAssignment``, TFLite's GREEDY_BY_SIZE for objects).

Algorithm:
  1. Compute the positional maximums (the lower bounds of the object sizes).
  2. Give each tensor a *position*: the index of the rightmost positional maximum that
     is ≥ its size. Tensors of one position form a stage of "almost equal" tensors.
  3. The *distance* between two usage intervals that do not intersect is the gap
     between their closest operators (positive); intersecting intervals have none.
     For every unassigned tensor and every object keep the smallest distance to a
     tensor of that object (none if some tensor of the object intersects it), and the
     object achieving the best one.
  4. Repeat until all tensors are assigned: pick the unassigned tensor with the highest
     priority — lowest position, then smallest best distance, then largest size, then
     record order — and
       - assign it to its best-distance object, growing that object if needed; or
       - if it has no suitable object, create a new object of its size.
  5. Update the distances of the unassigned tensors to the object just used.

The smallest positive gap pairs a tensor with the object that would otherwise sit idle
for the shortest time, which is the paper's "smallest-gap pairing" inside a stage.

The distance table is a NumPy array (tensors × objects) updated a column at a time;
ties resolve exactly as in TFLite's loop (a best object changes only on a strictly
smaller distance, and a recomputation takes the lowest object id).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from layerfit.memory.plans import SharedObjectsPlan
from layerfit.memory.profiles import positional_maximums
from layerfit.memory.records import TensorUsageRecord
from layerfit.memory.registry import register

_NONE = np.inf  # "no distance": the object cannot take the tensor


@register(
    "objects",
    "greedy_by_size_improved",
    "Pisarchyk & Lee 4.4: stages by positional maximum, smallest-gap pairing",
)
def greedy_by_size_improved_objects(records: Sequence[TensorUsageRecord]) -> SharedObjectsPlan:
    n = len(records)
    if n == 0:
        return SharedObjectsPlan((), {})
    pmax = positional_maximums(records)
    size = np.array([r.size for r in records], dtype=np.int64)
    first = np.array([r.first_op for r in records], dtype=np.float64)
    last = np.array([r.last_op for r in records], dtype=np.float64)
    # position: index of the rightmost positional maximum >= size (pmax is non-increasing)
    desc = -np.asarray(pmax, dtype=np.int64)
    position = np.maximum(np.searchsorted(desc, -size, side="right") - 1, 0)
    dist = np.full((n, 8), _NONE)  # grows by doubling; column k is object k
    best_dist = np.full(n, _NONE)
    best_obj = np.full(n, -1, dtype=np.int64)
    unassigned = np.ones(n, dtype=bool)
    sizes: list[int] = []
    assigned = np.full(n, -1, dtype=np.int64)
    for _ in range(n):
        # highest priority: lowest position, smallest best distance, largest size, first record
        cand = np.flatnonzero(unassigned)
        cand = cand[position[cand] == position[cand].min()]
        cand = cand[best_dist[cand] == best_dist[cand].min()]
        cand = cand[size[cand] == size[cand].max()]
        pick = int(cand[0])
        unassigned[pick] = False
        new_object = best_dist[pick] == _NONE
        if new_object:
            obj = len(sizes)
            sizes.append(int(size[pick]))
            if obj == dist.shape[1]:
                dist = np.concatenate([dist, np.full_like(dist, _NONE)], axis=1)
        else:
            obj = int(best_obj[pick])
            sizes[obj] = max(sizes[obj], int(size[pick]))
        assigned[pick] = obj
        # distance of every tensor's interval to the picked one (inf when they intersect)
        d = np.where(
            last < first[pick],
            first[pick] - last,
            np.where(last[pick] < first, first - last[pick], _NONE),
        )
        if new_object:
            rows = np.flatnonzero(unassigned)
            dist[rows, obj] = d[rows]
        else:
            rows = np.flatnonzero(unassigned & (dist[:, obj] != _NONE))
            blocked = rows[d[rows] == _NONE]
            dist[blocked, obj] = _NONE
            lost = blocked[best_obj[blocked] == obj]  # their best object just became unsuitable
            if len(lost):
                table = dist[lost, : len(sizes)]
                best_obj[lost] = np.argmin(table, axis=1)
                best_dist[lost] = table.min(axis=1)
            open_rows = rows[d[rows] != _NONE]
            dist[open_rows, obj] = np.minimum(dist[open_rows, obj], d[open_rows])
        better = rows[d[rows] < best_dist[rows]]
        best_dist[better] = d[better]
        best_obj[better] = obj
    return SharedObjectsPlan(
        tuple(sizes), {r.id: int(o) for r, o in zip(records, assigned, strict=True)}
    )
