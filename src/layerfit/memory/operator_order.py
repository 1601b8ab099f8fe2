"""Operator-order search: the execution order that minimises the offsets lower bound.

Pisarchyk & Lee fix the topological order and leave optimising it as future work;
Liberis & Lane (2019) showed that reordering the branches of a network changes which
tensors coexist. The offsets lower bound (the largest operator breadth) is a property of
the order alone, and the offset strategies reach it almost always, so we search for the
order with the smallest bound and then plan on it.

Algorithm — dynamic programming over *executed sets* (downsets of the dependency DAG):
  1. Storage is modelled exactly as in :mod:`layerfit.memory.from_graph`: alias groups
     are one buffer, and an in-place op's output reuses an input buffer that dies there.
  2. A state is the set ``S`` of ops already run. ``R(S)`` is the bytes of buffers touched
     by ``S`` and still needed (a user outside ``S``, or a model output).
  3. Running a ready op ``v`` next costs ``R(S)`` + the buffers that start at ``v`` − the
     output it writes in place; the state's value is the peak along its path.
  4. Layer by layer (``|S|`` = 0, 1, …, n) keep, for every reachable set, the path with the
     smallest peak (ties: the smaller ``R``, then the captured order).
  5. Beyond ``max_states`` sets in one layer keep the best ones — the captured order's
     prefix always among them, so the result is never worse than the captured order —
     and report the search as not exact. Otherwise the order found is optimal.
  6. Once the search has run ``time_limit`` seconds, the remaining layers keep at most
     ``FALLBACK_STATES`` sets (a narrow beam, same rules), so wide graphs — where every
     layer fills ``max_states`` and the work is ``ops × max_states × branches`` — still
     finish in about ``time_limit`` seconds; the result says so (``time_limited``).

Branchy graphs (Inception, DeepLab's ASPP, DenseNet, YOLO routes) have few reachable
sets between their join points, so the search stays exact on them (Inception v3: 36 k
sets, about two seconds).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from layerfit.errors import PlanError
from layerfit.memory.bounds import offsets_lower_bound
from layerfit.memory.from_graph import _Storage, records_from_graph
from layerfit.memory.profiles import operator_profiles
from layerfit.memory.records import (
    DEFAULT_ALIGNMENT,
    TensorUsageRecord,
    check_alignment,
    check_time_limit,
)
from layerfit.sizes import align_up

if TYPE_CHECKING:
    from layerfit.capture.graph import ModelGraph

DEFAULT_MAX_STATES = 20_000
DEFAULT_TIME_LIMIT = 10.0  # seconds of full-width search before the beam narrows
FALLBACK_STATES = 64


@dataclass(frozen=True)
class OrderSearchResult:
    """The best order found and how it compares with the captured one."""

    order: tuple[int, ...]
    peak: int  # offsets lower bound (max breadth) under ``order``
    captured_peak: int  # the same bound under the captured order
    exact: bool  # True when no state was pruned: ``peak`` is minimal over all valid orders
    states: int  # executed sets examined
    seconds: float
    time_limited: bool = False  # the beam narrowed to FALLBACK_STATES at the time limit

    @property
    def saving(self) -> float:
        """Fraction of the captured bound saved by reordering."""
        return 0.0 if self.captured_peak == 0 else 1 - self.peak / self.captured_peak

    def to_dict(self) -> dict[str, object]:
        return {
            "peak": self.peak,
            "captured_peak": self.captured_peak,
            "saving": self.saving,
            "exact": self.exact,
            "states": self.states,
            "seconds": self.seconds,
            "time_limited": self.time_limited,
            "order": list(self.order),
        }


class _Model:
    """Bitmask form of the graph for fast state transitions."""

    def __init__(self, graph: ModelGraph, inplace: bool, alignment: int) -> None:
        check_alignment(alignment)
        storage = _Storage(graph)
        self.m = len(graph.ops)
        groups = sorted(storage.members)
        index = {g: k for k, g in enumerate(groups)}
        self.size = [align_up(storage.size[g], alignment) if storage.size[g] else 0 for g in groups]
        self.users = [sum(1 << u for u in storage.users[g]) for g in groups]
        self.output = [g in storage.output_groups for g in groups]
        self.used_by: list[list[int]] = [[] for _ in range(self.m)]
        for k, g in enumerate(groups):
            for u in storage.users[g]:
                self.used_by[u].append(k)
        deps = storage.dependencies()
        self.deps = [sum(1 << d for d in ds) for ds in deps]
        self.succs: list[list[int]] = [[] for _ in range(self.m)]
        for v, ds in enumerate(deps):
            for d in ds:
                self.succs[d].append(v)
        # in-place: (output group, candidate input groups in input order) per op
        self.inplace: list[tuple[int, list[int]] | None] = [None] * self.m
        if inplace:
            for op in graph.ops:
                if not op.inplace or len(op.outputs) != 1:
                    continue
                out = op.outputs[0]
                if storage.group_of.get(out) != out:
                    continue
                o = index[out]
                cands = []
                for tid in op.inputs:
                    g = storage.group_of.get(tid)
                    if g is not None and g != out and storage.size[g] == storage.size[out]:
                        cands.append(index[g])
                if cands:
                    self.inplace[op.index] = (o, cands)

    def step(self, done: int, resident: int, v: int) -> tuple[int, int]:
        """(bytes live while ``v`` runs after ``done``, resident bytes after it)."""
        after = done | (1 << v)
        starting = 0
        resident_after = resident
        for k in self.used_by[v]:
            users = self.users[k]
            new = not (users & done)
            still_needed = self.output[k] or (users & ~after) != 0
            if new:
                starting += self.size[k]
                if still_needed:
                    resident_after += self.size[k]
            elif not still_needed:
                resident_after -= self.size[k]
        saving = 0
        spec = self.inplace[v]
        if spec is not None:
            o, cands = spec
            if not (self.users[o] & done):
                for k in cands:
                    if not self.output[k] and (self.users[k] & ~after) == 0:
                        saving = self.size[o]
                        break
        return resident + starting - saving, resident_after


def search_operator_order(
    graph: ModelGraph,
    *,
    inplace: bool = True,
    alignment: int = DEFAULT_ALIGNMENT,
    max_states: int = DEFAULT_MAX_STATES,
    time_limit: float | None = DEFAULT_TIME_LIMIT,
) -> OrderSearchResult:
    """The valid execution order of ``graph`` with the smallest offsets lower bound.

    ``time_limit`` (seconds, None for none) bounds the full-width search; past it the
    beam narrows to ``FALLBACK_STATES`` sets per layer (see the module docstring).
    One search loop (about 80 lines): the time limit, the beam's fallback and the best
    order found share its state.
    """
    if not isinstance(max_states, int) or isinstance(max_states, bool) or max_states < 1:
        raise PlanError(f"max_states must be a positive integer, got {max_states!r}")
    if time_limit is not None:
        check_time_limit(time_limit)
    start = time.perf_counter()
    model = _Model(graph, inplace, alignment)
    m = model.m
    captured = tuple(range(m))
    captured_peak = offsets_lower_bound(
        records_from_graph(graph, captured, inplace=inplace, alignment=alignment).records
    )
    # state: done mask -> (peak, resident, rank, parent mask, last op, ready mask)
    # rank orders ties: the captured prefix has rank 0
    initial_ready = sum(1 << v for v in range(m) if model.deps[v] == 0)
    layer: dict[int, tuple[int, int, int, int, int, int]] = {0: (0, 0, 0, -1, -1, initial_ready)}
    history: list[dict[int, tuple[int, int]]] = []  # per layer: mask -> (parent mask, op)
    exact = True
    time_limited = False
    states = 0
    for depth in range(m):
        if (
            not time_limited
            and time_limit is not None
            and time.perf_counter() - start > time_limit
            and max_states > FALLBACK_STATES
        ):
            time_limited = True
            max_states = FALLBACK_STATES
        nxt: dict[int, tuple[int, int, int, int, int, int]] = {}
        captured_mask = (1 << depth) - 1
        for done, (peak, resident, _rank, _parent, _op, ready) in layer.items():
            bits = ready
            while bits:
                low = bits & -bits
                v = low.bit_length() - 1
                bits ^= low
                live, resident_after = model.step(done, resident, v)
                after = done | low
                new_ready = ready ^ low
                for w in model.succs[v]:
                    if (model.deps[w] & ~after) == 0:
                        new_ready |= 1 << w
                rank = 0 if (after == captured_mask | (1 << depth) and done == captured_mask) else 1
                cand = (max(peak, live), resident_after, rank, done, v, new_ready)
                old = nxt.get(after)
                if old is None or cand[:3] < old[:3]:
                    nxt[after] = cand
        states += len(nxt)
        if len(nxt) > max_states:
            exact = False
            keep = sorted(nxt.items(), key=lambda kv: kv[1][:3])[:max_states]
            prefix = captured_mask | (1 << depth)
            if prefix in nxt and all(k != prefix for k, _ in keep):
                keep[-1] = (prefix, nxt[prefix])
            nxt = dict(keep)
        history.append({k: (val[3], val[4]) for k, val in nxt.items()})
        layer = nxt
    if m == 0:
        return OrderSearchResult((), 0, captured_peak, True, 0, time.perf_counter() - start)
    final_mask = (1 << m) - 1
    peak = layer[final_mask][0]
    order: list[int] = []
    mask = final_mask
    for depth in range(m - 1, -1, -1):
        parent, op = history[depth][mask]
        order.append(op)
        mask = parent
    order.reverse()
    return OrderSearchResult(
        tuple(order), peak, captured_peak, exact, states, time.perf_counter() - start, time_limited
    )


def breadth_first_order(graph: ModelGraph) -> tuple[int, ...]:
    """A valid order that runs ops level by level (Kahn's algorithm with a FIFO queue).

    This is the order a converter that schedules "all ready ops first" would produce;
    it is a useful foil for the search, since branchy networks run all branches side by
    side in it.
    """
    deps = _Storage(graph).dependencies()
    waiting = [len(d) for d in deps]
    succs: list[list[int]] = [[] for _ in deps]
    for v, ds in enumerate(deps):
        for d in ds:
            succs[d].append(v)
    queue = [v for v, w in enumerate(waiting) if w == 0]
    order: list[int] = []
    head = 0
    while head < len(queue):
        v = queue[head]
        head += 1
        order.append(v)
        for w in sorted(succs[v]):
            waiting[w] -= 1
            if waiting[w] == 0:
                queue.append(w)
    return tuple(order)


def peak_position(records: Sequence[TensorUsageRecord]) -> int:
    """The operator position with the largest breadth (the first one on ties)."""
    best = max(operator_profiles(records), key=lambda p: (p.breadth, -p.op), default=None)
    return -1 if best is None else best.op


def reordered_records(
    graph: ModelGraph,
    order: Sequence[int],
    *,
    inplace: bool = True,
    alignment: int = DEFAULT_ALIGNMENT,
):
    """Records of ``graph`` executed in ``order`` (a convenience over ``records_from_graph``)."""
    return records_from_graph(graph, order, inplace=inplace, alignment=alignment).records
