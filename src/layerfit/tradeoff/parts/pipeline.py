"""Pipelined execution: a CNN split in two partitions runs as a two-stage pipeline.

Section 2.2: partition ``P_a`` processes frame ``i+1`` while partition ``P_b`` processes
frame ``i``. The data crossing the cut is *double buffered*: two preallocated slots,
one written by the first stage while the second stage reads the other, so the stages
never wait for each other's buffer (only for each other's pace). Stage one runs on a
worker thread, stage two on the caller's. Either stage may process some of its layers
by parts. :meth:`TwoStagePipeline.run_sequential` runs the same frames with both stages
on one thread, one after the other: the reference ``bench/minakova.py`` times it against.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import torch

from layerfit.engine.stripes import substitute
from layerfit.errors import TradeoffError
from layerfit.tradeoff.parts.cnn import CNN
from layerfit.tradeoff.parts.executor import PartsExecutor, PartsSpec, stage_of
from layerfit.tradeoff.parts.kernels import cnn_from_engine

if TYPE_CHECKING:
    from layerfit.engine.engine import Engine


class TwoStagePipeline:
    """Two pipeline stages of one CNN captured from a module, cut before layer ``cut``.

    ``parts`` selects by-parts layers for both stages (layer names, ``all`` or ``none``).
    Each stage is a :class:`PartsExecutor` of the CNN, or, given two ``engines`` of the
    model the CNN was read from (one prepared model loaded twice: an engine runs one pass
    at a time, and a stage of a streaming engine reads only its own units), a pass of its
    own engine.
    """

    def __init__(
        self, cnn: CNN, cut: int | str, parts: PartsSpec = "none", phase_rows: int = 1, engines: Sequence[Engine] = ()
    ) -> None:
        index = cnn.index(cut) if isinstance(cut, str) else cut
        if not 0 < index < len(cnn.layers):
            raise TradeoffError(f"cut must be a layer index in (0, {len(cnn.layers)}), got {cut!r}")
        self.cnn = cnn
        if engines and len(engines) != 2:
            raise TradeoffError(f"a two-stage pipeline runs on two engines, got {len(engines)}")
        on: list[Engine | None] = list(engines) or [None, None]
        runs = [cnn if engine is None else cnn_from_engine(engine, like=cnn) for engine in on]
        self.first, self.second = (
            PartsExecutor(own, parts, phase_rows, stage_of(own, *bounds), engine)
            for own, bounds, engine in zip(runs, [(0, index), (index, len(cnn.layers))], on, strict=True)
        )
        first_out = self.first.stage.outputs
        # The second stage reads the first stage's outputs and possibly the graph inputs.
        inputs = cnn.graph_inputs()
        self._reads = [(first_out.index(i), None) if i in first_out else (None, inputs.index(i)) for i in self.second.stage.inputs]
        self._slots = [(cnn.layers[i].shape, self.first.runner.kernels[i].dtype) for i in first_out]
        if any(not shape for shape, _ in self._slots):
            raise TradeoffError("the cut must only cross tensors (move it past non-tensor values)")

    def edge_bytes(self) -> int:
        """Bytes of one slot of the double-buffered edge (the pipeline holds two)."""
        return sum(math.prod(shape) * torch.empty((), dtype=dtype).element_size() for shape, dtype in self._slots)

    def _new_slot(self, like: torch.Tensor) -> list[torch.Tensor]:
        return [like.new_empty(shape, dtype=dtype) for shape, dtype in self._slots]

    def _second_inputs(self, frame: Sequence[torch.Tensor], slot: Sequence[torch.Tensor]) -> list[Any]:
        return [slot[f] if f is not None else frame[p] for f, p in self._reads]

    def run_sequential(self, frames: Iterable[torch.Tensor | Sequence[torch.Tensor]]) -> list[Any]:
        """Both stages on the calling thread, frame after frame (the reference)."""
        results = []
        slot: list[torch.Tensor] | None = None
        for frame in frames:
            frame = _as_tuple(frame)
            if slot is None:
                slot = self._new_slot(frame[0])
            self.first.run(*frame, out=slot)
            results.append(self._finish(self.second.run(*self._second_inputs(frame, slot)), slot))
        return results

    def run(self, frames: Iterable[torch.Tensor | Sequence[torch.Tensor]]) -> list[Any]:
        """Stage one on a worker thread, stage two on the calling thread; outputs in order.

        Stage one writes frame ``i+1`` into one slot of the double-buffered edge while
        stage two reads frame ``i`` from the other; a stage's error reaches the caller."""
        frames = [_as_tuple(frame) for frame in frames]
        slots = [self._new_slot(frames[0][0]) for _ in frames[:2]]
        results = []
        with ThreadPoolExecutor(1, thread_name_prefix="layerfit-pipeline-stage1") as first:
            pending = first.submit(self.first.run, *frames[0], out=slots[0]) if frames else None
            for i, frame in enumerate(frames):
                pending.result()  # type: ignore[union-attr]
                if i + 1 < len(frames):
                    pending = first.submit(self.first.run, *frames[i + 1], out=slots[(i + 1) % 2])
                slot = slots[i % 2]
                results.append(self._finish(self.second.run(*self._second_inputs(frame, slot)), slot))
        return results

    def _finish(self, outputs: tuple[Any, ...], slot: Sequence[torch.Tensor]) -> Any:
        """The module's output structure from the second stage's outputs (and copies of
        any result already produced by the first stage, whose slot will be reused)."""
        local = dict(zip(self.second.stage.outputs, outputs, strict=True))
        for i, value in zip(self.first.stage.outputs, slot, strict=True):
            if i not in local:
                local[i] = value.clone()
        return substitute(self.first.runner.output_arg, lambda i: local[i])


def _as_tuple(frame: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return (frame,) if isinstance(frame, torch.Tensor) else tuple(frame)
