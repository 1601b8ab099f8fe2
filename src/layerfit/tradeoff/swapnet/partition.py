"""SwapNet's block partition under a memory budget (Section 6.2.2, Eq. 2-4, Table 3).

A partition ``p = (p_1 < ... < p_{n-1})`` cuts the model's layers into ``n`` blocks; the
engine keeps two blocks in flight, so the constraint (Eq. 3) is

    s_i + s_{i+1} <= B * (1 - delta) = W    for every pair of adjacent blocks,

where ``delta * B`` is the reserve: the skeleton, the activations (their arena, from the
memory planner) and the lookup tables, plus the tensors kept resident. ``s`` is what a
block occupies in the engine's buffer (padded segment bytes).

**Objective.** With two blocks in flight, block ``i+1`` is read while block ``i``
executes, and block ``i-1``'s buffer is free once block ``i`` starts. In layerfit the
binding (assembly) and the unbinding (swap-out) of a block run on the executing thread,
around its kernel, so the executing thread's work for block ``i`` is
``w_i = t_bind + t_ex + t_out`` and the reader's is ``r_i = alpha * s_i``. Then

    t(p) = r_1 + sum_{i=1}^{n-1} max(w_i, r_{i+1}) + w_n,

which is Eq. 4 (latency = execution plus the residual swap delay the execution cannot
cover) with the paper's ``t_out`` of block ``i-1`` moved from the swap side of step ``i``
to the execute side of step ``i-1``, where this engine performs it. Each term depends on
two adjacent blocks only, which makes an exact dynamic program possible.

**Exact optimum** (:func:`optimal_partition`): states are "the last block placed is
``[a, b)``", the value is the time the next kernel may start; a transition appends
``[b, c)`` when ``s(a,b) + s(b,c) <= W``. O(L^2) states and O(L^3) work, vectorised over
``a`` and ``c``. It can be restricted to candidate points and to a fixed block count.

**Lookup tables** (:class:`PartitionTables`), as the paper prepares them: for each block
count ``n`` every combination of ``n-1`` candidate points (all points when the table
stays under ``rows_per_table`` rows, else points at quantiles of bytes and work), each
row with its maximum memory (largest adjacent pair) and predicted latency. At run time
the rows are pruned by the budget and the least predicted delay is taken; rows are
sorted by memory with a running arg-min, so the lookup is a binary search. The tables
also hold the exact optimum at ``anchors`` budgets from the minimum to the model size, so
every feasible budget finds a row.

:class:`SwapNetPlan` joins these for one prepared model: costs from the device profile,
the reserve, the tables, the minimum budget, and :meth:`SwapNetPlan.choose`, which turns
a budget into an engine configuration or raises :class:`~layerfit.errors.PartitionError`
naming the layer that makes the budget impossible and the minimum budget.
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from layerfit.capture.graph import ModelGraph
from layerfit.engine.config import EngineConfig
from layerfit.engine.skeleton import build_skeleton
from layerfit.errors import PartitionError
from layerfit.memory.activations import activation_bytes as _activation_bytes
from layerfit.memory.records import DEFAULT_ALIGNMENT
from layerfit.sizes import Budget, format_bytes, parse_bytes
from layerfit.store import read_manifest
from layerfit.store.manifest import ALIGN, Manifest
from layerfit.tradeoff.swapnet.profile import DeviceProfile, model_key

# --- per-layer costs ---------------------------------------------------------------------


@dataclass(frozen=True)
class LayerCosts:
    """Per-layer bytes and predicted seconds of one model on one device.

    ``read_s`` is the reader's time (``alpha * s``); ``work_s`` the executing thread's
    (bind + execute + unbind, the execution including the glue before the layer);
    ``exec_s`` the execution alone (what a run with every weight resident costs). A
    block adds ``read_overhead_s`` to its read (one request) and ``work_overhead_s`` to
    its work (the hand-over between the threads).
    """

    names: tuple[str, ...]
    nbytes: np.ndarray
    read_s: np.ndarray
    work_s: np.ndarray
    exec_s: np.ndarray
    exec_source: str  # "measured" or "regression"
    read_overhead_s: float = 0.0
    work_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "_s", np.concatenate([[0], np.cumsum(self.nbytes, dtype=np.int64)]))
        object.__setattr__(self, "_r", np.concatenate([[0.0], np.cumsum(self.read_s)]))
        object.__setattr__(self, "_w", np.concatenate([[0.0], np.cumsum(self.work_s)]))

    @property
    def layers(self) -> int:
        return len(self.nbytes)

    @property
    def total_bytes(self) -> int:
        return int(self._s[-1])

    @property
    def direct_s(self) -> float:
        """Predicted latency with every weight resident (no swapping)."""
        return float(self.exec_s.sum())

    @classmethod
    def from_arrays(
        cls,
        nbytes: Sequence[int],
        read_s: Sequence[float],
        work_s: Sequence[float],
        names: Sequence[str] | None = None,
        exec_s: Sequence[float] | None = None,
        exec_source: str = "given",
        read_overhead_s: float = 0.0,
        work_overhead_s: float = 0.0,
    ) -> LayerCosts:
        n = len(nbytes)
        return cls(
            tuple(names) if names is not None else tuple(f"layer{i}" for i in range(n)),
            np.asarray(nbytes, dtype=np.int64),
            np.asarray(read_s, dtype=float),
            np.asarray(work_s, dtype=float),
            np.asarray(exec_s if exec_s is not None else work_s, dtype=float),
            exec_source,
            float(read_overhead_s),
            float(work_overhead_s),
        )

    def block_bytes(self, bounds: np.ndarray) -> np.ndarray:
        """Bytes of the blocks between consecutive bounds (last axis)."""
        s = self._s[bounds]
        return s[..., 1:] - s[..., :-1]

    def block_read(self, bounds: np.ndarray) -> np.ndarray:
        r = self._r[bounds]
        return r[..., 1:] - r[..., :-1] + self.read_overhead_s

    def block_work(self, bounds: np.ndarray) -> np.ndarray:
        w = self._w[bounds]
        return w[..., 1:] - w[..., :-1] + self.work_overhead_s


def layer_costs(manifest: Manifest, profile: DeviceProfile) -> LayerCosts:
    """Costs of ``manifest``'s layers from ``profile`` (measured where it has the model)."""
    units = manifest.units
    nbytes = np.array([u.nbytes for u in units], dtype=np.int64)
    d = np.array([u.d for u in units], dtype=float)
    f = np.array([u.f for u in units], dtype=float)
    read = profile.alpha * nbytes
    times = profile.models.get(model_key(manifest))
    if times is not None and len(times.kernel_s) == len(units):
        execute = np.array(times.kernel_s) + np.array(times.glue_s)
        execute[-1] += times.tail_s
        work = np.array(times.bind_s) + execute + np.array(times.unbind_s)
        source, overhead = "measured", times.exec_overhead_s
    else:
        execute = profile.gamma * f * (1.0 + profile.glue_ratio)
        work = profile.beta * d + execute + profile.eta * d
        source, overhead = "regression", profile.kappa_exec
    return LayerCosts(
        tuple(u.name for u in units), nbytes, read, work, execute, source, profile.kappa_read, overhead
    )


def _bounds(points: Sequence[int], layers: int) -> np.ndarray:
    return np.array([0, *sorted(points), layers], dtype=np.int64)


def predict(costs: LayerCosts, points: Sequence[int]) -> float:
    """Predicted latency of the blocks starting at ``points`` (two blocks in flight)."""
    b = _bounds(points, costs.layers)
    r, w = costs.block_read(b), costs.block_work(b)
    return float(r[0] + np.maximum(w[:-1], r[1:]).sum() + w[-1])


def max_pair_bytes(costs: LayerCosts, points: Sequence[int]) -> int:
    """Largest ``s_i + s_{i+1}`` over adjacent blocks (the one block's size if n = 1)."""
    s = costs.block_bytes(_bounds(points, costs.layers))
    return int(s[0]) if len(s) == 1 else int((s[:-1] + s[1:]).max())


@dataclass(frozen=True)
class Choice:
    """A partition: block start points (0 implied), its memory and predicted latency."""

    points: tuple[int, ...]
    max_pair_bytes: int
    predicted_s: float
    method: str  # "dp", "table" or "anchor"

    @property
    def blocks(self) -> int:
        return len(self.points) + 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "blocks": self.blocks,
            "points": list(self.points),
            "max_pair_bytes": self.max_pair_bytes,
            "predicted_s": self.predicted_s,
            "method": self.method,
        }


# --- exact dynamic program -----------------------------------------------------------------


def optimal_partition(
    costs: LayerCosts,
    capacity: int,
    *,
    candidates: Sequence[int] | None = None,
    blocks: int | None = None,
) -> Choice | None:
    """The partition of least predicted latency with every adjacent pair <= ``capacity``.

    At least two blocks. ``candidates`` restricts the points (default: every layer
    boundary); ``blocks`` fixes the block count. None when no partition fits.
    """
    layers = costs.layers
    if layers < 2 or (blocks is not None and (blocks < 2 or blocks > layers)):
        return None
    inner = range(1, layers) if candidates is None else sorted({int(c) for c in candidates if 0 < c < layers})
    pos = np.array([0, *inner, layers], dtype=np.int64)
    m = len(pos) - 1
    if blocks is not None and blocks > m:
        return None
    s_at, r_at, w_at = costs._s[pos], costs._r[pos], costs._w[pos]
    kr, kw = costs.read_overhead_s, costs.work_overhead_s
    depth = 1 if blocks is None else blocks
    inf = np.inf
    value = np.full((depth, m + 1, m + 1), inf)  # value[j, a, b]: j(+1) blocks, last [a, b)
    parent = np.full((depth, m + 1, m + 1), -1, dtype=np.int32)
    first = np.arange(1, m)
    fits = (s_at[first] - s_at[0]) <= capacity
    value[0, 0, first[fits]] = r_at[first[fits]] - r_at[0] + kr
    for b in range(1, m):
        c = np.arange(b + 1, m + 1)
        s_bc = s_at[c] - s_at[b]
        r_bc = r_at[c] - r_at[b] + kr
        for j in range(depth):
            nxt = 0 if blocks is None else j + 1
            if nxt >= depth and blocks is not None:
                continue
            col = value[j, :b, b]
            a = np.nonzero(np.isfinite(col))[0]
            if a.size == 0:
                continue
            s_ab = s_at[b] - s_at[a]
            w_ab = w_at[b] - w_at[a] + kw
            total = col[a][:, None] + np.maximum(w_ab[:, None], r_bc[None, :])
            total[(s_ab[:, None] + s_bc[None, :]) > capacity] = inf
            best = np.argmin(total, axis=0)
            vals = total[best, np.arange(len(c))]
            better = vals < value[nxt, b, c]
            value[nxt, b, c[better]] = vals[better]
            parent[nxt, b, c[better]] = a[best[better]]
    last = depth - 1
    a = np.arange(1, m)
    ends = value[last, a, m] + (w_at[m] - w_at[a] + kw)
    if not np.isfinite(ends).any():
        return None
    a_best = int(a[int(np.argmin(ends))])
    starts, j, b = [], last, m
    while a_best > 0:
        starts.append(int(pos[a_best]))
        a_best, b = int(parent[j, a_best, b]), a_best
        j = 0 if blocks is None else j - 1
    points = tuple(sorted(starts))
    return Choice(points, max_pair_bytes(costs, points), predict(costs, points), "dp")


# --- lookup tables ---------------------------------------------------------------------------


@dataclass
class Table:
    """Every candidate partition into ``blocks`` blocks, sorted by maximum memory."""

    blocks: int
    candidates: tuple[int, ...]
    points: np.ndarray  # rows x (blocks - 1)
    max_bytes: np.ndarray  # rows
    latency_s: np.ndarray  # rows
    best_upto: np.ndarray  # rows: arg-min of latency among rows [0, i]
    anchors: int = 0  # rows added from the exact optimum

    @property
    def rows(self) -> int:
        return len(self.max_bytes)

    @property
    def nbytes(self) -> int:
        return int(self.points.nbytes + self.max_bytes.nbytes + self.latency_s.nbytes + self.best_upto.nbytes)

    def lookup(self, capacity: int) -> int | None:
        """Row of least latency among rows with ``max_bytes <= capacity`` (None if none)."""
        k = int(np.searchsorted(self.max_bytes, capacity, side="right")) - 1
        return None if k < 0 else int(self.best_upto[k])


def _sorted_table(blocks: int, candidates: tuple[int, ...], points: np.ndarray, costs: LayerCosts, anchors: int = 0) -> Table:
    rows = len(points)
    bounds = np.concatenate(
        [np.zeros((rows, 1), np.int64), points.astype(np.int64), np.full((rows, 1), costs.layers, np.int64)], axis=1
    )
    s, r, w = costs.block_bytes(bounds), costs.block_read(bounds), costs.block_work(bounds)
    max_bytes = (s[:, :-1] + s[:, 1:]).max(axis=1)
    latency = r[:, 0] + np.maximum(w[:, :-1], r[:, 1:]).sum(axis=1) + w[:, -1]
    order = np.lexsort((latency, max_bytes))
    points, max_bytes, latency = points[order], max_bytes[order], latency[order]
    running = np.minimum.accumulate(latency)
    best = np.maximum.accumulate(np.where(latency <= running, np.arange(rows), 0)).astype(np.int32)
    dtype = np.int16 if costs.layers < 2**15 else np.int32
    return Table(blocks, candidates, points.astype(dtype), max_bytes, latency, best, anchors)


def candidate_points(costs: LayerCosts, count: int) -> tuple[int, ...]:
    """``count`` partition points at quantiles of cumulative bytes and work, blended."""
    layers = costs.layers
    if count >= layers - 1:
        return tuple(range(1, layers))
    s = costs._s / max(costs._s[-1], 1)
    w = costs._w / max(costs._w[-1], 1e-30)
    blend = 0.5 * s + 0.5 * w
    targets = np.arange(1, count + 1) / (count + 1)
    pts = np.clip(np.searchsorted(blend, targets), 1, layers - 1)
    return tuple(sorted(set(int(p) for p in pts)))


def _largest_k(rows_cap: int, choose: int, limit: int) -> int:
    k = choose
    while k < limit and math.comb(k + 1, choose) <= rows_cap:
        k += 1
    return k


@dataclass
class PartitionTables:
    """Lookup tables per block count, built once per model and device (Table 3)."""

    tables: dict[int, Table]
    build_s: float = 0.0

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tables.values())

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables.values())

    @classmethod
    def build(
        cls,
        costs: LayerCosts,
        *,
        min_capacity: int,
        max_blocks: int | None = None,
        rows_per_table: int = 5000,
        anchors: int = 6,
    ) -> PartitionTables:
        """Enumerate the candidate partitions for n = 2 .. ``max_blocks`` blocks.

        ``max_blocks`` defaults to the paper's ``n = ceil(2 s / b)`` at the minimum
        capacity (plus one), at most 16. The ``anchors`` exact optima are taken at
        capacities spaced geometrically from the minimum to the model size.
        """
        t0 = time.perf_counter()
        layers = costs.layers
        total = costs.total_bytes
        if max_blocks is None:
            max_blocks = max(2, math.ceil(2 * total / max(min_capacity, 1)) + 1)
        max_blocks = min(max_blocks, layers, 16)
        tables: dict[int, Table] = {}
        for n in range(2, max_blocks + 1):
            k = _largest_k(rows_per_table, n - 1, layers - 1)
            cands = candidate_points(costs, k)
            if len(cands) < n - 1:
                continue
            combos = np.array(list(itertools.combinations(cands, n - 1)), dtype=np.int64).reshape(-1, n - 1)
            tables[n] = _sorted_table(n, cands, combos, costs)
        if anchors > 0 and layers >= 2:
            extra: dict[int, list[tuple[int, ...]]] = {}
            top = max(total, min_capacity)
            for cap in np.unique(np.geomspace(max(min_capacity, 1), top, anchors).astype(np.int64)):
                best = optimal_partition(costs, int(cap))
                if best is not None:
                    extra.setdefault(best.blocks, []).append(best.points)
            for n, rows in extra.items():
                rows = sorted(set(rows))
                old = tables.get(n)
                pts = np.array(rows, dtype=np.int64).reshape(-1, n - 1)
                cands = old.candidates if old is not None else ()
                if old is not None:
                    pts = np.concatenate([old.points.astype(np.int64), pts])
                tables[n] = _sorted_table(n, cands, pts, costs, anchors=len(rows))
        return cls(dict(sorted(tables.items())), time.perf_counter() - t0)

    def lookup(self, costs: LayerCosts, capacity: int) -> Choice | None:
        """Prune every table by ``capacity`` and take the least predicted latency."""
        best: tuple[float, int, int] | None = None
        for n, table in self.tables.items():
            row = table.lookup(capacity)
            if row is not None and (best is None or table.latency_s[row] < best[0]):
                best = (float(table.latency_s[row]), n, row)
        if best is None:
            return None
        _, n, row = best
        points = tuple(int(p) for p in self.tables[n].points[row])
        return Choice(points, int(self.tables[n].max_bytes[row]), float(self.tables[n].latency_s[row]), "table")

    def summary(self) -> list[dict[str, Any]]:
        return [
            {"blocks": n, "rows": t.rows, "candidates": len(t.candidates), "anchor_rows": t.anchors, "bytes": t.nbytes}
            for n, t in self.tables.items()
        ]


# --- the reserve delta ---------------------------------------------------------------------


def activation_bytes(graph: ModelGraph, strategy: str = "greedy_by_size") -> int:
    """The activations' share of the reserve: what one eager forward pass holds at once.

    The arena the memory planner lays the usage records out in, or what the captured
    eager pass held at its peak (``graph.pass_peak_bytes``) if that is more: SwapNet's
    engine lets PyTorch allocate, which does not reuse buffers as the planner does, and
    the records miss tensors made by functional code between modules (a transformer's
    attention scores, a returned cache).
    """
    return max(planned_arena_bytes(graph, strategy), graph.pass_peak_bytes)


def planned_arena_bytes(graph: ModelGraph, strategy: str = "greedy_by_size") -> int:
    """Size of the arena the memory planner lays the activations out in: one buffer per
    storage (a view owns no bytes and keeps its base alive to its last use), aligned as
    an arena places them (:func:`~layerfit.memory.activations.activation_bytes`)."""
    return _activation_bytes(graph, strategy, alignment=DEFAULT_ALIGNMENT)


def skeleton_bytes(manifest: Manifest) -> int:
    """Python heap of the meta-device skeleton: modules, their attributes, meta tensors.

    A shallow ``sys.getsizeof`` sum over every module object, its attribute dict and
    each attribute value (the parameter/buffer/hook dicts, shapes, flags) and every meta
    tensor. It is deterministic - a tracemalloc measurement wobbles by kilobytes from
    build to build, which would make the minimum budget wobble - and within a factor of
    about 1.5 of what tracemalloc sees (C++ tensor structs are not Python objects).
    """
    def size(obj: object) -> int:
        # a dict's allocation depends on its insertion history: size a fresh one
        return sys.getsizeof(dict.fromkeys(obj)) if isinstance(obj, dict) else sys.getsizeof(obj)

    model = build_skeleton(manifest)
    total = 0
    for module in model.modules():
        total += sys.getsizeof(module) + size(module.__dict__)
        total += sum(size(v) for v in module.__dict__.values())
        for t in (*module._parameters.values(), *module._buffers.values()):
            if t is not None:
                total += sys.getsizeof(t)
    return total


@dataclass(frozen=True)
class Reserve:
    """The memory besides the two blocks in flight (SwapNet's ``delta * B``)."""

    skeleton: int
    activations: int
    tables: int
    resident: int  # tied/shared weights kept in memory for the whole inference

    @property
    def total(self) -> int:
        return self.skeleton + self.activations + self.tables + self.resident

    def to_dict(self) -> dict[str, int]:
        return {
            "skeleton_bytes": self.skeleton,
            "activation_bytes": self.activations,
            "table_bytes": self.tables,
            "resident_bytes": self.resident,
            "total_bytes": self.total,
        }


# --- one model's plan ------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """How to run one model within ``budget``: the engine configuration and why."""

    budget: int
    pipeline: str  # "preload" when the whole model fits, else "async" with blocks
    engine_budget: int | None  # weight budget passed to the engine
    capacity: int  # W = B - reserve: what two adjacent blocks may occupy
    choice: Choice
    reserve: Reserve
    paper_blocks: int  # n = ceil(2 s / b) of the paper
    lookup_s: float = 0.0

    @property
    def points(self) -> tuple[int, ...]:
        return self.choice.points

    @property
    def delta(self) -> float:
        return self.reserve.total / self.budget if self.budget else 0.0

    def engine_config(self, base: EngineConfig | None = None) -> EngineConfig:
        """The engine config that runs this decision: ``base`` (default settings if None)
        with its weight budget, pipeline and block points."""
        budget = None if self.engine_budget is None else Budget(nbytes=self.engine_budget)
        return (base or EngineConfig()).replace(budget=budget, pipeline=self.pipeline, units=tuple(self.points))

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget_bytes": self.budget,
            "pipeline": self.pipeline,
            "engine_budget_bytes": self.engine_budget,
            "capacity_bytes": self.capacity,
            "delta": self.delta,
            "reserve": self.reserve.to_dict(),
            "paper_blocks": self.paper_blocks,
            "lookup_s": self.lookup_s,
            **self.choice.to_dict(),
        }


@dataclass
class SwapNetPlan:
    """Costs, reserve and lookup tables of one prepared model on one device."""

    directory: Path
    manifest: Manifest
    costs: LayerCosts
    tables: PartitionTables
    reserve: Reserve
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        directory: str | Path,
        profile: DeviceProfile,
        *,
        rows_per_table: int = 5000,
        anchors: int = 6,
    ) -> SwapNetPlan:
        """Prepare the model's tables (the paper's preparation stage)."""
        directory = Path(directory)
        manifest = read_manifest(directory)
        costs = layer_costs(manifest, profile)
        t0 = time.perf_counter()
        acts = activation_bytes(manifest.graph)
        skel = skeleton_bytes(manifest)
        reserve_s = time.perf_counter() - t0
        min_cap = min_capacity(costs)
        tables = PartitionTables.build(costs, min_capacity=min_cap, rows_per_table=rows_per_table, anchors=anchors)
        reserve = Reserve(skel, acts, tables.nbytes, manifest.resident_bytes)
        return cls(directory, manifest, costs, tables, reserve, {"reserve_s": reserve_s})

    @property
    def name(self) -> str:
        return str(self.manifest.model["name"])

    @property
    def demand(self) -> int:
        """Memory to run with every weight resident: all weights plus the reserve."""
        return self.costs.total_bytes + self.reserve.total

    @property
    def minimum_budget(self) -> int:
        """Smallest budget that runs: two adjacent blocks in flight plus the reserve."""
        if self.costs.layers < 2:
            return self.demand
        return min(self.demand, min_capacity(self.costs) + self.reserve.total)

    def capacity(self, budget: int) -> int:
        return max(budget - self.reserve.total, 0) // ALIGN * ALIGN

    def _refuse(self, budget: int) -> PartitionError:
        costs = self.costs
        s = costs.nbytes
        r = self.reserve
        reserve = (
            f"reserve {format_bytes(r.total)} (skeleton {format_bytes(r.skeleton)}, activations "
            f"{format_bytes(r.activations)}, tables {format_bytes(r.tables)}, resident weights "
            f"{format_bytes(r.resident)})"
        )
        if costs.layers < 2:
            layer = costs.names[0] if costs.names else "<model>"
            msg = (
                f"budget {format_bytes(budget)} cannot run {self.name}: its single layer {layer!r} "
                f"({format_bytes(int(s[0]))}) plus the {reserve} needs {format_bytes(self.minimum_budget)} "
                f"({self.minimum_budget} bytes); raise the budget to at least that"
            )
            return PartitionError(msg, layer=layer, minimum_budget=self.minimum_budget)
        pair = int(np.argmax(s[:-1] + s[1:]))
        big = pair if s[pair] >= s[pair + 1] else pair + 1
        other = pair + 1 if big == pair else pair
        layer = costs.names[big]
        msg = (
            f"budget {format_bytes(budget)} is below the minimum for {self.name} in SwapNet mode: "
            f"layer {layer!r} ({format_bytes(int(s[big]))}) must be in memory together with the "
            f"adjacent layer {costs.names[other]!r} ({format_bytes(int(s[other]))}) because two blocks "
            f"are in flight, plus the {reserve}; the minimum budget is "
            f"{format_bytes(self.minimum_budget)} ({self.minimum_budget} bytes)"
        )
        return PartitionError(msg, layer=layer, minimum_budget=self.minimum_budget)

    def choose(self, budget: int | str) -> Decision:
        """The configuration for ``budget``, from the lookup tables (PartitionError if none)."""
        t0 = time.perf_counter()
        b = parse_bytes(budget)
        r = self.reserve
        total = self.costs.total_bytes
        if b >= self.demand:
            choice = Choice((), total, self.costs.direct_s, "fits")
            return Decision(b, "preload", None, self.capacity(b), choice, r, 1, time.perf_counter() - t0)
        if b < self.minimum_budget:
            raise self._refuse(b)
        cap = self.capacity(b)
        choice = self.tables.lookup(self.costs, cap)
        if choice is None:  # only without anchors: fall back to the exact optimum
            choice = optimal_partition(self.costs, cap)
            if choice is None:
                raise self._refuse(b)
        paper_n = max(2, math.ceil(2 * total / max(cap, 1)))
        engine_budget = r.resident + cap
        return Decision(b, "async", engine_budget, cap, choice, r, paper_n, time.perf_counter() - t0)

    def optimal(self, budget: int | str) -> Choice | None:
        """The exact optimum (dynamic program) for ``budget``; None if the model fits."""
        b = parse_bytes(budget)
        if b >= self.demand:
            return None
        if b < self.minimum_budget:
            raise self._refuse(b)
        return optimal_partition(self.costs, self.capacity(b))

    def summary(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "directory": str(self.directory),
            "layers": self.costs.layers,
            "weights_bytes": self.costs.total_bytes,
            "demand_bytes": self.demand,
            "minimum_budget_bytes": self.minimum_budget,
            "exec_source": self.costs.exec_source,
            "predicted_direct_s": self.costs.direct_s,
            "reserve": self.reserve.to_dict(),
            "tables": self.tables.summary(),
            "tables_build_s": self.tables.build_s,
        }


def min_capacity(costs: LayerCosts) -> int:
    """Smallest ``W`` with a feasible partition: the largest adjacent pair of layers."""
    s = costs.nbytes
    if len(s) < 2:
        return int(s.sum())
    return int((s[:-1] + s[1:]).max())
