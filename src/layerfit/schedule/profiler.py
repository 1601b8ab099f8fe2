"""Profiles of prepared models: per-unit load/execute time and memory, estimated or measured.

The scheduler needs, for every unit (layer) of a prepared model, what its load, execute
and init tasks cost (:class:`~layerfit.schedule.profile.NetworkProfile`). Two sources:

- :func:`estimate_profile` — from the capture stored in the manifest, no execution:
  a load reserves exactly the unit's aligned bytes (the buffer it reads into), an
  execution its output activations, the init the resident tensors plus the peak of
  live activations of one forward pass (the network's working set, held from its init
  until it finishes, as Caffe allocates its blobs when it builds the net). Times come
  from the capture's MACs and bytes at nominal rates (:func:`profile_from_graph`).
- :func:`measure_profile` — the profiler of thesis §5.3: every unit is loaded and
  executed in isolation by one thread while a parallel thread samples the process's
  resident memory from ``/proc/self/statm``; a task's memory is its peak above the
  resident memory when it started, its time the wall-clock of the load or the kernel.
  The sampler is the one periodic loop in layerfit and runs only while profiling
  (§5.3: "it is not enabled in the framework when running normally").
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from layerfit.errors import ScheduleError
from layerfit.schedule.profile import NetworkProfile, profile_from_graph

if TYPE_CHECKING:
    from layerfit.capture.graph import ModelGraph
    from layerfit.engine.engine import Engine
    from layerfit.store.manifest import Manifest

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
STATM = "/proc/self/statm"


def activation_peak_bytes(graph: ModelGraph) -> int:
    """Largest sum of simultaneously live activation bytes over one forward pass.

    A tensor is live from the op that produces it to the last op that reads it
    (tensor usage records); views (``alias_of``) share storage and add nothing.
    """
    events: list[tuple[int, int]] = []
    for tensor in graph.tensors:
        if tensor.alias_of is not None or tensor.nbytes <= 0:
            continue
        events.append((tensor.first_op, tensor.nbytes))
        events.append((max(tensor.last_op, tensor.first_op) + 1, -tensor.nbytes))
    events.sort()  # at equal op index frees (negative) come first
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return peak


def _layer_kind(module_type: str) -> str:
    module = module_type.lower()
    return "conv" if "conv" in module else "fc" if "linear" in module else "other"


def estimate_profile(manifest: Manifest, name: str) -> NetworkProfile:
    """The scheduler's estimates for a prepared model, from its capture alone."""
    graph = manifest.graph
    base = profile_from_graph(graph, name, architecture=manifest.model.get("name"))
    if len(base.layers) != len(manifest.units):
        raise ScheduleError(
            f"model {name}: the capture has {len(base.layers)} units but the store "
            f"{len(manifest.units)} (prepare it again)"
        )
    layers = tuple(
        replace(layer, memory=segment.nbytes, kind=_layer_kind(segment.module_type))
        for layer, segment in zip(base.layers, manifest.units, strict=True)
    )
    return replace(
        base,
        layers=layers,
        init_memory=manifest.resident_bytes + activation_peak_bytes(graph),
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


class _ProfilingSource:
    """A unit source that loads each unit when the forward pass asks for it and measures both tasks."""

    def __init__(
        self, engine: Engine, sampler: StatmSampler | None, measures: list[_UnitMeasure]
    ) -> None:
        self.engine = engine
        self.sampler = sampler  # None: time only (the sampler thread would slow the run)
        self.measures = measures
        self._units: dict[int, tuple[object, torch.Tensor]] = {}
        self._exec_start = 0.0

    def acquire(self, i: int) -> tuple[torch.Tensor, int]:
        from layerfit.store.reader import aligned_buffer

        nbytes = self.engine.blocks[i].nbytes
        if self.sampler is not None:
            self.sampler.start()
        t0 = time.perf_counter()
        buf = aligned_buffer(nbytes)
        view = memoryview(buf)
        try:
            self.engine.read_unit(i, view)
        finally:
            view.release()
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
            self.measures[i].exec_s.append(elapsed)
        else:
            self.measures[i].exec_bytes.append(self.sampler.stop())
        buf, tensor = self._units.pop(i)
        del tensor
        with contextlib.suppress(BufferError):
            buf.close()  # type: ignore[attr-defined]

    def close(self) -> None:
        for buf, _ in self._units.values():
            with contextlib.suppress(BufferError):
                buf.close()  # type: ignore[attr-defined]
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

    Runs ``warmup + repeats + 1`` inferences one unit at a time: warm-up runs are
    discarded, times are medians of the ``repeats`` timed runs, memory comes from the
    last run, the only one with the sampler thread (which would slow the timed ones).
    A load's memory is at least its buffer.
    The init's memory and time come from the capture estimate (the activations are not
    one task's), as do the layer kinds.
    """
    from layerfit.engine.engine import Engine
    from layerfit.store import example_input

    directory = Path(directory)
    engine = Engine(directory, pipeline="external")
    try:
        manifest = engine.manifest
        estimate = estimate_profile(manifest, name or directory.name)
        x = (
            tuple(inputs)
            if inputs is not None
            else (example_input(manifest.input_shape, manifest.input_dtype, manifest.seed),)
        )
        measures = [_UnitMeasure() for _ in engine.blocks]
        sampler = StatmSampler(interval)
        try:
            # warm-up runs (discarded), timed runs, then one run sampling memory
            for run in range(warmup + max(1, repeats) + 1):
                sampled = run == warmup + max(1, repeats)
                source = _ProfilingSource(engine, sampler if sampled else None, measures)
                try:
                    engine.run_from(source, *x)
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
        source="profiled",
        notes={
            **dict(estimate.notes),
            "estimates": "statm",
            "repeats": repeats,
            "sample_interval_s": interval,
            "page_size": PAGE_SIZE,
        },
    )


__all__ = ["StatmSampler", "activation_peak_bytes", "estimate_profile", "measure_profile"]
