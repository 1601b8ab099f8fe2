"""Processing by parts, for real: run a network in horizontal row stripes.

:class:`PartsExecutor` runs a CNN captured from a module (or a contiguous range of its
layers, a pipeline stage) with the kernels of :mod:`~layerfit.tradeoff.parts.kernels`, following the schedule of :func:`~layerfit.tradeoff.parts.flow.plan_rows`.
A layer chosen to process by parts produces its output ``phase_rows`` rows at a time
(one row by default, Table 2) from the few input rows it needs, and the tensor between
two such layers lives in a :class:`RowBuffer` holding only the rows a consumer may
still read. A layer that cannot or need not be tiled runs whole on whole tensors.

The output equals running the module (same operators, same weights, same padding
semantics) within fp32 rounding: a stripe is computed by the same operator on fewer rows,
and PyTorch may then pick another kernel or blocking (oneDNN convolutions choose by
tensor height; vectorised transcendental activations round tail elements differently),
so sums can be ordered differently. Pooling, batch norm, ReLU-like activations and adds
are element-for-element the same; whole networks are often bit-exact when oneDNN is
disabled, never off by more than ``TOLERANCE``.

Memory is accounted in a ledger: every edge buffer (row buffers at capacity, whole
intermediate tensors at full size) counts from allocation until its last reader has
run. Graph inputs and outputs belong to the caller and are not counted; the transient
one-phase result and the padded stripes of border phases are not counted either.
With no layer by parts the ledger is the memory planner's tensor usage records, so
:func:`untiled_peak_bytes` reads its peak from them without a run.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from layerfit.errors import TradeoffError
from layerfit.memory.profiles import max_breadth
from layerfit.memory.records import TensorUsageRecord
from layerfit.tradeoff.parts.cnn import CNN, Layer
from layerfit.tradeoff.parts.flow import FlowGraph, RowPlan, plan_rows
from layerfit.tradeoff.parts.kernels import Runner, cnn_from_module, substitute
from layerfit.tradeoff.parts.rows import RowMap

# Agreement with the untiled module: |out - ref| <= rtol * |ref| + atol * max(1, max|ref|)
# with (rtol, atol) below. Observed: a few ulps per layer (<= 1.2e-7 on unit-scale random
# chains; 5e-6 to 2e-5 on MobileNet v2 / EfficientNet-B0 / ResNet-50 outputs of magnitude
# 4 to 13 at 224x224).
TOLERANCE = (1e-5, 1e-5)

PartsSpec = str | Sequence[bool] | Collection[str]


class RowBuffer:
    """A buffer of ``capacity`` rows holding a contiguous window of a tensor's rows.

    Rows are appended in order and released from the front; the window is kept
    contiguous in memory (shifted to the front when it reaches the end) so a consumer
    always receives a view, never a gathered copy.
    """

    def __init__(self, capacity: int, like: torch.Tensor) -> None:
        n, c, _, w = like.shape
        self.capacity = capacity
        self.storage = like.new_empty((n, c, capacity, w))
        self.lo = 0  # first row held
        self.hi = 0  # one past the last row written
        self.phys = 0  # storage row of row ``lo``
        self.keep_from = 0  # rows below this are released (and not stored when written)
        self.high_water = 0  # most rows ever held at once

    @property
    def nbytes(self) -> int:
        return self.storage.numel() * self.storage.element_size()

    def release(self, row: int) -> None:
        """Rows below ``row`` will not be read again."""
        if row <= self.keep_from:
            return
        self.keep_from = row
        new_lo = min(max(self.lo, row), self.hi)
        self.phys += new_lo - self.lo
        self.lo = new_lo
        if self.lo == self.hi:
            self.phys = 0

    def write(self, first: int, data: torch.Tensor) -> None:
        """Append rows ``first .. first + data.shape[2] - 1`` (``first`` is the next row)."""
        if first != self.hi:
            raise RuntimeError(f"rows must be written in order: expected row {self.hi}, got {first}")
        rows = data.shape[2]
        skip = self.keep_from - first
        if skip > 0:  # leading rows nobody reads: do not store them
            skip = min(skip, rows)
            self.hi += skip
            self.lo = max(self.lo, min(self.keep_from, self.hi))
            if self.lo == self.hi:
                self.phys = 0
            rows -= skip
            if rows == 0:
                return
            data = data.narrow(2, skip, rows)
        held = self.hi - self.lo
        if held + rows > self.capacity:
            raise RuntimeError(
                f"row buffer overflow: {held} rows held + {rows} new > capacity {self.capacity}"
            )
        if self.phys + held + rows > self.capacity:
            self._compact()
        self.storage.narrow(2, self.phys + held, rows).copy_(data)
        self.hi += rows
        if held + rows > self.high_water:
            self.high_water = held + rows

    def skip_to(self, row: int) -> None:
        """Rows below ``row`` were never produced because no consumer reads them."""
        if self.hi < row:  # then every held row is below the release point too
            self.release(row)
            self.lo = self.hi = row
            self.phys = 0

    def _compact(self) -> None:
        held, shift = self.hi - self.lo, self.phys
        for start in range(0, held, shift):  # chunks no longer than the shift never overlap
            stop = min(start + shift, held)
            self.storage[:, :, start:stop].copy_(self.storage[:, :, start + shift : stop + shift])
        self.phys = 0

    def view(self, lo: int, hi: int) -> torch.Tensor:
        """Rows ``lo..hi`` (inclusive) as a view; an empty view when ``lo > hi``."""
        if lo > hi:
            return self.storage[:, :, 0:0]
        if lo < self.lo or hi >= self.hi:
            raise RuntimeError(f"rows {lo}..{hi} not held (holding {self.lo}..{self.hi - 1})")
        return self.storage.narrow(2, self.phys + lo - self.lo, hi - lo + 1)


@dataclass
class RunStats:
    """What one run held and did: its ledger of edge buffers.

    ``live_bytes``: bytes of edge buffers alive now; ``peak_bytes``: the most alive at
    once; ``buffer_bytes``: bytes allocated per buffered tensor (row buffers at capacity,
    whole tensors at full size); ``high_water_rows``: most rows each row buffer held;
    ``node_seconds``: time spent in each node's phases (filled when profiling).
    """

    peak_bytes: int = 0
    buffer_bytes: dict[str, int] = field(default_factory=dict)
    high_water_rows: dict[str, int] = field(default_factory=dict)
    node_seconds: dict[str, float] = field(default_factory=dict)
    phases: int = 0
    live_bytes: int = 0

    def hold(self, name: str, nbytes: int) -> None:
        """The buffer of tensor ``name`` (``nbytes``) is allocated."""
        self.buffer_bytes[name] = nbytes
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def free(self, nbytes: int) -> None:
        self.live_bytes -= nbytes


def resolve_parts(cnn: CNN, parts: PartsSpec) -> list[bool]:
    """Per layer: should it process by parts? (``all``, ``none``, flags or layer names)."""
    tileable = [cnn.tileable(i) for i in range(len(cnn.layers))]
    if isinstance(parts, str):
        if parts not in ("all", "none"):
            raise TradeoffError(f"parts must be 'all', 'none', flags or layer names, got {parts!r}")
        return [parts == "all" and t for t in tileable]
    items = list(parts)
    if items and all(isinstance(p, bool) for p in items):
        if len(items) != len(tileable):
            raise TradeoffError(f"{len(items)} by-parts flags for {len(tileable)} layers")
        return [p and t for p, t in zip(items, tileable, strict=True)]
    names = set(items)
    unknown = names - {layer.name for layer in cnn.layers}
    if unknown:
        raise TradeoffError(f"unknown layer names {sorted(unknown)}")
    return [layer.name in names and t for layer, t in zip(cnn.layers, tileable, strict=True)]


def runner_of(cnn: CNN) -> Runner:
    """What runs ``cnn``; refused for a CNN given as a layer list."""
    if cnn.runner is None:
        raise TradeoffError(
            f"CNN {cnn.name!r} was given as a layer list, so it cannot be run: use the analytic "
            "throughput model (--model-throughput) or give it as a zoo model or a module"
        )
    return cnn.runner


@dataclass(frozen=True)
class Stage:
    """A contiguous range of a CNN's layers with the tensors crossing its boundary."""

    first: int
    stop: int
    inputs: tuple[int, ...]  # layers before ``first`` read inside the stage
    outputs: tuple[int, ...]  # layers of the stage read after it (or results)


def stage_of(cnn: CNN, first: int, stop: int) -> Stage:
    """The stage of layers ``[first, stop)``: which tensors enter and leave it."""
    count = len(cnn.layers)
    if not 0 <= first < stop <= count:
        raise TradeoffError(f"invalid layer range [{first}, {stop}) of {count} layers")
    ins: dict[int, None] = {}
    for n in range(first, stop):
        for i in cnn.inputs_of(n):
            if i < first:
                ins[i] = None
    if first == 0:
        for p, layer in enumerate(cnn.layers):
            if layer.op == "input":
                ins.setdefault(p, None)
    outs: dict[int, None] = {}
    for n in range(stop, count):
        for i in cnn.inputs_of(n):
            if first <= i < stop:
                outs[i] = None
    for o in runner_of(cnn).outputs:
        if first <= o < stop:
            outs[o] = None
    return Stage(first, stop, tuple(sorted(ins)), tuple(sorted(outs)))


def flow_graph_of(cnn: CNN, stage: Stage) -> tuple[FlowGraph, list[int]]:
    """The FlowGraph of a stage and, per flow node, the layer it stands for (the stage's
    inputs first: graph inputs, or the layers of earlier stages it reads)."""
    members = list(stage.inputs) + [n for n in range(stage.first, stage.stop) if n not in stage.inputs]
    return cnn.flow_graph(members, len(stage.inputs), stage.outputs), members


class PartsExecutor:
    """Runs a CNN captured from a module (or a stage of it) with the chosen layers
    processing by parts.

    ``parts`` selects the layers: ``"all"`` (every tileable layer), ``"none"`` (plain
    layer-by-layer execution, the untiled reference), per-node flags, or node names.
    ``phase_rows`` rows are produced per phase (1 reproduces the paper's minimum heights).
    """

    def __init__(
        self,
        cnn: CNN,
        parts: PartsSpec = "all",
        phase_rows: int = 1,
        stage: Stage | None = None,
    ) -> None:
        self.cnn = cnn
        self.runner = runner_of(cnn)
        self.stage = stage or stage_of(cnn, 0, len(cnn.layers))
        self.flow, self.members = flow_graph_of(cnn, self.stage)
        flags = resolve_parts(cnn, parts)
        self.plan: RowPlan = plan_rows(self.flow, [flags[t] for t in self.members], phase_rows)
        self._consumers = self.flow.consumers()
        self._is_output = [False] * len(self.members)
        for o in self.flow.outputs:
            self._is_output[o] = True
        self.last_stats = RunStats()
        self._build_tables()

    def _build_tables(self) -> None:
        """Per node, its inputs and whether the executor holds its tensor in a buffer (what
        a phase reads and who releases what are the plan's own tables)."""
        nodes = self.flow.nodes
        self._unique_inputs = [tuple(dict.fromkeys(node.inputs)) for node in nodes]
        self._keeps = [
            not self._external(k) and not self._is_output[k] and bool(self._consumers[k]) for k in range(len(nodes))
        ]

    @classmethod
    def from_module(
        cls, module: torch.nn.Module, example: torch.Tensor, parts: PartsSpec = "all", phase_rows: int = 1
    ) -> PartsExecutor:
        """Capture ``module`` at ``example``'s shape and build an executor for all of it."""
        return cls(cnn_from_module(type(module).__name__, module, example), parts, phase_rows)

    def node(self, k: int) -> Layer:
        """The layer flow node ``k`` stands for."""
        return self.cnn.layers[self.members[k]]

    def itemsize(self, k: int) -> int:
        """Bytes of one element of flow node ``k``'s tensor."""
        dtype = self.runner.kernels[self.members[k]].dtype
        return torch.empty((), dtype=dtype).element_size() if dtype is not None else 0

    def buffer_bytes(self) -> dict[str, int]:
        """Planned bytes per buffered tensor (row buffers at minimum size, whole tensors full)."""
        result = {}
        for k, flow_node in enumerate(self.flow.nodes):
            node = self.node(k)
            if self._external(k) or self._is_output[k] or not self._consumers[k] or not node.shape:
                continue
            rows = self.plan.buffer_rows[k] if self.plan.by_parts[k] else flow_node.rows
            result[node.name] = rows * flow_node.row_elems * self.itemsize(k)
        return result

    def _external(self, k: int) -> bool:
        return k < len(self.stage.inputs) or self.node(k).op == "input"

    def __call__(self, *inputs: Any, out: Sequence[torch.Tensor] | None = None) -> Any:
        return self.run(*inputs, out=out)

    @torch.no_grad()
    def run(self, *inputs: Any, out: Sequence[torch.Tensor] | None = None, profile: bool = False) -> Any:
        """Run on ``inputs`` (the stage's input tensors, in order) and return the result.

        For the whole module the result has the module's output structure; for a stage it
        is the tuple of the stage's output tensors. ``out`` optionally supplies tensors to
        write the stage outputs into (the pipeline's double buffers). ``profile`` records
        the seconds each node's phases take (``last_stats.node_seconds``).
        """
        n_in = len(self.stage.inputs)
        if len(inputs) != n_in:
            raise TradeoffError(f"expected {n_in} input tensor(s), got {len(inputs)}")
        if out is not None and len(out) != len(self.flow.outputs):
            raise TradeoffError(f"expected {len(self.flow.outputs)} output tensor(s), got {len(out)}")
        state = _Run(self, inputs, out)
        timers = state.execute(n_in, profile)
        stats = state.stats
        stats.phases = len(self.plan.steps)
        stats.node_seconds = {self.node(k).name: t for k, t in timers.items()}
        self.last_stats = stats
        results = {o: state.values[o] for o in self.flow.outputs}
        if self.stage.first == 0 and self.stage.stop == len(self.cnn.layers):
            local = {t: k for k, t in enumerate(self.members)}
            return substitute(self.runner.output_arg, lambda t: results[local[t]])
        return tuple(results[o] for o in self.flow.outputs)


class _Run:
    """The state of one :meth:`PartsExecutor.run`: every node's whole value or row buffer,
    the rows it has produced, and the bytes its buffers hold (``stats``, the ledger).

    :meth:`oldest` and the reads in :meth:`execute` are ``phase_reads`` and
    ``release_point`` of :mod:`~layerfit.tradeoff.parts.flow` unrolled over the
    executor's tables, as every phase of every node runs them.
    """

    def __init__(self, executor: PartsExecutor, inputs: Sequence[Any], out: Sequence[torch.Tensor] | None) -> None:
        self.executor = executor
        nodes = executor.flow.nodes
        count = len(nodes)
        self.flow_nodes = nodes
        self.rows = [node.rows for node in nodes]
        self.readers = executor.plan.readers
        self.layers = [executor.node(k) for k in range(count)]
        self.kernels = [executor.runner.kernels[t] for t in executor.members]
        self.values: list[Any] = [None] * count  # whole values (inputs, whole outputs, results)
        self.buffers: list[RowBuffer | None] = [None] * count
        self.produced = [0] * count
        self.held = [0] * count  # bytes counted in the ledger for this tensor
        self.stats = RunStats()
        self.out = out
        self.out_slot = {o: j for j, o in enumerate(executor.flow.outputs)}
        for k, value in enumerate(inputs):
            self.values[k] = value
            self.produced[k] = nodes[k].rows
        self.device = next((v.device for v in inputs if isinstance(v, torch.Tensor)), torch.device("cpu"))

    def execute(self, n_in: int, profile: bool) -> dict[int, float]:
        """Run every step of the plan; returns the seconds per node when ``profile``.

        One loop over locals: it runs once per phase of every node, and its bookkeeping
        is the overhead processing by parts adds to the operators.
        """
        executor = self.executor
        plan = executor.plan
        by_parts, last_read = plan.by_parts, plan.last_read
        is_output, reads_of, unique_inputs = executor._is_output, plan.slots, executor._unique_inputs
        values, buffers, produced, held = self.values, self.buffers, self.produced, self.held
        rows_of, oldest, store, whole = self.rows_of, self.oldest, self._store, self._whole
        stripes = [kernel.stripe for kernel in self.kernels]
        timers: dict[int, float] = {}
        for step, (k, a, b) in enumerate(plan.steps):
            if k < n_in:
                continue
            start = time.perf_counter() if profile else 0.0
            if not by_parts[k]:
                whole(k)
            elif is_output[k] or b >= oldest(k):
                args = []
                for i, code, extent, stride, pad, in_rows, _ in reads_of[k]:
                    if code != 1:  # a broadcast row (a by-parts layer reads no input whole)
                        args.append(values[i] if buffers[i] is None else rows_of(i, 0, 0))
                        continue
                    lo = a * stride - pad
                    hi = b * stride - pad + extent - 1
                    args.append(rows_of(i, lo if lo > 0 else 0, hi if hi < in_rows else in_rows - 1))
                store(k, a, stripes[k](args, a, b))  # type: ignore[misc]
            elif buffers[k] is not None:
                buffers[k].skip_to(b + 1)  # type: ignore[union-attr]
            produced[k] = b + 1
            if profile:
                timers[k] = timers.get(k, 0.0) + time.perf_counter() - start
            # Release what no consumer reads any more; free tensors after their last read.
            for i in unique_inputs[k]:
                buf = buffers[i]
                if buf is not None:
                    buf.release(oldest(i))
                if last_read[i] == step and held[i]:
                    self._free(i, buf)
        return timers

    def rows_of(self, i: int, lo: int, hi: int) -> Any:
        """Rows ``lo..hi`` of node ``i``'s tensor, from its row buffer or its whole value."""
        if lo > hi:  # a phase reading only padding: an empty stripe of the right shape
            shape = self.layers[i].shape
            return torch.empty((shape[0], shape[1], 0, shape[3]), dtype=self.kernels[i].dtype, device=self.device)
        buf = self.buffers[i]
        if buf is not None:
            return buf.view(lo, hi)
        return self.values[i].narrow(2, lo, hi - lo + 1)

    def oldest(self, i: int) -> int:
        """First row of ``i`` a consumer may still read (beyond the rows produced when
        the next rows are gaps no consumer reads; very large when all are done)."""
        produced, rows = self.produced, self.rows
        low = 1 << 62
        for c, (_, code, _, stride, pad, _, skip) in self.readers[i]:
            pc = produced[c]
            if pc >= rows[c]:
                continue  # done: reads nothing more
            if code != 1:  # read whole (or a broadcast row): everything until done
                return 0
            row = (pc if pc > skip else skip) * stride - pad
            if row < low:
                low = row if row > 0 else 0
        return low

    def _whole(self, k: int) -> None:
        """Run node ``k`` whole on whole inputs; hold its result until its last reader."""
        executor, layer = self.executor, self.layers[k]
        buffers = self.buffers
        args = [
            self.values[i] if buffers[i] is None else self.rows_of(i, 0, self.flow_nodes[i].rows - 1)
            for i in self.flow_nodes[k].inputs
        ]
        result = self.kernels[k].whole(args)
        if executor._is_output[k] and self.out is not None:
            target = self.out[self.out_slot[k]]
            target.copy_(result)
            result = target
        self.values[k] = result
        if executor._keeps[k] and isinstance(result, torch.Tensor):
            self.held[k] = result.numel() * result.element_size()
            self.stats.hold(layer.name, self.held[k])

    def _store(self, k: int, first: int, rows: torch.Tensor) -> None:
        """Write output rows of node ``k``: into its result tensor or its row buffer."""
        if self.executor._is_output[k]:
            if self.values[k] is None:
                shape = self.layers[k].shape
                self.values[k] = self.out[self.out_slot[k]] if self.out is not None else rows.new_empty(shape)
            self.values[k][:, :, first : first + rows.shape[2]].copy_(rows)
            return
        buf = self.buffers[k]
        if buf is None:
            buf = RowBuffer(self.executor.plan.buffer_rows[k], rows)
            self.buffers[k] = buf
            self.held[k] = buf.nbytes
            self.stats.hold(self.layers[k].name, buf.nbytes)
        buf.skip_to(first)  # rows nobody reads may have been skipped
        buf.write(first, rows)

    def _free(self, i: int, buf: RowBuffer | None) -> None:
        """Node ``i``'s tensor was read for the last time: its bytes leave the ledger."""
        self.stats.free(self.held[i])
        self.held[i] = 0
        if buf is not None:
            self.stats.high_water_rows[self.layers[i].name] = buf.high_water
            self.buffers[i] = None
        if not self.executor._is_output[i]:
            self.values[i] = None


def untiled_peak_bytes(cnn: CNN) -> int:
    """The ledger's peak of plain layer-by-layer execution (mode ``none``), without
    running it: the memory planner's most bytes live at once
    (:func:`~layerfit.memory.profiles.max_breadth`) over the usage records of the
    intermediate tensors, each live from the layer producing it to its last reader
    (graph inputs and outputs are the caller's, as the ledger counts them)."""
    runner = runner_of(cnn)
    outputs = set(runner.outputs)
    records = []
    for i, readers in enumerate(cnn.consumers()):
        layer = cnn.layers[i]
        if readers and i not in outputs and layer.op != "input" and layer.elems:
            itemsize = torch.empty((), dtype=runner.kernels[i].dtype).element_size()
            records.append(TensorUsageRecord(i, i, max(readers), layer.elems * itemsize))
    return max_breadth(records)


def describe_tiling(cnn: CNN) -> list[dict[str, Any]]:
    """Per layer: kind, output shape, whether it can process by parts, and why not."""
    return [
        {
            "name": layer.name,
            "op": layer.op,
            "shape": layer.shape,
            "tileable": cnn.tileable(i),
            "min_height": max((m.min_height for m in cnn.maps(i)), default=0) if cnn.tileable(i) else None,
            "reason": "" if cnn.tileable(i) else cnn.tiling_reason(i),
        }
        for i, layer in enumerate(cnn.layers)
    ]


__all__ = [
    "TOLERANCE",
    "PartsExecutor",
    "RowBuffer",
    "RowMap",
    "RunStats",
    "Stage",
    "describe_tiling",
    "flow_graph_of",
    "resolve_parts",
    "stage_of",
    "untiled_peak_bytes",
]
