"""Processing by parts on the engine: a loaded model's layers, a stage run as its own pass.

:func:`cnn_from_engine` reads a CNN from an :class:`~layerfit.engine.engine.Engine`: its
layers are the operators of the graph ``prepare`` captured (the manifest's, with
torch.fx), its kernels call the engine's own model (the skeleton whose weights the
engine binds), and its example is the manifest's seeded input. :class:`EngineStage`
runs a contiguous range of those layers (all of them, or a pipeline stage) as one pass
of the engine that may run only the units holding the range's modules
(:meth:`Engine.run_pass <layerfit.engine.engine.Engine.run_pass>`, as
:mod:`layerfit.engine.parts` runs a submodule): the engine checks its file and binds
the weights, and a streaming engine refuses a unit outside the stage.

A layer run whole calls its module, so its unit's hooks bind the unit as in any pass,
whatever the policy. A layer run by parts calls its operator in row stripes on its
module's weights as bound when each phase runs, which calls no hook, and the phases of
a chain of such layers interleave: the engine binds the units of the chain as one, from
its first phase to its last (:func:`~layerfit.engine.stripes.held_spans`), under a
streaming policy too.

:func:`engine_stages` cuts a CNN into the two stages of a
:class:`~layerfit.tradeoff.parts.pipeline.TwoStagePipeline`, each a pass of its own
engine, so the stages overlap frame by frame as the executors' stages do.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from layerfit.engine.part_units import inside
from layerfit.engine.stripes import Runner, held_spans, holds_for
from layerfit.errors import TradeoffError
from layerfit.store.examples import example_call
from layerfit.tradeoff.parts.cnn import CNN
from layerfit.tradeoff.parts.executor import PartsExecutor, PartsSpec, Stage, stage_of
from layerfit.tradeoff.parts.kernels import cnn_from_graph

if TYPE_CHECKING:
    from layerfit.engine.engine import Engine


def cnn_from_engine(engine: Engine, name: str | None = None) -> CNN:
    """The CNN of ``engine``'s model: its captured graph's operators, kernels calling the
    engine's skeleton, and the manifest's example input as its runner's example."""
    args, kwargs = example_call(engine.manifest)
    if kwargs:
        raise TradeoffError("processing by parts takes positional tensor inputs; this model was prepared from keywords")
    return cnn_from_graph(name or engine.manifest.model["name"], engine.manifest.graph, engine.model, tuple(args))


def layer_units(engine: Engine, cnn: CNN) -> list[int | None]:
    """Per layer of ``cnn``, the engine's unit holding its module (None: a layer with no
    module, or a module with no weights of its own)."""
    module_of = {
        node.name: str(node.target) for node in cnn.runner.module.graph.nodes if node.op == "call_module"
    }
    owner: list[int | None] = []
    for layer in cnn.layers:
        module = module_of.get(layer.name)
        found = None
        if module is not None:
            for i, block in enumerate(engine.blocks):
                if any(inside(module, seg.name) for seg in block.segments):
                    found = i
                    break
        owner.append(found)
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


class EngineStage:
    """Layers ``[first, stop)`` of ``engine``'s CNN with ``parts`` processing by parts,
    called like :meth:`PartsExecutor.run` (the stage's input tensors): each call is a
    pass of the engine running only the stage's units, those of layers by parts bound
    as one over their phases."""

    def __init__(
        self, engine: Engine, cnn: CNN, parts: PartsSpec = "none", first: int = 0, stop: int | None = None,
        phase_rows: int = 1,
    ) -> None:
        stop = len(cnn.layers) if stop is None else stop
        self.engine = engine
        self.executor = PartsExecutor(cnn, parts, phase_rows, stage_of(cnn, first, stop))
        self.units = stage_units(engine, cnn, first, stop)
        owner, plan = layer_units(engine, cnn), self.executor.plan
        self.spans = held_spans(plan.steps, plan.by_parts, [owner[t] for t in self.executor.members])
        holds_for(engine.stream, self.spans)  # refused now rather than at the first call

    @property
    def stage(self) -> Stage:
        return self.executor.stage

    @property
    def runner(self) -> Runner:
        return self.executor.runner

    def run(self, *inputs: Any, out: Sequence[torch.Tensor] | None = None) -> Any:
        """:meth:`PartsExecutor.run` of the stage as one pass of the engine."""
        return self.engine.run_pass(None, partial(self._run, out=out), inputs, {}, self.units)

    def _run(self, *inputs: Any, out: Sequence[torch.Tensor] | None) -> Any:
        """The stage's pass, inside the engine's: the units of layers by parts bound as
        the engine is configured now."""
        self.executor.holds = holds_for(self.engine.stream, self.spans)
        return self.executor.run(*inputs, out=out)

    __call__ = run


def engine_stages(engines: Sequence[Engine], cut: int, parts: PartsSpec = "none", phase_rows: int = 1) -> list[EngineStage]:
    """A CNN cut before layer ``cut`` as two stages, each a pass of its own engine (two
    engines of one prepared model: an engine runs one pass at a time, and a stage of a
    streaming engine reads only its own units)."""
    if len(engines) != 2:
        raise TradeoffError(f"a two-stage pipeline runs on two engines, got {len(engines)}")
    first, second = (cnn_from_engine(engine) for engine in engines)
    if first.layers != second.layers:
        raise TradeoffError("the two engines run different models: load one prepared model twice")
    return [EngineStage(engines[0], first, parts, 0, cut, phase_rows), EngineStage(engines[1], second, parts, cut, None, phase_rows)]


__all__ = ["EngineStage", "cnn_from_engine", "engine_stages", "stage_units"]
