"""Tensor usage records from a captured :class:`~layerfit.capture.graph.ModelGraph`.

A captured graph lists every op's input and output tensors. Memory is planned per
*storage*, not per tensor, so two kinds of sharing are folded in before planning:

* **Views** (``TensorRecord.alias_of``): a reshape, a slice or an op that returns its
  input shares the input's storage. All tensors of one alias group are one buffer,
  live from the first op that uses any of them to the last.
* **In-place reuse** (``OpRecord.inplace``): an elementwise op (BatchNorm, ReLU, add…)
  may write its output over an input of the same size *if that input dies at this op*.
  The output then continues the input's buffer instead of needing a new one — what
  TFLite achieves by fusing activations into the convolution.

Algorithm:
  1. Fix an execution order (the captured one, or one from the operator-order search)
     and check it is topological.
  2. Group tensors by storage (union of ``alias_of`` links). A group's interval runs from
     the first op that produces or reads any member to the last, or to the end of the
     graph if a member is a model output.
  3. Walk the ops in order. For an in-place-capable op with one new output, take the
     first input whose (merged) buffer ends at this op, is not a model output and has
     the output's size; merge the output's group into that buffer.
  4. One record per merged buffer: id = its first tensor's id, interval in positions
     of the order, size = the largest member's bytes, aligned.

:func:`check_order` is shared with the operator-order search, which must not reorder
ops whose relative order the storage sharing fixes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from layerfit.errors import PlanError
from layerfit.memory.records import (
    DEFAULT_ALIGNMENT,
    TensorUsageRecord,
    check_alignment,
    check_records,
)
from layerfit.sizes import align_up

if TYPE_CHECKING:
    from layerfit.capture.graph import ModelGraph


@dataclass(frozen=True)
class GraphRecords:
    """Records of a graph's buffers and how tensors map onto them."""

    records: list[TensorUsageRecord]
    record_of: dict[int, int]  # tensor id -> record id (the buffer that holds it)
    order: tuple[int, ...]  # op indices in execution order; record op indices are positions in it
    views: int  # tensors folded into another tensor's storage by aliasing
    inplace: int  # outputs written over a dying input
    tensor_bytes: int = field(default=0)  # sum of all tensor sizes, aliases counted every time


class _Storage:
    """Alias structure of a graph: groups of tensors sharing storage, and their users."""

    def __init__(self, graph: ModelGraph) -> None:
        self.graph = graph
        tensors = {t.id: t for t in graph.tensors}
        self.tensors = tensors
        parent = {tid: tid for tid in tensors}

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for t in graph.tensors:
            if t.alias_of is not None and t.alias_of in tensors:
                a, b = find(t.id), find(t.alias_of)
                if a != b:
                    parent[max(a, b)] = min(a, b)
        self.group_of = {tid: find(tid) for tid in tensors}
        self.members: dict[int, list[int]] = {}
        for tid, g in self.group_of.items():
            self.members.setdefault(g, []).append(tid)
        self.users: dict[int, set[int]] = {g: set() for g in self.members}  # ops using the group
        self.readers: dict[int, set[int]] = {tid: set() for tid in tensors}
        self.producer: dict[int, int] = {}
        for op in graph.ops:
            for tid in op.inputs:
                if tid in tensors:
                    self.readers[tid].add(op.index)
                    self.users[self.group_of[tid]].add(op.index)
            for tid in op.outputs:
                if tid in tensors:
                    self.producer[tid] = op.index
                    self.users[self.group_of[tid]].add(op.index)
        last_op = len(graph.ops) - 1
        self.output_groups = {
            self.group_of[t.id]
            for t in graph.tensors
            if t.last_op == last_op and last_op not in self.readers[t.id] and len(graph.ops) > 0
        }
        # A group's size for the activation planner is its largest tensor's, as in TFLite,
        # where a broadcast (our ``expand`` view) is a tensor of its own; the bytes its
        # storage really holds are its base's (the group's root: a view's base is an
        # earlier tensor, so the smallest id), what :mod:`layerfit.memory.activations`
        # counts.
        self.size = {g: max(tensors[t].nbytes for t in ms) for g, ms in self.members.items()}
        self.base_bytes = {g: tensors[g].nbytes for g in self.members}

    def intervals(self, position: dict[int, int], end: int) -> tuple[dict[int, int], dict[int, int]]:
        """First and last position of every group under an order (``position[op]``): from
        the first op that produces or reads any member to the last, or to ``end`` when a
        member is a model output. A group no op touches keeps its captured place."""
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for g, users in self.users.items():
            if users:
                first[g] = min(position[u] for u in users)
                last[g] = max(position[u] for u in users)
            else:  # a tensor no op touches: keep its captured place
                t = self.tensors[g]
                first[g] = last[g] = position.get(min(t.first_op, end), 0) if position else 0
            if g in self.output_groups:
                last[g] = end
        return first, last

    def dependencies(self) -> list[set[int]]:
        """For every op, the ops that must run before it.

        Data dependencies (producer of each input), plus: ops using one storage group of
        several tensors keep their captured relative order, because a view or an in-place
        write makes their effects order-dependent.
        """
        deps: list[set[int]] = [set() for _ in self.graph.ops]
        for op in self.graph.ops:
            for tid in op.inputs:
                p = self.producer.get(tid)
                if p is not None and p != op.index:
                    deps[op.index].add(p)
        for g, ms in self.members.items():
            if len(ms) > 1:
                chain = sorted(self.users[g])
                for a, b in zip(chain, chain[1:], strict=False):
                    deps[b].add(a)
        return deps


def check_order(
    graph: ModelGraph, order: Sequence[int], deps: list[set[int]] | None = None
) -> tuple[int, ...]:
    """``order`` as a tuple if it is a topological order of all ops, else PlanError."""
    order = tuple(order)
    m = len(graph.ops)
    if sorted(order) != list(range(m)):
        raise PlanError(f"an operator order must list each of the {m} op indices exactly once")
    if deps is None:
        deps = _Storage(graph).dependencies()
    position = {op: p for p, op in enumerate(order)}
    for op in order:
        for d in deps[op]:
            if position[d] > position[op]:
                raise PlanError(
                    f"operator order runs op {op} ({graph.ops[op].name}) before op {d} "
                    f"({graph.ops[d].name}), which it depends on"
                )
    return order


def records_from_graph(
    graph: ModelGraph,
    order: Sequence[int] | None = None,
    *,
    inplace: bool = True,
    alignment: int = DEFAULT_ALIGNMENT,
) -> GraphRecords:
    """Tensor usage records of ``graph``'s buffers under ``order`` (default: as captured)."""
    check_alignment(alignment)
    storage = _Storage(graph)
    order = check_order(
        graph, range(len(graph.ops)) if order is None else order, storage.dependencies()
    )
    position = {op: p for p, op in enumerate(order)}
    first, last = storage.intervals(position, max(len(order) - 1, 0))

    # merged buffers: union-find over groups, with the buffer interval kept at the root
    buffer = {g: g for g in storage.members}
    b_first, b_last = dict(first), dict(last)
    b_output = {g: g in storage.output_groups for g in storage.members}

    def find(g: int) -> int:
        while buffer[g] != g:
            buffer[g] = buffer[buffer[g]]
            g = buffer[g]
        return g

    merged = 0
    if inplace:
        for op_index in order:
            op = graph.ops[op_index]
            if not op.inplace or len(op.outputs) != 1:
                continue
            out_group = storage.group_of.get(op.outputs[0])
            if out_group is None or out_group != op.outputs[0] or find(out_group) != out_group:
                continue  # the output is a view, or already shares a buffer
            here = position[op_index]
            for tid in op.inputs:
                g = storage.group_of.get(tid)
                if g is None or g == out_group:
                    continue
                b = find(g)
                if (
                    last[g] == here
                    and b_last[b] == here
                    and not b_output[b]
                    and storage.size[g] == storage.size[out_group]
                ):
                    buffer[out_group] = b
                    b_last[b] = b_last[out_group]
                    b_output[b] = b_output[out_group]
                    merged += 1
                    break

    sizes: dict[int, int] = {}
    for g in storage.members:
        b = find(g)
        sizes[b] = max(sizes.get(b, 0), storage.size[g])
    records = [
        TensorUsageRecord(
            b, b_first[b], b_last[b], align_up(sizes[b], alignment) if sizes[b] else 0
        )
        for b in sorted(sizes)
    ]
    check_records(records)
    record_of = {tid: find(g) for tid, g in storage.group_of.items()}
    views = sum(len(ms) - 1 for ms in storage.members.values())
    total = sum(t.nbytes for t in graph.tensors)
    return GraphRecords(records, record_of, order, views, merged, total)
