"""Processing by parts, for real: a CNN's choice of layers by parts run in row stripes.

:class:`PartsExecutor` decides what runs: a CNN captured from a module (or a contiguous
range of its layers, a pipeline stage), the layers chosen to process by parts, and the
schedule and minimum buffers :func:`~layerfit.tradeoff.parts.flow.plan_rows` gives them.
The engine runs it (:func:`layerfit.engine.stripes.run_stripes`): a layer by parts
produces its output ``phase_rows`` rows at a time (one row by default, Table 2) from the
few input rows it needs, and the tensor between two such layers lives in a
:class:`~layerfit.engine.stripes.RowBuffer` holding only the rows a consumer may still
read. A layer that cannot or need not be tiled runs whole on whole tensors.

The output equals running the module (same operators, same weights, same padding
semantics) within fp32 rounding: a stripe is computed by the same operator on fewer rows,
and PyTorch may then pick another kernel or blocking (oneDNN convolutions choose by
tensor height; vectorised transcendental activations round tail elements differently),
so sums can be ordered differently. Pooling, batch norm, ReLU-like activations and adds
are element-for-element the same; whole networks are often bit-exact when oneDNN is
disabled, never off by more than ``TOLERANCE``.

Memory is accounted in the run's ledger (:class:`~layerfit.engine.stripes.RunStats`, whose
module says what it counts). With no layer by parts the ledger is the memory planner's
tensor usage records, so :func:`untiled_peak_bytes` reads its peak from them without a run.

Given an :class:`~layerfit.engine.engine.Engine` of the model the CNN was read from
(:func:`~layerfit.tradeoff.parts.kernels.cnn_from_engine`), the executor's stage runs as
one pass of the engine that may run only the units holding the stage's modules
(:meth:`Engine.run_pass <layerfit.engine.engine.Engine.run_pass>`, as
:mod:`layerfit.engine.parts` runs a submodule): the engine checks its file and binds the
weights, and a streaming engine refuses a unit outside the stage; how the units of
layers run whole and by parts are bound is the engine's stripes' to say
(:func:`~layerfit.engine.stripes.held_spans`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from layerfit.engine.part_units import inside
from layerfit.engine.stripes import (
    Runner,
    RunStats,
    StripeSchedule,
    held_spans,
    holds_for,
    run_stripes,
    substitute,
)
from layerfit.errors import TradeoffError
from layerfit.memory.profiles import max_breadth
from layerfit.memory.records import TensorUsageRecord
from layerfit.tradeoff.parts.cnn import CNN, Stage
from layerfit.tradeoff.parts.flow import FlowGraph, RowPlan, plan_rows

if TYPE_CHECKING:
    from layerfit.engine.engine import Engine

# Agreement with the untiled module: |out - ref| <= rtol * |ref| + atol * max(1, max|ref|)
# with (rtol, atol) below. Observed: a few ulps per layer (<= 1.2e-7 on unit-scale random
# chains; 5e-6 to 2e-5 on MobileNet v2 / EfficientNet-B0 / ResNet-50 outputs of magnitude
# 4 to 13 at 224x224).
TOLERANCE = (1e-5, 1e-5)

PartsSpec = str | Sequence[bool] | Collection[str]


def resolve_parts(cnn: CNN, parts: PartsSpec) -> list[bool]:
    """Per layer: should it process by parts? (``all``, ``none``, flags or layer names)."""
    names = [layer.name for layer in cnn.layers]
    if isinstance(parts, str):
        if parts not in ("all", "none"):
            raise TradeoffError(f"parts must be 'all', 'none', flags or layer names, got {parts!r}")
        flags = [parts == "all"] * len(names)
    elif (items := list(parts)) and all(isinstance(p, bool) for p in items):
        if len(items) != len(names):
            raise TradeoffError(f"{len(items)} by-parts flags for {len(names)} layers")
        flags = items
    else:
        chosen = set(items)
        if chosen - set(names):
            raise TradeoffError(f"unknown layer names {sorted(chosen - set(names))}")
        flags = [name in chosen for name in names]
    return [bool(f) and cnn.tileable(i) for i, f in enumerate(flags)]


def runner_of(cnn: CNN) -> Runner:
    """What runs ``cnn``; refused for a CNN given as a layer list."""
    if cnn.runner is None:
        raise TradeoffError(
            f"CNN {cnn.name!r} was given as a layer list, so it cannot be run: use the analytic "
            "throughput model (--model-throughput) or give it as a zoo model or a module"
        )
    return cnn.runner


def stage_of(cnn: CNN, first: int, stop: int) -> Stage:
    """The stage of layers ``[first, stop)`` as it runs: which tensors enter it (the graph's
    inputs given by its caller) and leave it (the module's results among them)."""
    return cnn.stage(first, stop, graph_inputs_outside=True, results=runner_of(cnn).outputs)


class PartsExecutor:
    """A CNN captured from a module (or a stage of it) with the chosen layers processing
    by parts: their schedule (``plan``) as the engine runs it (``schedule``, handed to
    :func:`~layerfit.engine.stripes.run_stripes` by :meth:`run`).

    ``parts`` selects the layers: ``"all"`` (every tileable layer), ``"none"`` (plain
    layer-by-layer execution, the untiled reference), per-node flags, or node names.
    ``phase_rows`` rows are produced per phase (1 reproduces the paper's minimum heights).
    With an ``engine`` (of the model ``cnn`` was read from) each run is a pass of it
    running only the stage's ``units``, those of layers by parts bound as one over
    ``spans`` of their phases.
    """

    def __init__(
        self,
        cnn: CNN,
        parts: PartsSpec = "all",
        phase_rows: int = 1,
        stage: Stage | None = None,
        engine: Engine | None = None,
    ) -> None:
        self.cnn = cnn
        self.runner = runner_of(cnn)
        self.stage = stage or stage_of(cnn, 0, len(cnn.layers))
        # flow nodes: the stage's inputs first (graph inputs, or layers of earlier stages)
        self.members = self.stage.members
        self.flow: FlowGraph = cnn.flow_graph(self.stage)
        flags = resolve_parts(cnn, parts)
        self.plan: RowPlan = plan_rows(self.flow, [flags[t] for t in self.members], phase_rows)
        self.last_stats = RunStats()
        nodes, plan = self.flow.nodes, self.plan
        self.schedule = StripeSchedule(
            kernels=tuple(self.runner.kernels[t] for t in self.members),
            names=tuple(node.name for node in nodes),
            shapes=tuple(self.cnn.layers[t].shape for t in self.members),
            inputs=tuple(node.inputs for node in nodes),
            rows=tuple(node.rows for node in nodes),
            external=len(self.stage.inputs),
            outputs=self.flow.outputs,
            keeps=tuple(  # buffered for readers: not the caller's input or output, read by someone
                k >= len(self.stage.inputs) and k not in self.flow.outputs and bool(plan.readers[k]) for k in range(len(nodes))
            ),
            by_parts=plan.by_parts,
            steps=plan.steps,
            buffer_rows=plan.buffer_rows,
            last_read=plan.last_read,
            slots=plan.slots,
            readers=plan.readers,
        )
        self.engine = engine
        if engine is not None:
            self.units = stage_units(engine, cnn, self.stage.first, self.stage.stop)
            owner = layer_units(engine, cnn)
            self.spans = held_spans(plan.steps, plan.by_parts, [owner[t] for t in self.members])
            holds_for(engine.stream, self.spans)  # refused now rather than at the first call

    def run(self, *inputs: Any, out: Sequence[torch.Tensor] | None = None, profile: bool = False) -> Any:
        """Run on ``inputs`` (the stage's input tensors, in order) and return the result.

        For the whole module the result has the module's output structure; for a stage it
        is the tuple of the stage's output tensors. ``out`` optionally supplies tensors to
        write the stage outputs into (the pipeline's double buffers). ``profile`` records
        the seconds each node's phases take (``last_stats.node_seconds``).
        """
        if self.engine is not None:
            return self.engine.run_pass(None, partial(self._run, out=out, profile=profile), inputs, {}, self.units)
        return self._run(*inputs, out=out, profile=profile)

    def _run(self, *inputs: Any, out: Sequence[torch.Tensor] | None, profile: bool) -> Any:
        """The run (inside the engine's pass, the units of layers by parts bound as the
        engine is configured now)."""
        n_in = len(self.stage.inputs)
        if len(inputs) != n_in:
            raise TradeoffError(f"expected {n_in} input tensor(s), got {len(inputs)}")
        if out is not None and len(out) != len(self.flow.outputs):
            raise TradeoffError(f"expected {len(self.flow.outputs)} output tensor(s), got {len(out)}")
        holds = holds_for(self.engine.stream, self.spans) if self.engine is not None else None
        values, self.last_stats = run_stripes(self.schedule, inputs, out, profile, holds)
        if self.stage.first == 0 and self.stage.stop == len(self.cnn.layers):
            return substitute(self.runner.output_arg, dict(zip(self.stage.outputs, values, strict=True)).__getitem__)
        return tuple(values)


def layer_units(engine: Engine, cnn: CNN) -> list[int | None]:
    """Per layer of ``cnn``, the engine's unit holding its module (None: a layer with no
    module, or a module with no weights of its own)."""
    module_of = {node.name: str(node.target) for node in runner_of(cnn).module.graph.nodes if node.op == "call_module"}
    owner: list[int | None] = []
    for layer in cnn.layers:
        module = module_of.get(layer.name)
        blocks = enumerate(engine.blocks) if module is not None else ()
        owner.append(next((i for i, b in blocks if any(inside(module, seg.name) for seg in b.segments)), None))
    return owner


def stage_units(engine: Engine, cnn: CNN, first: int, stop: int) -> range:
    """The engine's units holding the modules of layers ``[first, stop)`` of ``cnn``: a
    contiguous range, none of them holding a module of a layer outside the stage."""
    owner = layer_units(engine, cnn)
    within = sorted({u for u in owner[first:stop] if u is not None})
    if not within:
        return range(0)
    units = range(within[0], within[-1] + 1)
    shared = [cnn.layers[n].name for n, u in enumerate(owner) if u in units and not first <= n < stop]
    if shared:
        raise TradeoffError(
            f"layers {first}-{stop - 1} cannot run as their own pass: units {units.start}-{units.stop - 1} "
            f"also hold layer {shared[0]!r} outside them (units merged by blocks:N or merge:SIZE are: "
            "load the model with units='layers', or cut between units)"
        )
    return units


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
        if readers and i not in outputs and layer.kind != "input" and layer.elems:
            itemsize = torch.empty((), dtype=runner.kernels[i].dtype).element_size()
            records.append(TensorUsageRecord(i, i, max(readers), layer.elems * itemsize))
    return max_breadth(records)

