"""Profiles of prepared models: per-unit load/execute time and memory, estimated or measured.

The scheduler needs, for every unit (layer) of a prepared model, what its load, execute
and init tasks cost (:class:`~layerfit.schedule.profile.NetworkProfile`). Two sources:

- :func:`estimate_profile` — from the capture stored in the manifest, no execution:
  a load reserves exactly the unit's aligned bytes (the buffer it reads into), an
  execution its output activations, the init the resident tensors plus the activations
  of one forward pass at their peak (:func:`activation_estimate_bytes`: the network's
  working set, held from its init until it finishes, as Caffe allocates its blobs when
  it builds the net). Times come from the capture's MACs and bytes at nominal rates
  (:func:`profile_from_graph`).
- :func:`measure_profile` — the profiler of thesis §5.3: every unit is loaded and
  executed in isolation by one thread while a parallel thread samples the process's
  resident memory from ``/proc/self/statm``; a task's memory is its peak above the
  resident memory when it started, its time the wall-clock of the load or the kernel.
  The sampler is the one periodic loop in layerfit and runs only while profiling
  (§5.3: "it is not enabled in the framework when running normally").
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from layerfit.errors import ScheduleError
from layerfit.memory.activations import activation_bytes
from layerfit.schedule.profile import NetworkProfile, profile_from_graph

if TYPE_CHECKING:
    from layerfit.capture.graph import ModelGraph
    from layerfit.engine.engine import Engine
    from layerfit.schedule.contention import ContentionModel
    from layerfit.store.manifest import Manifest

log = logging.getLogger(__name__)

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
STATM = "/proc/self/statm"


def activation_peak_bytes(graph: ModelGraph) -> int:
    """Largest sum of simultaneously live activation bytes over one forward pass.

    A storage is live from the op that makes it to the last op that reads it or any view
    of it; views own no bytes (:func:`~layerfit.memory.activations.activation_bytes`).
    """
    return activation_bytes(graph)


def activation_estimate_bytes(graph: ModelGraph) -> int:
    """The activation memory the scheduler reserves for one forward pass of a network.

    The larger of the tensor usage records' peak and what the captured eager pass held
    at once (``graph.pass_peak_bytes``): the records miss what functional code makes
    between modules (a transformer's attention scores, a returned key/value cache), and
    eager PyTorch does not write every elementwise module's output over its input as
    the records allow. Graphs captured before the pass was measured fall back to the
    records.
    """
    return max(activation_peak_bytes(graph), graph.pass_peak_bytes)


def _layer_kind(module_type: str) -> str:
    module = module_type.lower()
    return "conv" if "conv" in module else "fc" if "linear" in module else "other"


def estimate_profile(manifest: Manifest, name: str) -> NetworkProfile:
    """The scheduler's estimates for a prepared model, from its capture alone."""
    graph = manifest.graph
    base = profile_from_graph(graph, name, architecture=manifest.model.get("name"))
    if len(graph.units) != len(manifest.units):
        raise ScheduleError(
            f"model {name}: the capture has {len(graph.units)} units but the store "
            f"{len(manifest.units)} (prepare it again)"
        )
    if not graph.pass_peak_bytes:
        log.warning(
            "model %s was prepared before layerfit measured the captured pass: its activations "
            "are estimated from the usage records alone (%d bytes), which can be far too few for "
            "a model whose functional code makes tensors between modules; prepare it again",
            name, activation_peak_bytes(graph),
        )
    layers = base.layers  # no unit: the one layer of the whole forward pass
    if manifest.units:
        layers = tuple(
            replace(layer, memory=segment.nbytes, kind=_layer_kind(segment.module_type))
            for layer, segment in zip(base.layers, manifest.units, strict=True)
        )
    return replace(
        base,
        layers=layers,
        init_memory=manifest.resident_bytes + activation_estimate_bytes(graph),
        notes={**dict(base.notes), "estimates": "capture"},
    )


class StatmSampler:
    """Peak resident memory of this process over an interval, sampled from ``/proc/self/statm``.

    ``start()`` records the resident memory and starts a thread that samples it every
    ``interval`` seconds (a timed wait on an event, so ``stop()`` ends it at once);
    ``stop()`` returns the peak above the starting value, in bytes.
    """

    def __init__(self, interval: float = 2e-4) -> None:
        self.interval = interval
        self._fd = os.open(STATM, os.O_RDONLY)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.base = 0
        self.peak = 0

    def rss(self) -> int:
        fields = os.pread(self._fd, 128, 0).split()
        return int(fields[1]) * PAGE_SIZE

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.rss())

    def start(self) -> StatmSampler:
        self.base = self.peak = self.rss()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="layerfit-statm", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.peak = max(self.peak, self.rss())
        return max(0, self.peak - self.base)

    def close(self) -> None:
        self.stop()
        with contextlib.suppress(OSError):
            os.close(self._fd)


@dataclass
class _UnitMeasure:
    load_s: list[float] = field(default_factory=list)
    load_bytes: list[int] = field(default_factory=list)
    exec_s: list[float] = field(default_factory=list)
    exec_bytes: list[int] = field(default_factory=list)
    unload_s: list[float] = field(default_factory=list)


class _ProfilingSource:
    """A unit source that loads each unit when the forward pass asks for it and measures
    its tasks as the runtime runs them: an execution is the kernel plus the ops between
    the previous unit and this one (the runtime's execute task spans both), an unload
    is freeing the unit's buffer."""

    def __init__(
        self, engine: Engine, sampler: StatmSampler | None, measures: list[_UnitMeasure]
    ) -> None:
        self.engine = engine
        self.sampler = sampler  # None: time only (the sampler thread would slow the run)
        self.measures = measures
        self._units: dict[int, tuple[mmap.mmap, torch.Tensor]] = {}
        self._exec_start = 0.0
        self._released_at: float | None = None  # end of the previous unit's kernel
        self._ops_before = 0.0

    def acquire(self, i: int) -> tuple[torch.Tensor, int]:
        entered = time.perf_counter()
        self._ops_before = 0.0 if self._released_at is None else entered - self._released_at
        if self.sampler is not None:
            self.sampler.start()
        t0 = time.perf_counter()
        buf = self.engine.read_unit_buffer(i)
        t1 = time.perf_counter()
        if self.sampler is None:
            self.measures[i].load_s.append(t1 - t0)
        else:
            self.measures[i].load_bytes.append(self.sampler.stop())
        tensor = torch.frombuffer(buf, dtype=torch.uint8)
        self._units[i] = (buf, tensor)
        if self.sampler is not None:
            self.sampler.start()
        self._exec_start = time.perf_counter()
        return tensor, 0

    def release(self, i: int) -> None:
        elapsed = time.perf_counter() - self._exec_start
        if self.sampler is None:
            self.measures[i].exec_s.append(elapsed + self._ops_before)
        else:
            self.measures[i].exec_bytes.append(self.sampler.stop())
        buf, tensor = self._units.pop(i)
        del tensor
        t0 = time.perf_counter()
        with contextlib.suppress(BufferError):
            buf.close()
        if self.sampler is None:
            self.measures[i].unload_s.append(time.perf_counter() - t0)
        self._released_at = time.perf_counter()

    def finished(self) -> None:
        """The forward pass returned: the ops after the last unit count to its execution."""
        if self.sampler is None and self._released_at is not None and self.measures:
            last = self.measures[-1]
            if last.exec_s:
                last.exec_s[-1] += time.perf_counter() - self._released_at

    def close(self) -> None:
        for buf, _ in self._units.values():
            with contextlib.suppress(BufferError):
                buf.close()
        self._units.clear()


def measure_profile(
    directory: str | Path,
    name: str | None = None,
    *,
    repeats: int = 2,
    warmup: int = 1,
    interval: float = 2e-4,
    inputs: Sequence[torch.Tensor] | None = None,
) -> NetworkProfile:
    """Profile a prepared model on this machine (thesis §5.3); ``source = "profiled"``.

    Runs ``warmup + repeats + 1`` inferences one unit at a time, on ``inputs`` (positional
    arguments) or else the manifest's example call (its input, or each of the keyword
    arguments the model was prepared from): warm-up runs are discarded, times are
    medians of the ``repeats`` timed runs, memory comes from the last run, the only one
    with the sampler thread (which would slow the timed ones).
    A load's memory is at least its buffer. An execution's time includes the ops between
    the previous unit and this one (the last unit's, the ops after it too), as the
    runtime's execute task does; the network's unload time is the mean time to free a
    unit's buffer.
    The init's memory and time come from the capture estimate (the activations are not
    one task's), as do the layer kinds.
    """
    from layerfit.engine.engine import Engine
    from layerfit.store import example_call

    directory = Path(directory)
    engine = Engine(directory, pipeline="external")
    try:
        manifest = engine.manifest
        estimate = estimate_profile(manifest, name or directory.name)
        # the manifest's example call: one input, or a model's keyword arguments
        x, kwargs = (tuple(inputs), {}) if inputs is not None else example_call(manifest)
        if not engine.blocks:
            return _profile_whole_model(engine, estimate, (x, kwargs), repeats, warmup, interval)
        measures = [_UnitMeasure() for _ in engine.blocks]
        sampler = StatmSampler(interval)
        try:
            # warm-up runs (discarded), timed runs, then one run sampling memory
            for run in range(warmup + max(1, repeats) + 1):
                sampled = run == warmup + max(1, repeats)
                source = _ProfilingSource(engine, sampler if sampled else None, measures)
                try:
                    engine.run_from(source, *x, **kwargs)
                    source.finished()
                finally:
                    source.close()
                if run < warmup:
                    measures = [_UnitMeasure() for _ in engine.blocks]
        finally:
            sampler.close()
    finally:
        engine.close()
    layers = []
    for layer, segment, m in zip(estimate.layers, manifest.units, measures, strict=True):
        layers.append(
            replace(
                layer,
                load_time=statistics.median(m.load_s),
                exec_time=statistics.median(m.exec_s),
                memory=segment.nbytes,
                load_memory=max(segment.nbytes, max(m.load_bytes)),
                exec_memory=max(m.exec_bytes),
            )
        )
    return replace(
        estimate,
        layers=tuple(layers),
        # one figure per network: the mean of the units' medians keeps the total right
        unload_time=statistics.fmean(statistics.median(m.unload_s) for m in measures),
        source="profiled",
        notes={
            **dict(estimate.notes),
            "estimates": "statm",
            "repeats": repeats,
            "sample_interval_s": interval,
            "page_size": PAGE_SIZE,
        },
    )


def _profile_whole_model(
    engine: Engine,
    estimate: NetworkProfile,
    call: tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]],
    repeats: int,
    warmup: int,
    interval: float,
) -> NetworkProfile:
    """:func:`measure_profile` of a model with no unit: its one layer's execution is
    the whole forward pass (median of the timed runs), its memory the last run's peak."""
    x, kwargs = call
    times = []
    for _ in range(warmup + max(1, repeats)):
        t0 = time.perf_counter()
        engine.run_from(_ProfilingSource(engine, None, []), *x, **kwargs)
        times.append(time.perf_counter() - t0)
    sampler = StatmSampler(interval)
    try:
        sampler.start()
        engine.run_from(_ProfilingSource(engine, None, []), *x, **kwargs)
        peak = sampler.stop()
    finally:
        sampler.close()
    (whole,) = estimate.layers
    layer = replace(whole, exec_time=statistics.median(times[warmup:]), exec_memory=peak)
    return replace(
        estimate,
        layers=(layer,),
        unload_time=0.0,
        source="profiled",
        notes={**dict(estimate.notes), "estimates": "statm", "repeats": repeats,
               "sample_interval_s": interval, "page_size": PAGE_SIZE},
    )


class _ResidentSource:
    """A unit source with every unit read once and kept: the forward pass only computes."""

    def __init__(self, engine: Engine) -> None:
        self._units: list[tuple[mmap.mmap, torch.Tensor]] = []
        for i in range(len(engine.blocks)):
            buf = engine.read_unit_buffer(i)
            self._units.append((buf, torch.frombuffer(buf, dtype=torch.uint8)))

    def acquire(self, i: int) -> tuple[torch.Tensor, int]:
        return self._units[i][1], 0

    def release(self, i: int) -> None:
        pass

    def close(self) -> None:
        units, self._units = self._units, []
        for buf, tensor in units:
            del tensor
            with contextlib.suppress(BufferError):
                buf.close()


def _read_all(engine: Engine) -> None:
    """Every unit of ``engine`` read as load tasks read them, each buffer freed after."""
    for i in range(len(engine.blocks)):
        buf = engine.read_unit_buffer(i)
        with contextlib.suppress(BufferError):
            buf.close()


def _slowdown(
    foreground: Callable[[], object], background: Callable[[], object], repeats: int
) -> tuple[float, list[float], list[float]]:
    """How many times longer ``foreground`` takes while ``background`` runs in a loop on
    another thread (median of ``repeats`` each); also the alone and beside times."""
    alone: list[float] = []
    beside: list[float] = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        foreground()
        alone.append(time.perf_counter() - t0)
        stop = threading.Event()
        running = threading.Event()

        def loop(stop: threading.Event = stop, running: threading.Event = running) -> None:
            running.set()
            while not stop.is_set():  # a load generator for the measurement, not a wait
                background()

        thread = threading.Thread(target=loop, name="layerfit-contention", daemon=True)
        thread.start()
        running.wait()
        try:
            t0 = time.perf_counter()
            foreground()
            beside.append(time.perf_counter() - t0)
        finally:
            stop.set()
            thread.join()
    return statistics.median(beside) / statistics.median(alone), alone, beside


def measure_contention(directories: Sequence[str | Path], *, repeats: int = 3) -> ContentionModel:
    """Measure how loads and executions of the prepared models in ``directories`` slow
    each other down on this machine (the simulator's :class:`ContentionModel`).

    A *load* reads every unit as a load task does (a fresh aligned buffer each); an
    *execution* runs every forward pass with all units resident, with PyTorch's default
    intra-op threads as the runtime's workers have. Each is timed alone and while the
    other kind (or another copy of itself) runs in a loop on a second thread, with its
    own engines: the ratio is the slowdown beside one other task. Values below 1 (noise)
    are kept as 1; the raw ratios and times are in ``notes``.
    """
    from layerfit.engine.engine import Engine
    from layerfit.schedule.contention import ContentionModel
    from layerfit.store import example_call

    if not directories:
        raise ScheduleError("measuring contention needs at least one prepared model")
    if repeats < 1:
        raise ScheduleError(f"repeats must be at least 1, got {repeats}")
    pair = [[Engine(Path(d), pipeline="external") for d in directories] for _ in range(2)]
    nbytes = sum(block.nbytes for engine in pair[0] for block in engine.blocks)
    resident: list[list[_ResidentSource]] = []
    try:
        for engines in pair:
            for engine in engines:
                _read_all(engine)  # the first read of a unit verifies its checksum: not timed
        resident = [[_ResidentSource(engine) for engine in engines] for engines in pair]
        calls = [example_call(e.manifest) for e in pair[0]]

        def reads(engines: list[Engine]) -> Callable[[], None]:
            def run() -> None:
                for engine in engines:
                    _read_all(engine)

            return run

        def forwards(engines: list[Engine], sources: list[_ResidentSource]) -> Callable[[], None]:
            def run() -> None:
                with torch.inference_mode():
                    for engine, source, (x, kwargs) in zip(engines, sources, calls, strict=True):
                        engine.run_from(source, *x, **kwargs)

            return run

        load = [reads(engines) for engines in pair]
        execute = [forwards(engines, sources) for engines, sources in zip(pair, resident, strict=True)]
        execute[0]()  # PyTorch sets up its kernels
        execute[1]()
        measured = {
            "load_by_load": _slowdown(load[0], load[1], repeats),
            "load_by_exec": _slowdown(load[0], execute[1], repeats),
            "exec_by_load": _slowdown(execute[0], load[1], repeats),
            "exec_by_exec": _slowdown(execute[0], execute[1], repeats),
        }
    finally:
        for sources in resident:
            for source in sources:
                source.close()
        for engines in pair:
            for engine in engines:
                engine.close()
    return ContentionModel(
        **{name: max(1.0, ratio) for name, (ratio, _, _) in measured.items()},
        source="measured",
        notes={
            "repeats": repeats,
            "torch_threads": torch.get_num_threads(),
            "models": [Path(d).name for d in directories],
            "bytes_read": nbytes,
            **{
                name: {"raw": ratio, "alone_s": alone, "beside_s": beside}
                for name, (ratio, alone, beside) in measured.items()
            },
        },
    )


__all__ = [
    "StatmSampler",
    "activation_estimate_bytes",
    "activation_peak_bytes",
    "estimate_profile",
    "measure_contention",
    "measure_profile",
]
