"""The CNN-based application model of Minakova & Stefanov (Sections 2.3-2.4).

An application is ``({CNN^1..CNN^N}, B, P, J, {schedule_1..schedule_|P|})``:

* ``CNN^n`` — networks as layer lists (:class:`~layerfit.tradeoff.parts.cnn.CNN`);
* ``P`` — partitions, each a contiguous range of one CNN's layers;
* ``J`` — sets of partitions that run in parallel (pipeline stages, or CNNs on
  different processors). The partitions of a CNN split in several must all be pipeline
  stages of one another;
* ``schedule_m`` — steps of partition ``m``; each step runs one or more layers (the
  default: one layer per step, in order);
* ``B`` — buffers, each storing one or more edges (Algorithm 1 decides which).

Edges carry data between layers. With ``fanout="edge"`` every (producer, consumer)
pair is an edge of its own, exactly as the paper's Table 1 counts them; with
``fanout="tensor"`` (default) the data a layer produces is one edge read by all its
consumers, and CNN outputs are edges too, as in tensor-based memory planners. Data
crossing from one pipeline stage to another is *double buffered*: one copy in the
producing partition (live until the end of its schedule) and one in each consuming
partition (live from its first step), as the paper's ``e^(1)``/``e^(2)``.

The memory cost is Eq. 1-4: ``M = M^par + M^buf``, ``M^par = sum |par_ik| * par_bytes``,
``M^buf = sum B_k.size * data_bytes`` with ``B_k.size = max |e.data|`` over its edges.
:meth:`Application.derive` applies a chromosome (which layers process by parts) to
give the reduced edges, schedules and phases (Algorithm 2's
``DeriveApplicationWithReducedBufs``) and their buffers after Algorithm 1.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from layerfit.errors import TradeoffError
from layerfit.tradeoff.parts.cnn import CNN
from layerfit.tradeoff.parts.flow import RowPlan, plan_rows
from layerfit.tradeoff.parts.reuse import (
    ReuseOrder,
    SharedBuffer,
    naive_buffers,
    reuse_buffers,
    total_elems,
)

Precision = Literal["fp32", "fp16"]
BYTES_PER_ELEMENT: dict[str, int] = {"fp32": 4, "fp16": 2}
Fanout = Literal["tensor", "edge"]


@dataclass(frozen=True)
class Partition:
    """Layers ``[start, stop)`` of CNN ``cnn``, executed by one processor."""

    name: str
    cnn: str
    start: int
    stop: int

    def __contains__(self, layer: int) -> bool:
        return self.start <= layer < self.stop


@dataclass(frozen=True)
class AppEdge:
    """An edge (or a copy of one) stored in the buffers of one partition.

    ``copy`` is 0 for an edge inside one partition, 1 for the producer-side copy of data
    crossing to another pipeline stage and 2 for a consumer-side copy. ``elems`` is the
    buffer size the edge needs (reduced when its layers process by parts);
    ``full_elems`` is ``|e.data|``. ``start``/``end`` are the first and last steps of
    the partition's schedule in which the edge holds data.
    """

    cnn: str
    producer: str
    consumers: tuple[str, ...]
    partition: str
    copy: int
    elems: int
    full_elems: int
    start: int
    end: int

    @property
    def label(self) -> str:
        target = ",".join(self.consumers) if self.consumers else "out"
        suffix = f"({self.copy})" if self.copy else ""
        return f"{self.cnn}:{self.producer}->{target}{suffix}"


@dataclass(frozen=True)
class MemoryCost:
    """Eq. 1: ``M = M^par + M^buf``, in bytes."""

    params: int
    buffers: int

    @property
    def total(self) -> int:
        return self.params + self.buffers


@dataclass
class PartitionPlan:
    """A partition's schedule after choosing which layers process by parts, and its edges.

    ``steps`` lists the layers run at each step (a by-parts layer appears once per
    phase); ``phases`` is ``Phi`` per layer; ``first``/``last`` are the first and last
    step of each layer (by global layer index) and ``read_end`` the last step its data is
    read inside the partition (-1: never); ``row_plan`` is the row-level analysis (None
    when no layer of the partition processes by parts).
    """

    partition: Partition
    steps: tuple[tuple[str, ...], ...]
    phases: dict[str, int]
    first: dict[int, int]
    last: dict[int, int]
    read_end: dict[int, int]
    row_plan: RowPlan | None
    edges: tuple[AppEdge, ...] = ()

    @property
    def end(self) -> int:
        """The partition's last step."""
        return len(self.steps) - 1


@dataclass
class DerivedApplication:
    """An application with a chromosome applied: edges, schedules, phases and buffers."""

    app: Application
    bits: tuple[bool, ...]
    plans: dict[str, PartitionPlan]
    edges: list[AppEdge]
    buffers: list[SharedBuffer] = field(default_factory=list)

    @property
    def phases(self) -> dict[tuple[str, str], int]:
        """``Phi``: phases of every layer, keyed by (cnn, layer)."""
        return {(plan.partition.cnn, name): k for plan in self.plans.values() for name, k in plan.phases.items()}

    def memory(self, precision: Precision | None = None) -> MemoryCost:
        """Eq. 1-4 for this application's buffers at ``precision`` (default: the app's)."""
        size = BYTES_PER_ELEMENT[precision or self.app.precision]
        return MemoryCost(self.app.param_bytes(precision), total_elems(self.buffers) * size)


class Application:
    """One or more CNNs, their partitions, parallel sets and schedules (Section 2.3)."""

    def __init__(
        self,
        cnns: Sequence[CNN],
        partitions: Sequence[Partition] | None = None,
        parallel: Iterable[Iterable[str]] | None = None,
        schedules: Mapping[str, Sequence[Sequence[str]]] | None = None,
        precision: Precision = "fp32",
        fanout: Fanout = "tensor",
        name: str = "application",
    ) -> None:
        if not cnns:
            raise TradeoffError("an application needs at least one CNN")
        if precision not in BYTES_PER_ELEMENT:
            raise TradeoffError(f"precision: expected one of {sorted(BYTES_PER_ELEMENT)}, got {precision!r}")
        if fanout not in ("tensor", "edge"):
            raise TradeoffError(f"fanout: expected 'tensor' or 'edge', got {fanout!r}")
        self.name = name
        self.cnns = tuple(cnns)
        self.precision: Precision = precision
        self.fanout: Fanout = fanout
        self._cnn = {cnn.name: cnn for cnn in self.cnns}
        if len(self._cnn) < len(self.cnns):
            names = [cnn.name for cnn in self.cnns]
            raise TradeoffError(f"two CNNs are named {next(n for n in names if names.count(n) > 1)!r}")
        if partitions is None:
            partitions = [Partition(f"{c.name}.p0", c.name, 0, len(c.layers)) for c in self.cnns]
        self.partitions = tuple(partitions)
        self._check_partitions()
        if parallel is None:
            parallel = [[p.name for p in ps] for c in self.cnns if len(ps := self.partitions_of(c.name)) > 1]
        self.parallel = tuple(frozenset(j) for j in parallel)
        self._check_parallel()
        unknown = set(schedules or {}) - {p.name for p in self.partitions}
        if unknown:
            raise TradeoffError(f"schedules: unknown partition(s) {sorted(unknown)}")
        self.schedules = {p.name: self._schedule(p, (schedules or {}).get(p.name)) for p in self.partitions}
        counts = [len(cnn.layers) for cnn in self.cnns]
        self.offsets = dict(zip(self._cnn, itertools.accumulate(counts, initial=0), strict=False))
        self.n_layers = sum(counts)
        # a partition's plan per choice of its layers by parts (the search meets each often)
        self._plan = functools.lru_cache(maxsize=4096)(self._plan_partition)

    # --- structure ---------------------------------------------------------------------

    def cnn(self, name: str) -> CNN:
        try:
            return self._cnn[name]
        except KeyError:
            raise TradeoffError(f"no CNN named {name!r} (have {sorted(self._cnn)})") from None

    def partitions_of(self, cnn: str) -> list[Partition]:
        return [p for p in self.partitions if p.cnn == cnn]

    def is_parallel(self, a: str, b: str) -> bool:
        """Do partitions ``a`` and ``b`` run in parallel (some ``J_r`` holds both)?"""
        return a != b and any(a in j and b in j for j in self.parallel)

    def tileable_mask(self) -> list[bool]:
        """Per gene of the chromosome: can that layer process by parts?"""
        return [cnn.tileable(i) for cnn in self.cnns for i in range(len(cnn.layers))]

    def layer_names(self) -> list[str]:
        """``cnn:layer`` for every gene of the chromosome, in order."""
        return [f"{cnn.name}:{layer.name}" for cnn in self.cnns for layer in cnn.layers]

    def param_bytes(self, precision: Precision | None = None) -> int:
        """Eq. 2: parameters of every layer of every CNN times ``par_bytes``."""
        return sum(c.param_count for c in self.cnns) * BYTES_PER_ELEMENT[precision or self.precision]

    def _check_partitions(self) -> None:
        names = [p.name for p in self.partitions]
        for p in self.partitions:
            if p.cnn not in self._cnn:
                raise TradeoffError(f"partition {p.name!r}: unknown CNN {p.cnn!r}")
            if names.count(p.name) > 1:
                raise TradeoffError(f"two partitions are named {p.name!r}")
        for cnn in self.cnns:
            expect = 0
            for p in sorted(self.partitions_of(cnn.name), key=lambda p: p.start):
                if p.start != expect or p.stop <= p.start:
                    raise TradeoffError(
                        f"partitions of {cnn.name!r}: {p.name!r} covers layers [{p.start}, {p.stop}) "
                        f"but the next partition must start at layer {expect} and be non-empty"
                    )
                expect = p.stop
            if expect != len(cnn.layers):
                raise TradeoffError(f"partitions of {cnn.name!r} cover layers [0, {expect}) of {len(cnn.layers)}")

    def _check_parallel(self) -> None:
        known = {p.name for p in self.partitions}
        for k, j in enumerate(self.parallel):
            if j - known:
                raise TradeoffError(f"parallel[{k}]: unknown partition(s) {sorted(j - known)} (have {sorted(known)})")
        for cnn in self.cnns:
            parts = self.partitions_of(cnn.name)
            for a, b in itertools.combinations(parts, 2):
                if not self.is_parallel(a.name, b.name):
                    raise TradeoffError(
                        f"parallel: partitions {a.name!r} and {b.name!r} of {cnn.name!r} must be "
                        "pipeline stages of one another (list them in one parallel set)"
                    )

    def _schedule(self, p: Partition, steps: Sequence[Sequence[str]] | None) -> tuple[tuple[int, ...], ...]:
        """Steps of layer indices; checks the schedule covers the partition in dependency order."""
        cnn = self.cnn(p.cnn)
        if steps is None:
            return tuple((i,) for i in range(p.start, p.stop))
        where = f"schedules[{p.name}]"
        seen: dict[int, int] = {}
        result = []
        for k, step in enumerate(steps):
            if isinstance(step, str):
                step = [step]
            indices = []
            for name in step:
                i = cnn.index(name)
                if i not in p:
                    raise TradeoffError(f"{where}[{k}]: layer {name!r} is not in partition {p.name!r}")
                if i in seen:
                    raise TradeoffError(f"{where}[{k}]: layer {name!r} is scheduled twice")
                indices.append(i)
            for i in indices:
                for j in cnn.layers[i].inputs:
                    if j in p and seen.get(j, k) >= k:
                        raise TradeoffError(
                            f"{where}[{k}]: layer {cnn.layers[i].name!r} runs before or with its input "
                            f"{cnn.layers[j].name!r}"
                        )
            for i in indices:
                seen[i] = k
            result.append(tuple(indices))
        missing = [cnn.layers[i].name for i in range(p.start, p.stop) if i not in seen]
        if missing:
            raise TradeoffError(f"{where}: layers {missing} are not scheduled")
        return tuple(result)

    # --- derivation --------------------------------------------------------------------

    def bits_of(self, bits: Sequence[bool] | None) -> tuple[bool, ...]:
        """A full chromosome (``None`` = no layer by parts), untileable genes cleared."""
        if bits is None:
            return (False,) * self.n_layers
        if len(bits) != self.n_layers:
            raise TradeoffError(f"chromosome has {len(bits)} genes, the application {self.n_layers} layers")
        mask = self.tileable_mask()
        return tuple(bool(b) and m for b, m in zip(bits, mask, strict=True))

    def derive(
        self,
        bits: Sequence[bool] | None = None,
        reuse: bool = True,
        order: ReuseOrder = "best",
        phase_rows: int = 1,
    ) -> DerivedApplication:
        """Apply chromosome ``bits`` and (unless ``reuse=False``) Algorithm 1.

        ``reuse=False`` gives the naive allocation (every edge its own buffer), which
        with all layers by parts is the earlier methodology [17].
        """
        chromosome = self.bits_of(bits)
        plans = {}
        for p in self.partitions:
            offset = self.offsets[p.cnn]
            plans[p.name] = self._plan(p, chromosome[offset + p.start : offset + p.stop], phase_rows)
        edges = [edge for plan in plans.values() for edge in plan.edges]
        buffers = reuse_buffers(edges, self.is_parallel, order) if reuse else naive_buffers(edges)
        return DerivedApplication(self, chromosome, plans, edges, buffers)

    def _plan_partition(self, p: Partition, parts: tuple[bool, ...], phase_rows: int) -> PartitionPlan:
        return _PartitionPlanner(self, p).plan(parts, phase_rows)


class _PartitionPlanner:
    """Schedule and edges of one partition under one choice of by-parts layers.

    The partition is a stage of its CNN holding the graph's inputs in it: ``ext`` are the
    layers of earlier partitions read inside this one (their data arrives as
    consumer-side copies); ``members`` lists them first, then the partition's layers,
    which is the order of the row analysis' nodes (``local``).
    """

    def __init__(self, app: Application, p: Partition) -> None:
        self.app = app
        self.p = p
        self.cnn = cnn = app.cnn(p.cnn)
        self.consumers = cnn.consumers()
        self.inside = range(p.start, p.stop)
        self.stage = cnn.stage(p.start, p.stop, graph_inputs_outside=False)
        self.ext = list(self.stage.inputs)
        self.members = list(self.stage.members)
        self.local = {g: k for k, g in enumerate(self.members)}
        self.names = [layer.name for layer in cnn.layers]

    def plan(self, parts: tuple[bool, ...], phase_rows: int) -> PartitionPlan:
        plan = self._by_rows(parts, phase_rows) if any(parts) else self._by_steps()
        plan.edges = tuple(self._incoming(plan) + self._produced(plan))
        return plan

    def _by_steps(self) -> PartitionPlan:
        """The partition's own schedule: every layer whole, at its step."""
        cnn, p = self.cnn, self.p
        schedule = self.app.schedules[p.name]
        step_of = {i: k for k, step in enumerate(schedule) for i in step}
        read_end = {i: max((step_of[c] for c in self.consumers[i] if c in p), default=-1) for i in self.members}
        return PartitionPlan(
            partition=p,
            steps=tuple(tuple(cnn.layers[i].name for i in step) for step in schedule),
            phases={cnn.layers[i].name: 1 for i in self.inside},
            first=dict(step_of),
            last=dict(step_of),
            read_end=read_end,
            row_plan=None,
        )

    def _by_rows(self, parts: tuple[bool, ...], phase_rows: int) -> PartitionPlan:
        """The row analysis' schedule: a by-parts layer runs once per phase."""
        cnn, local, members = self.cnn, self.local, self.members
        schedule = self.app.schedules[self.p.name]
        order = tuple(range(len(self.ext))) + tuple(local[i] for step in schedule for i in step)
        graph = cnn.flow_graph(self.stage, order)
        row_plan = plan_rows(graph, (False,) * len(self.ext) + parts, phase_rows)
        counts = row_plan.phases
        return PartitionPlan(
            partition=self.p,
            steps=tuple((cnn.layers[members[n]].name,) for n, _, _ in row_plan.steps),
            phases={cnn.layers[i].name: max(1, counts[local[i]]) for i in self.inside},
            first={members[n]: row_plan.first_step[n] for n in range(len(members))},
            last={members[n]: row_plan.last_step[n] for n in range(len(members))},
            read_end={members[n]: row_plan.last_read[n] for n in range(len(members))},
            row_plan=row_plan,
        )

    def _size(self, plan: PartitionPlan, i: int, consumer: int | None) -> int:
        """Elements the buffer of layer ``i``'s data needs (for one consumer, or all)."""
        layer = self.cnn.layers[i]
        row_plan = plan.row_plan
        if row_plan is None:
            return layer.elems
        n = self.local[i]
        if consumer is None:
            return row_plan.buffer_rows[n] * layer.row_elems
        return row_plan.edge_rows.get((n, self.local[consumer]), layer.rows) * layer.row_elems

    def _edge(
        self, producer: int, consumers: Iterable[int], copy: int, start: int, end: int, elems: int | None = None
    ) -> AppEdge:
        """An edge of layer ``producer``'s data to ``consumers`` (a copy: see :class:`AppEdge`),
        live over steps ``start..end``, needing ``elems`` (default: the whole data)."""
        names, full = self.names, self.cnn.layers[producer].elems
        readers = tuple(names[c] for c in consumers)
        size = full if elems is None else elems
        return AppEdge(self.p.cnn, names[producer], readers, self.p.name, copy, size, full, start, end)

    def _incoming(self, plan: PartitionPlan) -> list[AppEdge]:
        """Consumer-side copies of data produced by an earlier stage."""
        edges = []
        for g in self.ext:
            if not self.cnn.layers[g].elems:
                continue
            readers = [c for c in self.consumers[g] if c in self.p]
            if self.app.fanout == "tensor":
                edges.append(self._edge(g, readers, 2, 0, max(plan.read_end[g], 0)))
            else:
                edges += [self._edge(g, [c], 2, 0, max(plan.last[c], 0)) for c in readers]
        return edges

    def _produced(self, plan: PartitionPlan) -> list[AppEdge]:
        """The data the partition's layers produce: inside it, and producer-side copies of
        what crosses to another stage (or leaves the CNN)."""
        first, last, end = plan.first, plan.last, plan.end
        edges = []
        for i in self.inside:
            if not self.cnn.layers[i].elems or first.get(i, -1) < 0:
                continue
            consumers = self.consumers[i]
            readers = [c for c in consumers if c in self.p]
            crossing = len(readers) < len(consumers)  # read by a later stage
            if self.app.fanout == "edge":
                for c in readers:
                    edges.append(self._edge(i, [c], 0, first[i], max(last[c], first[i]), self._size(plan, i, c)))
                edges += [self._edge(i, [c], 1, first[i], end) for c in consumers if c not in self.p]
            elif crossing or not consumers:
                edges.append(self._edge(i, consumers, 1 if crossing else 0, first[i], end))
            else:
                end_read = max(plan.read_end[i], first[i])
                edges.append(self._edge(i, readers, 0, first[i], end_read, self._size(plan, i, None)))
        return edges


def split_partitions(
    cnn: CNN, count: int, prefix: str | None = None, weights: Sequence[float] | None = None
) -> list[Partition]:
    """Split ``cnn`` into ``count`` contiguous partitions of about equal weight.

    The weight of a layer is its MACs unless ``weights`` (e.g. measured seconds) is given.
    """
    n = len(cnn.layers)
    if not 1 <= count <= n:
        raise TradeoffError(f"cannot split {cnn.name!r} ({n} layers) into {count} partitions")
    if weights is not None and len(weights) != n:
        raise TradeoffError(f"{len(weights)} weights for {n} layers of {cnn.name!r}")
    weights = [max(layer.macs, 1) for layer in cnn.layers] if weights is None else [max(w, 1e-12) for w in weights]
    total = sum(weights)
    cuts = [0]
    acc = 0
    for i, w in enumerate(weights):
        acc += w
        if len(cuts) < count and acc >= total * len(cuts) / count and i + 1 < n and n - (i + 1) >= count - len(cuts):
            cuts.append(i + 1)
    while len(cuts) < count:  # degenerate weights: cut at the end
        cuts.append(cuts[-1] + 1)
    cuts.append(n)
    prefix = prefix or cnn.name
    return [Partition(f"{prefix}.p{k}", cnn.name, cuts[k], cuts[k + 1]) for k in range(count)]
