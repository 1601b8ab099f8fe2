"""Throughput of the CNNs of an application under a choice of by-parts layers.

Algorithm 2's ``EvalThroughput`` estimates ``T_n`` "using measurements on the platform
or a third-party throughput evaluation tool". Three estimators share one signature
(``throughput(app, derived) -> {cnn: frames per second}``):

* :class:`ProfiledThroughput` (default for CNNs built from modules): each CNN is run
  twice on this machine - every layer whole, then every tileable layer by parts - and
  the time of every layer in both modes is recorded (median of repeats). A chromosome's
  time is the sum of its layers' times in their chosen modes; cached per CNN.
* :class:`MeasuredThroughput`: every configuration is executed for real, partition by
  partition, and cached per configuration (exact but slow; for final checks); given an
  engine of a CNN's prepared model, each partition is a pass of that engine
  (:class:`~layerfit.tradeoff.parts.executor.PartsExecutor` with ``engine``).
* :class:`AnalyticThroughput` (``--model-throughput``): a delay model, ``overhead +
  MACs / rate`` per layer plus a per-phase overhead for by-parts layers, with constants
  given.

A CNN split into pipeline stages runs at the pace of its slowest stage (``1 / max``),
otherwise at ``1 / sum`` of its layer times. CNNs are timed on their own: an
application running several CNNs on one processor shares it among them.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from layerfit.tradeoff.parts.application import Application, DerivedApplication
from layerfit.tradeoff.parts.cnn import CNN
from layerfit.tradeoff.parts.executor import PartsExecutor, runner_of, stage_of
from layerfit.tradeoff.parts.kernels import cnn_from_engine

if TYPE_CHECKING:
    from layerfit.engine.engine import Engine


class ThroughputEstimator(Protocol):
    """Frames per second of every CNN of ``derived``."""

    def throughput(self, app: Application, derived: DerivedApplication) -> dict[str, float]: ...


@dataclass(frozen=True)
class LayerTimes:
    """Seconds per frame of every layer of a CNN, run whole and run by parts."""

    whole: tuple[float, ...]
    parts: tuple[float, ...]


def throughput_of_stages(app: Application, seconds: dict[str, float]) -> dict[str, float]:
    """``T_n``: 1 / slowest stage for pipelined CNNs, 1 / total otherwise."""
    result = {}
    for cnn in app.cnns:
        parts = [seconds[p.name] for p in app.partitions_of(cnn.name)]
        bottleneck = max(parts) if len(parts) > 1 else sum(parts)
        result[cnn.name] = 1.0 / bottleneck if bottleneck > 0 else float("inf")
    return result


class _PerLayer:
    """An estimator from per-layer times (:meth:`layer_times` of a CNN)."""

    def layer_times(self, cnn: CNN) -> LayerTimes:
        raise NotImplementedError

    def throughput(self, app: Application, derived: DerivedApplication) -> dict[str, float]:
        """Each partition takes the sum of its layers' times in their chosen modes."""
        times = {c.name: self.layer_times(c) for c in app.cnns}
        seconds = {}
        for p in app.partitions:
            t, offset = times[p.cnn], app.offsets[p.cnn]
            seconds[p.name] = sum(t.parts[i] if derived.bits[offset + i] else t.whole[i] for i in range(p.start, p.stop))
        return throughput_of_stages(app, seconds)


@dataclass
class AnalyticThroughput(_PerLayer):
    """Delay model: a layer costs ``layer_overhead_s + macs / macs_per_s``; by parts it
    costs ``phases * phase_overhead_s + macs / macs_per_s`` instead, a phase producing
    ``phase_rows`` rows."""

    macs_per_s: float = 2e10
    layer_overhead_s: float = 20e-6
    phase_overhead_s: float = 25e-6
    elementwise_per_s: float = 1e9  # elements per second for layers without MACs
    phase_rows: int = 1

    def layer_times(self, cnn: CNN) -> LayerTimes:
        whole, parts, phase_rows = [], [], self.phase_rows
        for i, layer in enumerate(cnn.layers):
            work = layer.macs / self.macs_per_s if layer.macs else layer.elems / self.elementwise_per_s
            whole.append(self.layer_overhead_s + work)
            phases = -(-layer.rows // phase_rows) if cnn.tileable(i) else 1
            parts.append(phases * self.phase_overhead_s + work)
        return LayerTimes(tuple(whole), tuple(parts))


@dataclass
class ProfiledThroughput(_PerLayer):
    """Per-layer times measured on this machine (whole and by parts), cached per CNN.

    Each layer's time is the median over ``repeats`` runs (after ``warmup``), the two
    modes alternating run by run.
    """

    repeats: int = 5
    warmup: int = 1
    phase_rows: int = 1
    cache: dict[str, LayerTimes] = field(default_factory=dict)

    def layer_times(self, cnn: CNN) -> LayerTimes:
        if cnn.name not in self.cache:
            self.cache[cnn.name] = self._measure(cnn)
        return self.cache[cnn.name]

    def _measure(self, cnn: CNN) -> LayerTimes:
        example = runner_of(cnn).example
        executors = {mode: PartsExecutor(cnn, mode, self.phase_rows) for mode in ("none", "all")}
        for executor in executors.values():
            for _ in range(self.warmup):
                executor.run(*example)
        samples: dict[str, dict[str, list[float]]] = {mode: {} for mode in executors}
        for _ in range(self.repeats):  # alternate the modes so interference hits both alike
            for mode, executor in executors.items():
                executor.run(*example, profile=True)
                for name, seconds in executor.last_stats.node_seconds.items():
                    samples[mode].setdefault(name, []).append(seconds)
        medians = {mode: {n: statistics.median(v) for n, v in per.items()} for mode, per in samples.items()}
        whole = tuple(medians["none"].get(layer.name, 0.0) for layer in cnn.layers)
        parts = tuple(
            medians["all"].get(layer.name, 0.0) if cnn.tileable(i) else whole[i] for i, layer in enumerate(cnn.layers)
        )
        return LayerTimes(whole, parts)


@dataclass
class MeasuredThroughput:
    """Runs every configuration for real (stage by stage) and caches it per configuration:
    a CNN with an engine in ``engines`` (by CNN name; an engine of its prepared model) on
    that engine, stage by stage as its passes, any other with its own kernels."""

    repeats: int = 3
    warmup: int = 1
    phase_rows: int = 1
    cache: dict[tuple[str, tuple[bool, ...]], dict[str, float]] = field(default_factory=dict)
    engines: dict[str, Engine] = field(default_factory=dict)
    _on_engine: dict[str, CNN] = field(default_factory=dict, repr=False)

    def runs(self, cnn: CNN) -> CNN:
        """The CNN whose kernels run ``cnn``: the engine's, when it has one."""
        engine = self.engines.get(cnn.name)
        if engine is None:
            return cnn
        if cnn.name not in self._on_engine:
            self._on_engine[cnn.name] = cnn_from_engine(engine, cnn.name, like=cnn)
        return self._on_engine[cnn.name]

    def stage_seconds(self, app: Application, derived: DerivedApplication, cnn: CNN) -> dict[str, float]:
        """Median seconds per frame of each partition of ``cnn`` under ``derived``."""
        offset = app.offsets[cnn.name]
        bits = derived.bits[offset : offset + len(cnn.layers)]
        key = (cnn.name, bits)
        if key in self.cache:
            return self.cache[key]
        runs, engine = self.runs(cnn), self.engines.get(cnn.name)
        placeholders = cnn.graph_inputs()
        values = dict(zip(placeholders, runner_of(runs).example, strict=True))
        result = {}
        for p in app.partitions_of(cnn.name):
            stage = PartsExecutor(runs, list(bits), self.phase_rows, stage_of(runs, p.start, p.stop), engine)
            inputs = [values[i] for i in stage.stage.inputs]
            for _ in range(self.warmup):
                outputs = stage.run(*inputs)
            samples = []
            for _ in range(self.repeats):
                start = time.perf_counter()
                outputs = stage.run(*inputs)
                samples.append(time.perf_counter() - start)
            result[p.name] = statistics.median(samples)
            if p.stop < len(cnn.layers):
                values.update(zip(stage.stage.outputs, outputs, strict=True))
        self.cache[key] = result
        return result

    def throughput(self, app: Application, derived: DerivedApplication) -> dict[str, float]:
        seconds: dict[str, float] = {}
        for cnn in app.cnns:
            seconds.update(self.stage_seconds(app, derived, cnn))
        return throughput_of_stages(app, seconds)


def estimator_for(app: Application, model: bool = False, phase_rows: int = 1) -> ThroughputEstimator:
    """Profiled measurement when every CNN can run, else (or if ``model``) the delay model."""
    if model or any(c.runner is None for c in app.cnns):
        return AnalyticThroughput(phase_rows=phase_rows)
    return ProfiledThroughput(phase_rows=phase_rows)

