"""Shared objects, min-cost flow: TFLite GPU's ``MinCostFlowAssignment`` (Lee et al. 2019).

Algorithm — a bipartite flow network whose min-cost flow pairs each tensor with the
earlier tensor whose object it inherits:
  1. Visit tensors in execution order (by ``first_op``, ties in record order). Tensor
     ``i`` has a left vertex ``L_i`` and a right vertex ``R_i``.
  2. Arcs ``source → L_i`` (capacity 1, cost 0) and ``R_i → sink`` (1, 0).
  3. Arc ``source → R_i`` (1, ``size(i)``): tensor ``i`` opens a new object.
  4. For every earlier tensor ``j`` already dead when ``i`` starts, arc ``L_j → R_i``
     (1, ``max(0, size(i) − size(j))``): ``i`` reuses ``j``'s object, paying roughly the
     growth of that object.
  5. Find a min-cost max-flow.
  6. Every saturated ``source → R_i`` starts a new object; follow the saturated
     ``L_j → R_k`` arcs from ``i`` to collect the tensors that reuse it; the object is
     as large as its largest tensor.

The cost is only an approximation of the memory (growth is counted per reuse, not per
object), which is why the paper's strategies beat it.

Step 5 has two solvers over the same network. ``spfa`` is TFLite's: successive shortest
paths found by SPFA (Bellman–Ford with FIFO queues, layer by layer), ported edge for
edge so that ties resolve exactly as in TFLite. It is quadratic in the number of arcs,
which grow quadratically with the tensors, so ``auto`` (the default) uses it up to
``SPFA_ARC_LIMIT`` reuse arcs and OR-Tools' ``SimpleMinCostFlow`` beyond. Both return a
flow of the same minimum cost; when several flows tie they may pick different ones.
OR-Tools scales costs by the number of vertices internally and refuses costs that would
overflow int64 then, so costs are divided by their greatest common divisor first (the
alignment, usually), and ``auto`` falls back to SPFA (Python integers) for sizes still
too large (near 2**63 bytes).

Cost: the network has one reuse arc per pair of tensors that do not overlap, so time and
memory grow quadratically — about 3 s for 2 000 tensors and 20 s and 1.4 GB for 5 000.
The ``best`` portfolio therefore leaves this member out past ``PORTFOLIO_ARC_LIMIT``
reuse arcs (:func:`reuse_arc_count`); asked for by name it always runs.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from collections.abc import Sequence

import numpy as np

from layerfit.errors import PlanError
from layerfit.extras import require
from layerfit.memory.plans import SharedObjectsPlan
from layerfit.memory.records import TensorUsageRecord
from layerfit.memory.registry import register

SPFA_ARC_LIMIT = 2500
PORTFOLIO_ARC_LIMIT = 2_000_000  # about 2 000 tensors: a few seconds
SOLVERS = ("auto", "spfa", "ortools")


def reuse_arc_count(records: Sequence[TensorUsageRecord]) -> int:
    """Reuse arcs of the flow network: pairs of tensors where one ends before the other starts."""
    lasts = sorted(r.last_op for r in records)
    return sum(bisect.bisect_left(lasts, r.first_op) for r in records)


class _CostRangeError(PlanError):
    """OR-Tools refused the network: its internally scaled costs overflow int64."""


class FlowNetwork:
    """The arcs of steps 2–4 in TFLite's insertion order, as NumPy arrays.

    For tensor ``i`` the arcs are ``source → L_i``, ``R_i → sink``, ``source → R_i`` and
    then ``L_j → R_i`` for every finished ``j`` in the order the tensors finished.
    """

    def __init__(self, recs: Sequence[TensorUsageRecord]) -> None:
        n = len(recs)
        self.n = n
        self.source, self.sink = 2 * n, 2 * n + 1
        finished: list[int] = []  # tensors in the order they finish; a prefix is finished for i
        prefix = np.zeros(n, dtype=np.int64)
        in_use: list[tuple[int, int]] = []
        for i, rec in enumerate(recs):
            while in_use and in_use[0][0] < rec.first_op:
                finished.append(heapq.heappop(in_use)[1])
            heapq.heappush(in_use, (rec.last_op, i))
            prefix[i] = len(finished)
        size = np.array([r.size for r in recs], dtype=np.int64)
        done = np.array(finished, dtype=np.int64)
        block = 3 + prefix
        start = np.cumsum(block) - block
        total = int(block.sum())
        ids = np.arange(n, dtype=np.int64)
        self.tails = np.empty(total, dtype=np.int64)
        self.heads = np.empty(total, dtype=np.int64)
        self.costs = np.zeros(total, dtype=np.int64)
        self.tails[start], self.heads[start] = self.source, ids
        self.tails[start + 1], self.heads[start + 1] = n + ids, self.sink
        self.new_arc = start + 2
        self.tails[start + 2], self.heads[start + 2], self.costs[start + 2] = (
            self.source,
            n + ids,
            size,
        )
        head = np.repeat(ids, prefix)
        k = np.arange(len(head), dtype=np.int64) - np.repeat(np.cumsum(prefix) - prefix, prefix)
        pos = np.repeat(start + 3, prefix) + k
        tail = done[k] if len(k) else k
        self.tails[pos], self.heads[pos] = tail, n + head
        self.costs[pos] = np.maximum(0, size[head] - size[tail])
        self.reuse_arcs = len(pos)

    def flow_spfa(self) -> np.ndarray:
        """Unit flow on every arc, by TFLite's successive SPFA shortest paths."""
        vertices = 2 * self.n + 2
        # residual graph: arc a is edge 2a, its reverse edge 2a + 1 (TFLite's idx ^ 1)
        dst: list[int] = []
        cap: list[int] = []
        cost: list[int] = []
        edges_from: list[list[int]] = [[] for _ in range(vertices)]
        for tail, head, c in zip(
            self.tails.tolist(), self.heads.tolist(), self.costs.tolist(), strict=True
        ):
            edges_from[tail].append(len(dst))
            dst.append(head)
            cap.append(1)
            cost.append(c)
            edges_from[head].append(len(dst))
            dst.append(tail)
            cap.append(0)
            cost.append(-c)
        source, sink = self.source, self.sink
        inf = float("inf")
        while True:
            dist = [inf] * vertices
            prev_edge = [-1] * vertices
            last_round = [0] * vertices
            dist[source] = 0
            current = deque([source])
            rnd = 1
            last_round[source] = rnd
            while current:
                rnd += 1
                following: deque[int] = deque()
                while current:
                    v = current.popleft()
                    dv = dist[v]
                    for e in edges_from[v]:
                        if cap[e] > 0:
                            u = dst[e]
                            nd = dv + cost[e]
                            if nd < dist[u]:
                                dist[u] = nd
                                prev_edge[u] = e
                                if last_round[u] != rnd:
                                    following.append(u)
                                    last_round[u] = rnd
                current = following
            if dist[sink] == inf:
                break
            v = sink
            while v != source:
                e = prev_edge[v]
                cap[e] -= 1
                cap[e ^ 1] += 1
                v = dst[e ^ 1]
        return np.array([1 - c for c in cap[0::2]], dtype=np.int64)

    def flow_ortools(self) -> np.ndarray:
        """Unit flow on every arc, by OR-Tools' min-cost flow solver."""
        require("ortools")  # the plan extra
        from ortools.graph.python import min_cost_flow

        solver = min_cost_flow.SimpleMinCostFlow()
        m = len(self.tails)
        unit = math.gcd(*self.costs.tolist()) or 1  # same flows, smaller costs
        arcs = solver.add_arcs_with_capacity_and_unit_cost(
            self.tails, self.heads, np.ones(m, dtype=np.int64), self.costs // unit
        )
        supplies = np.zeros(2 * self.n + 2, dtype=np.int64)
        supplies[self.source], supplies[self.sink] = self.n, -self.n
        solver.set_nodes_supplies(np.arange(2 * self.n + 2, dtype=np.int64), supplies)
        status = solver.solve()
        if status == solver.BAD_COST_RANGE:
            raise _CostRangeError(f"costs up to {int(self.costs.max())} overflow OR-Tools")
        if status != solver.OPTIMAL:
            raise PlanError(f"min-cost flow solver failed with status {status}")
        return np.asarray(solver.flows(arcs), dtype=np.int64)

    def cost(self, flow: np.ndarray) -> int:
        """Total cost of a flow (equal for every min-cost flow of the network)."""
        return int(self.costs @ flow)


@register(
    "objects",
    "min_cost_flow",
    "TFLite min-cost flow: pair each tensor with the object it inherits",
    options=("solver",),
)
def min_cost_flow_objects(
    records: Sequence[TensorUsageRecord], solver: str = "auto"
) -> SharedObjectsPlan:
    if solver not in SOLVERS:
        raise PlanError(
            f"unknown min-cost flow solver {solver!r}; choose one of: {', '.join(SOLVERS)}"
        )
    order = sorted(range(len(records)), key=lambda i: (records[i].first_op, i))
    recs = [records[i] for i in order]
    n = len(recs)
    net = FlowNetwork(recs)
    if solver == "spfa" or (solver == "auto" and net.reuse_arcs <= SPFA_ARC_LIMIT):
        flow = net.flow_spfa()
    else:
        try:
            flow = net.flow_ortools()
        except _CostRangeError as exc:
            if solver != "auto":
                raise PlanError(
                    f"the OR-Tools min-cost flow cannot take these sizes ({exc}); "
                    'use solver="spfa" or "auto"'
                ) from None
            flow = net.flow_spfa()
    used = (flow > 0) & (net.tails < n) & (net.heads >= n) & (net.heads < 2 * n)
    reuses = dict(zip(net.tails[used].tolist(), (net.heads[used] - n).tolist(), strict=True))
    new_object = flow[net.new_arc] > 0
    object_of = [-1] * n
    sizes: list[int] = []
    for i in range(n):
        if new_object[i]:
            t: int | None = i
            largest = 0
            while t is not None and object_of[t] < 0:
                object_of[t] = len(sizes)
                largest = max(largest, recs[t].size)
                t = reuses.get(t)
            sizes.append(largest)
    return SharedObjectsPlan(tuple(sizes), {recs[i].id: o for i, o in enumerate(object_of)})
