"""Shared objects for tensors of several groups: Minakova & Stefanov's buffer reuse (Algorithm 1).

A tensor is ``(group, first_op, last_op, size)``: it belongs to a group (a partition of
a CNN-based application) whose operators are counted on the group's own timeline. Two
tensors may share an object unless they are of one group and their usage intervals
intersect, or their groups run in parallel (``parallel(a, b)``: pipeline stages, CNNs on
different processors). Groups that never run at the same time (CNNs run one after
another) share freely: a relation no single timeline of usage records expresses when
some groups run in parallel, which is why this strategy takes groups and is not
registered behind the one-timeline signature.

Greedy, visiting tensors in the given order:

1. An object *suits* tensor ``t`` unless a tensor in it conflicts with ``t`` (above).
2. No object suits: ``t`` gets a new object of its own size.
3. Otherwise ``t`` joins the suitable object whose growth ``max(size(t) - size, 0)`` is
   smallest, and the object grows by that much; among equal growths the first object
   found (the paper's rule), or with ``smallest_on_tie`` the smallest.

Visiting the largest tensors first with ``smallest_on_tie`` never grows an object: it is
greedy by size (:mod:`.objects_greedy_by_size`) under the groups' rule.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

from layerfit.memory.plans import SharedObjectsPlan

GroupedUsage = tuple[str, int, int, int]  # (group, first_op, last_op, size)


class _Index:
    """Per object: its groups, and per group its (disjoint) usage intervals sorted by
    start, so "does this object suit tensor t" costs a set test and a bisection."""

    def __init__(self) -> None:
        self.groups: set[str] = set()
        self.starts: dict[str, list[int]] = {}
        self.ends: dict[str, list[int]] = {}

    def add(self, group: str, first: int, last: int) -> None:
        self.groups.add(group)
        starts = self.starts.setdefault(group, [])
        k = bisect.bisect_right(starts, first)
        starts.insert(k, first)
        self.ends.setdefault(group, []).insert(k, last)

    def suits(self, group: str, first: int, last: int, parallel_to: frozenset[str]) -> bool:
        if parallel_to and not parallel_to.isdisjoint(self.groups):
            return False
        starts = self.starts.get(group)
        if not starts:
            return True
        k = bisect.bisect_right(starts, last) - 1
        return k < 0 or self.ends[group][k] < first


def grouped_objects(
    tensors: Sequence[GroupedUsage], parallel: Callable[[str, str], bool], smallest_on_tie: bool = False
) -> SharedObjectsPlan:
    """Shared objects for ``tensors`` visited in order; object ids by tensor position."""
    groups = sorted({t[0] for t in tensors})
    parallel_to = {g: frozenset(h for h in groups if parallel(g, h)) for g in groups}
    sizes: list[int] = []
    indexes: list[_Index] = []
    object_of: dict[int, int] = {}
    for position, (group, first, last, size) in enumerate(tensors):
        best = -1
        best_cost = 0
        conflicts = parallel_to[group]
        for k, current in enumerate(sizes):
            cost = size - current
            if cost < 0:
                cost = 0
            if best >= 0 and cost > best_cost:
                continue  # cannot beat the best found: skip the suitability test
            if best >= 0 and cost == best_cost and not (smallest_on_tie and current < sizes[best]):
                continue
            if indexes[k].suits(group, first, last, conflicts):
                best, best_cost = k, cost
        if best < 0:
            best = len(sizes)
            sizes.append(size)
            indexes.append(_Index())
        else:
            sizes[best] += best_cost
        indexes[best].add(group, first, last)
        object_of[position] = best
    return SharedObjectsPlan(tuple(sizes), object_of, strategy="grouped")
