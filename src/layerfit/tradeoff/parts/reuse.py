"""Algorithm 1 (Minakova & Stefanov, Section 5): buffer reuse across and within CNNs.

Buffer reuse is a shared-objects assignment: the memory planner computes it
(:mod:`layerfit.memory.objects_grouped`, one group of tensors per partition). The
greedy algorithm visits every edge of every partition and gives it a buffer:

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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from layerfit.memory.objects_grouped import grouped_objects
from layerfit.memory.plans import SharedObjectsPlan

if TYPE_CHECKING:  # Algorithm 1 reads an edge's partition, live steps start..end and elems
    from layerfit.tradeoff.parts.application import AppEdge

ReuseOrder = Literal["paper", "size", "best", "planner"]


@dataclass
class SharedBuffer:
    """A buffer shared by edges never used at the same time; ``size`` in elements (Eq. 4)."""

    edges: list[AppEdge] = field(default_factory=list)
    size: int = 0


def algorithm1(
    edges: Sequence[AppEdge], parallel: Callable[[str, str], bool], smallest_on_tie: bool = False
) -> list[SharedBuffer]:
    """Algorithm 1 visiting ``edges`` in the given order: the memory planner's shared
    objects over groups (:func:`~layerfit.memory.objects_grouped.grouped_objects`), a
    group per partition."""
    tensors = [(e.partition, e.start, e.end, e.elems) for e in edges]
    return _buffers(edges, grouped_objects(tensors, parallel, smallest_on_tie))


def planner_buffers(edges: Sequence[AppEdge], strategy: str = "greedy_by_size_improved") -> list[SharedBuffer]:
    """Shared objects from the per-network memory planner (Pisarchyk & Lee).

    Valid only when no two partitions run in parallel: the partitions' schedules are then
    laid end to end on one timeline (they never run at the same time), so interval
    overlap is exactly the conflict relation.
    """
    from layerfit.memory import make_records, plan_objects

    offset: dict[str, int] = {}
    for e in edges:  # each partition starts after the previous one's last step
        if e.partition not in offset:
            offset[e.partition] = sum(1 + max(f.end for f in edges if f.partition == p) for p in offset)
    records = [(k, e.start + offset[e.partition], e.end + offset[e.partition], e.elems) for k, e in enumerate(edges)]
    return _buffers(edges, plan_objects(make_records(records, alignment=1), strategy))


def _buffers(edges: Sequence[AppEdge], plan: SharedObjectsPlan) -> list[SharedBuffer]:
    """The plan's objects as buffers holding ``edges`` (by position), in visiting order."""
    buffers = [SharedBuffer([], size) for size in plan.object_sizes]
    for k, e in enumerate(edges):
        buffers[plan.object_ids[k]].edges.append(e)
    return buffers


def reuse_buffers(
    edges: Sequence[AppEdge], parallel: Callable[[str, str], bool], order: ReuseOrder = "best"
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


def naive_buffers(edges: Sequence[AppEdge]) -> list[SharedBuffer]:
    """The naive allocation: every edge has a buffer of its own (Table 1)."""
    return [SharedBuffer([e], e.elems) for e in edges]


def total_elems(buffers: Sequence[SharedBuffer]) -> int:
    """``sum(B_k.size)`` over the buffers, in elements."""
    return sum(b.size for b in buffers)
