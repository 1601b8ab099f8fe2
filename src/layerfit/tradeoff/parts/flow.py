"""Minimum edge-buffer sizes and a phase schedule for processing by parts.

The paper converts a CNN partition to a cyclo-static dataflow graph and asks SDF3 for
the minimum buffer sizes and a schedule (Section 2.5, Algorithm 2 lines 31-32). We
compute the same quantities directly, by simulating a *demand-driven* schedule at the
granularity of rows:

1. A :class:`FlowGraph` lists the layers of one partition in topological order. Each
   layer produces one tensor of ``rows`` rows and reads its inputs through
   :class:`~layerfit.tradeoff.parts.rows.RowMap`\\ s.
2. A layer that processes by parts runs ``ceil(rows / phase_rows)`` phases, each
   producing the next ``phase_rows`` rows (the paper's ``Phi_i = H``: one row per
   phase). Any other layer runs one phase producing all its rows, so it needs every
   row of its inputs at once.
3. Layers are visited in the partition's order. A whole layer is run when reached,
   after *pulling* the rows it needs: pulling row ``r`` of a tensor runs the next
   phase of its producer until row ``r`` exists, recursively pulling the rows that
   phase reads. A by-parts layer is run only when a consumer pulls it (or, if nothing
   inside the partition reads it, when it is reached). Rows are produced as late as
   possible and released as soon as no consumer's next phase can read them.
4. The buffer of a tensor must hold the contiguous window from the oldest row a
   consumer may still read to the newest row produced; its size is the maximum of
   that window over the schedule. Each per-consumer window is recorded too (the
   paper's per-edge buffers).

Producing late and releasing early makes every window the smallest any valid
schedule can achieve for a chain (including skip connections inside it); the tests
check this against an exhaustive search over all interleavings of phases on small
graphs. The schedule is also what the engine runs (:mod:`layerfit.engine.stripes`, given
it by :mod:`layerfit.tradeoff.parts.executor`), so the sizes computed here are the
buffers it allocates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from layerfit.engine.stripes import Slot, release_point, slot_reads
from layerfit.tradeoff.parts.rows import RowMap


@dataclass(frozen=True)
class FlowNode:
    """One layer of a partition as the row analysis sees it.

    ``inputs`` are indices of earlier nodes, ``maps[k]`` says how input ``k`` is read.
    ``rows`` is the output height (1 for tensors without a height, e.g. FC outputs).
    ``tileable`` is false for layers that cannot process data by parts (global pooling,
    fully connected, flatten, anything with a full-height receptive field); such layers
    always run whole.
    """

    name: str
    inputs: tuple[int, ...]
    maps: tuple[RowMap, ...]
    rows: int
    tileable: bool

    def __post_init__(self) -> None:
        if len(self.inputs) != len(self.maps):
            raise ValueError(f"node {self.name!r}: {len(self.inputs)} inputs, {len(self.maps)} maps")
        if self.rows < 1:
            raise ValueError(f"node {self.name!r}: rows must be >= 1")


@dataclass(frozen=True)
class FlowGraph:
    """Layers of one partition in topological order.

    ``outputs`` are nodes whose tensors leave the partition (to another partition or
    as results); they are stored whole outside the analysed buffers. ``order`` is the
    order in which whole layers are visited (the partition's schedule); by default the
    node order.
    """

    nodes: tuple[FlowNode, ...]
    outputs: tuple[int, ...]
    order: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for i, node in enumerate(self.nodes):
            for j in node.inputs:
                if not 0 <= j < i:
                    raise ValueError(f"node {node.name!r} reads node {j}, not an earlier node")
        if self.order is not None and sorted(self.order) != list(range(len(self.nodes))):
            raise ValueError("order must be a permutation of the node indices")


@dataclass(frozen=True)
class RowPlan:
    """The schedule and minimum buffers of one partition under one choice of by-parts layers.

    ``steps[k] = (node, first_row, last_row)``: step ``k`` runs the phase of ``node`` that
    produces those rows. ``buffer_rows[n]`` is the minimum size (in rows) of the buffer
    holding node ``n``'s tensor for the consumers inside the partition (0 when none);
    ``edge_rows[(n, c)]`` the same for the single edge from ``n`` to consumer ``c``.
    ``first_step``/``last_step`` bound the phases of each node and ``last_read`` is the
    last step at which a consumer reads its tensor (-1 when none does); ``phases`` the
    number of phases each node runs (the paper's ``Phi``). ``slots`` and ``readers`` are
    the simulation's tables of reads, which the executor runs on too.
    """

    graph: FlowGraph
    by_parts: tuple[bool, ...]
    phase_rows: int
    steps: tuple[tuple[int, int, int], ...]
    buffer_rows: tuple[int, ...]
    edge_rows: dict[tuple[int, int], int] = field(repr=False)
    first_step: tuple[int, ...] = field(repr=False)
    last_step: tuple[int, ...] = field(repr=False)
    last_read: tuple[int, ...] = field(repr=False)
    phases: tuple[int, ...] = field(repr=False, default=())
    # what each node's phase reads (:data:`Slot` per input) and who reads each node
    slots: tuple[tuple[Slot, ...], ...] = field(repr=False, default=())
    readers: tuple[tuple[tuple[int, Slot], ...], ...] = field(repr=False, default=())


def phase_range(node: FlowNode, by_parts: bool, phase_rows: int, k: int) -> tuple[int, int]:
    """Output rows ``[a, b]`` produced by phase ``k`` of ``node``."""
    if not by_parts:
        return 0, node.rows - 1
    a = k * phase_rows
    return a, min(a + phase_rows, node.rows) - 1


def effective_parts(graph: FlowGraph, parts: Sequence[bool]) -> tuple[bool, ...]:
    """``parts`` restricted to tileable nodes (others always run whole)."""
    if len(parts) != len(graph.nodes):
        raise ValueError(f"{len(parts)} by-parts flags for {len(graph.nodes)} nodes")
    return tuple(bool(p) and n.tileable for p, n in zip(parts, graph.nodes, strict=True))


def read_slots(graph: FlowGraph, by_parts: Sequence[bool]) -> list[list[Slot]]:
    """For each node, how its phases read each of its inputs."""
    return [
        [m.slot(i, by_parts[n]) for i, m in zip(node.inputs, node.maps, strict=True)]
        for n, node in enumerate(graph.nodes)
    ]


def needed_rows(
    graph: FlowGraph, slots: Sequence[Sequence[Slot]], by_parts: Sequence[bool], phase_rows: int
) -> list[tuple[int, int] | None]:
    """For each node, the range of its rows that the outputs depend on (None: none).

    A backward pass from the outputs: a node whose rows nobody reads (e.g. a branch
    that only feeds padding) is never run.
    """
    nodes = graph.nodes
    needed: list[tuple[int, int] | None] = [None] * len(nodes)
    for o in graph.outputs:
        needed[o] = (0, nodes[o].rows - 1)
    for n in range(len(nodes) - 1, -1, -1):
        rng = needed[n]
        if rng is None:
            continue
        a = phase_range(nodes[n], by_parts[n], phase_rows, rng[0] // phase_rows)[0]
        b = phase_range(nodes[n], by_parts[n], phase_rows, rng[1] // phase_rows)[1]
        for slot in slots[n]:
            lo, hi = slot_reads(slot, a, b)
            if lo > hi:
                continue
            i = slot[0]
            old = needed[i]
            needed[i] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
    return needed


def plan_rows(graph: FlowGraph, parts: Sequence[bool], phase_rows: int = 1) -> RowPlan:
    """Simulate the demand-driven schedule and return its steps and minimum buffers."""
    if phase_rows < 1:
        raise ValueError("phase_rows must be >= 1")
    by_parts = effective_parts(graph, parts)
    simulation = _Simulation(graph, by_parts, phase_rows)
    needed = needed_rows(graph, simulation.slots, by_parts, phase_rows)
    order = graph.order if graph.order is not None else range(len(graph.nodes))
    for n in order:
        if needed[n] is not None and (not by_parts[n] or not simulation.readers[n]):
            simulation.pull(n, needed[n][1])
    for n in graph.outputs:
        simulation.pull(n, graph.nodes[n].rows - 1)
    return simulation.plan()


class _Simulation:
    """The state of :func:`plan_rows`' simulation: what each node has produced, the
    widest window of each tensor (and of each edge), and the steps so far. The state is
    bound to locals in the loops: the genetic search plans thousands of partitions.
    """

    def __init__(self, graph: FlowGraph, by_parts: tuple[bool, ...], phase_rows: int) -> None:
        nodes = graph.nodes
        count = len(nodes)
        self.graph = graph
        self.by_parts = by_parts
        self.phase_rows = phase_rows
        self.rows = [node.rows for node in nodes]
        self.produced = [0] * count
        self.next_phase = [0] * count
        self.window = [0] * count
        self.edge_window: dict[tuple[int, int], int] = {}
        self.first_step = [-1] * count
        self.last_step = [-1] * count
        self.last_read = [-1] * count
        self.steps: list[tuple[int, int, int]] = []
        self.slots = read_slots(graph, by_parts)
        self.readers: list[list[tuple[int, Slot]]] = [[] for _ in nodes]
        for c in range(count):
            for slot in self.slots[c]:
                self.readers[slot[0]].append((c, slot))

    def execute(self, n: int, a: int, b: int) -> None:
        """Run the phase of node ``n`` producing rows ``a..b`` and grow its windows."""
        produced, rows, edge_window = self.produced, self.rows, self.edge_window
        step = len(self.steps)
        self.steps.append((n, a, b))
        if self.first_step[n] < 0:
            self.first_step[n] = step
        self.last_step[n] = step
        last_read = self.last_read
        for slot in self.slots[n]:
            lo, hi = slot_reads(slot, a, b)
            if lo <= hi:
                last_read[slot[0]] = step
        done = b + 1
        produced[n] = done
        self.next_phase[n] += 1
        # The window of n grows only now; measure it against its consumers' positions.
        oldest_all = done
        for c, slot in self.readers[n]:
            oldest = release_point(slot, produced[c], rows[c])
            if oldest < oldest_all:
                oldest_all = oldest
            key = (n, c)
            span = done - (oldest if oldest < done else done)
            if span > edge_window.get(key, 0):
                edge_window[key] = span
        if done - oldest_all > self.window[n]:
            self.window[n] = done - oldest_all

    def pull(self, target: int, row: int) -> None:
        """Run phases, inputs first, until row ``row`` of ``target`` exists."""
        produced, rows, next_phase, slots = self.produced, self.rows, self.next_phase, self.slots
        by_parts, phase_rows = self.by_parts, self.phase_rows
        stack = [(target, row)]
        while stack:
            n, r = stack[-1]
            if produced[n] > r:
                stack.pop()
                continue
            if by_parts[n]:
                a = next_phase[n] * phase_rows
                b = min(a + phase_rows, rows[n]) - 1
            else:
                a, b = 0, rows[n] - 1
            for slot in slots[n]:
                lo, hi = slot_reads(slot, a, b)
                if lo <= hi and produced[slot[0]] <= hi:
                    stack.append((slot[0], hi))
                    break
            else:
                self.execute(n, a, b)

    def plan(self) -> RowPlan:
        """The schedule simulated so far, with the minimum buffers it needs."""
        count = len(self.rows)
        return RowPlan(
            graph=self.graph,
            by_parts=self.by_parts,
            phase_rows=self.phase_rows,
            steps=tuple(self.steps),
            buffer_rows=tuple(self.window[n] if self.readers[n] else 0 for n in range(count)),
            edge_rows=self.edge_window,
            first_step=tuple(self.first_step),
            last_step=tuple(self.last_step),
            last_read=tuple(self.last_read),
            phases=tuple(self.next_phase),
            slots=tuple(tuple(s) for s in self.slots),
            readers=tuple(tuple(r) for r in self.readers),
        )

