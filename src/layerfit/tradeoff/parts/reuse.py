"""Algorithm 1 (Minakova & Stefanov, Section 5): buffer reuse across and within CNNs.

The greedy algorithm visits every edge of every partition and gives it a buffer:

1. An existing buffer ``B_k`` *suits* edge ``e`` unless some edge ``z`` already in
   ``B_k`` is used at the same time as ``e``: ``z`` belongs to another partition that runs
   in parallel with ``e``'s (both in one set ``J_r``; pipelined partitions never share),
   or ``z`` belongs to the same partition and its live interval of schedule steps
   ``[first write, last read]`` intersects ``e``'s. Edges of partitions that never run
   concurrently (e.g. different CNNs executed one after another) always suit.
2. No suitable buffer: ``e`` gets a new buffer of its own size (lines 21-25).
3. Otherwise ``e`` joins the suitable buffer whose growth ``max(|e| - |B_k|, 0)`` is
   smallest, and the buffer grows by that much (lines 27-35). The paper keeps the first
   buffer found among equal costs.

The paper visits edges in partition and layer order (``order="paper"``). Visiting the
largest edges first and breaking ties by the smallest buffer (``order="size"``) is
Pisarchyk & Lee's greedy-by-size for shared objects, extended with the same
parallelism rule; ``order="best"`` runs both and keeps the smaller total.
``order="planner"`` also tries every heuristic shared-objects strategy of the
per-network memory planner (:mod:`layerfit.memory`) when no partitions run in parallel,
so buffer reuse is never worse than that planner (slower: used for final results, while
the genetic search uses ``best``).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

ReuseOrder = Literal["paper", "size", "best", "planner"]


class ReuseEdge(Protocol):
    """What Algorithm 1 needs to know about an edge."""

    @property
    def partition(self) -> str: ...

    @property
    def elems(self) -> int: ...

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...


@dataclass
class SharedBuffer:
    """A buffer shared by edges never used at the same time; ``size`` in elements (Eq. 4)."""

    edges: list = field(default_factory=list)
    size: int = 0


class _Index:
    """Per buffer: its partitions, and per partition its (disjoint) live intervals sorted
    by start, so "does this buffer suit edge e" costs a set test and a bisection."""

    def __init__(self) -> None:
        self.partitions: set[str] = set()
        self.starts: dict[str, list[int]] = {}
        self.ends: dict[str, list[int]] = {}

    def add(self, edge: ReuseEdge) -> None:
        self.partitions.add(edge.partition)
        starts = self.starts.setdefault(edge.partition, [])
        ends = self.ends.setdefault(edge.partition, [])
        k = bisect.bisect_right(starts, edge.start)
        starts.insert(k, edge.start)
        ends.insert(k, edge.end)

    def suits(self, edge: ReuseEdge, parallel_to: frozenset[str]) -> bool:
        if parallel_to and not parallel_to.isdisjoint(self.partitions):
            return False
        starts = self.starts.get(edge.partition)
        if not starts:
            return True
        k = bisect.bisect_right(starts, edge.end) - 1
        return k < 0 or self.ends[edge.partition][k] < edge.start


def algorithm1(
    edges: Sequence[ReuseEdge], parallel: Callable[[str, str], bool], smallest_on_tie: bool = False
) -> list[SharedBuffer]:
    """Algorithm 1 visiting ``edges`` in the given order."""
    partitions = sorted({e.partition for e in edges})
    parallel_to = {p: frozenset(q for q in partitions if parallel(p, q)) for p in partitions}
    buffers: list[SharedBuffer] = []
    indexes: list[_Index] = []
    for edge in edges:
        best = -1
        best_cost = 0
        conflicts = parallel_to[edge.partition]
        for k, buffer in enumerate(buffers):
            cost = edge.elems - buffer.size
            if cost < 0:
                cost = 0
            if best >= 0 and cost > best_cost:
                continue  # cannot beat the best found: skip the suitability test
            if best >= 0 and cost == best_cost and not (smallest_on_tie and buffer.size < buffers[best].size):
                continue
            if indexes[k].suits(edge, conflicts):
                best, best_cost = k, cost
        if best < 0:
            buffers.append(SharedBuffer([edge], edge.elems))
            indexes.append(_Index())
            indexes[-1].add(edge)
        else:
            buffers[best].edges.append(edge)
            buffers[best].size += best_cost
            indexes[best].add(edge)
    return buffers


def planner_buffers(edges: Sequence[ReuseEdge], strategy: str = "greedy_by_size_improved") -> list[SharedBuffer]:
    """Shared objects from the per-network memory planner (Pisarchyk & Lee).

    Valid only when no two partitions run in parallel: the partitions' schedules are then
    laid end to end on one timeline (they never run at the same time), so interval
    overlap is exactly the conflict relation.
    """
    from layerfit.memory import make_records, plan_objects

    offset: dict[str, int] = {}
    for e in edges:
        offset.setdefault(e.partition, 0)
    base = 0
    for p in offset:
        offset[p] = base
        base += 1 + max(e.end for e in edges if e.partition == p)
    records = make_records(
        [(k, e.start + offset[e.partition], e.end + offset[e.partition], e.elems) for k, e in enumerate(edges)],
        alignment=1,
    )
    plan = plan_objects(records, strategy)
    buffers = [SharedBuffer([], size) for size in plan.object_sizes]
    for k, e in enumerate(edges):
        buffers[plan.object_ids[k]].edges.append(e)
    return buffers


def reuse_buffers(
    edges: Sequence[ReuseEdge], parallel: Callable[[str, str], bool], order: ReuseOrder = "best"
) -> list[SharedBuffer]:
    """Shared buffers for ``edges`` under Algorithm 1 (see the module docstring for orders)."""
    if order == "paper":
        return algorithm1(edges, parallel)
    by_size = sorted(edges, key=lambda e: -e.elems)
    if order == "size":
        return algorithm1(by_size, parallel, smallest_on_tie=True)
    candidates = [algorithm1(edges, parallel), algorithm1(by_size, parallel, smallest_on_tie=True)]
    partitions = {e.partition for e in edges}
    if order == "planner" and edges and not any(parallel(a, b) for a in partitions for b in partitions):
        from layerfit.memory.registry import strategy_names

        for strategy in strategy_names("objects", heuristic_only=True):
            if strategy != "naive":
                candidates.append(planner_buffers(edges, strategy))
    return min(candidates, key=total_elems)


def naive_buffers(edges: Sequence[ReuseEdge]) -> list[SharedBuffer]:
    """The naive allocation: every edge has a buffer of its own (Table 1)."""
    return [SharedBuffer([e], e.elems) for e in edges]


def total_elems(buffers: Sequence[SharedBuffer]) -> int:
    """``sum(B_k.size)`` over the buffers, in elements."""
    return sum(b.size for b in buffers)


def check_buffers(buffers: Sequence[SharedBuffer], parallel: Callable[[str, str], bool]) -> None:
    """Raise AssertionError if two edges sharing a buffer may be used at the same time."""
    for buffer in buffers:
        for i, a in enumerate(buffer.edges):
            if a.elems > buffer.size:
                raise AssertionError(f"edge {a} larger than its buffer ({buffer.size})")
            for b in buffer.edges[i + 1 :]:
                if a.partition != b.partition:
                    if parallel(a.partition, b.partition):
                        raise AssertionError(f"edges {a} and {b} of parallel partitions share a buffer")
                elif a.start <= b.end and b.start <= a.end:
                    raise AssertionError(f"edges {a} and {b} are live together but share a buffer")
