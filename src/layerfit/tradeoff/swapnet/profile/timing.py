"""Timing one prepared model on this device, layer by layer: :func:`measure_model`.

Each layer's read (direct I/O, as the engine reads), its bind and unbind on a meta
skeleton (exactly the engine's functions) and its kernel (the engine's ``preload``
timeline), and the "glue" between two layers' kernels (the non-parametric operators -
activations, adds, pooling - that belong to no layer but run on the same thread).
Every time is the median over ``repeats`` runs.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from layerfit.engine import load
from layerfit.engine.skeleton import bind, build_skeleton, segment_bindings, unbind
from layerfit.errors import ProfileError
from layerfit.store import SegmentReader, aligned_buffer, example_call, read_manifest
from layerfit.store.manifest import Manifest
from layerfit.tradeoff.swapnet.profile.device import model_key
from layerfit.tradeoff.swapnet.profile.records import LayerTimes

BIND_SAMPLES = 8  # bind/unbind take microseconds: time several per repeat


def _median(samples: list[list[float]]) -> list[float]:
    return [statistics.median(col) for col in zip(*samples, strict=True)] if samples else []


def _time_reads(directory: Path, manifest: Manifest, repeats: int) -> list[float]:
    units = manifest.units
    buf = aligned_buffer(max(u.nbytes for u in units))
    view = memoryview(buf)
    samples = []
    try:
        with SegmentReader(directory / manifest.weights_file, manifest.weights_size) as reader:
            for _ in range(repeats):
                row = []
                for u in units:
                    t0 = time.perf_counter()
                    reader.read(u, view)
                    row.append(time.perf_counter() - t0)
                samples.append(row)
    finally:
        view.release()
        buf.close()
    return _median(samples)


def _time_binding(manifest: Manifest, repeats: int) -> tuple[list[float], list[float]]:
    model = build_skeleton(manifest)
    largest = max(u.nbytes for u in manifest.units)
    raw = aligned_buffer(largest)
    buffer = torch.frombuffer(raw, dtype=torch.uint8)
    binds: list[list[float]] = []
    unbinds: list[list[float]] = []
    bindings = [segment_bindings(model, u) for u in manifest.units]
    for _ in range(repeats * BIND_SAMPLES):
        row_b, row_u = [], []
        for b in bindings:
            t0 = time.perf_counter()
            bind(b, buffer, 0)
            t1 = time.perf_counter()
            unbind(b)
            t2 = time.perf_counter()
            row_b.append(t1 - t0)
            row_u.append(t2 - t1)
        binds.append(row_b)
        unbinds.append(row_u)
    del buffer, bindings, model
    return _median(binds), _median(unbinds)


def _time_kernels(
    directory: Path, manifest: Manifest, repeats: int, warmup: int
) -> tuple[list[float], list[float], float, float, float]:
    """Kernel and glue per layer (``preload`` timeline), and both latencies.

    Runs with every weight resident alternate with runs streaming layer by layer with a
    buffer for the whole model, so that drifting load on the machine affects both alike;
    the streaming latency is the resident one plus the median paired difference.
    """
    x, kwargs = example_call(manifest)  # one input, or each keyword argument it was prepared from
    kernels, glues, tails, latencies, extra = [], [], [], [], []
    with (
        load(directory, pipeline="preload", trace=True) as engine,
        load(directory, pipeline="async", units="layers", budget=manifest.total_bytes) as stream,
    ):
        for _ in range(warmup):
            engine(*x, **kwargs)
            stream(*x, **kwargs)
        for _ in range(repeats):
            engine(*x, **kwargs)
            tl = engine.last_timeline
            t0 = time.perf_counter()
            stream(*x, **kwargs)
            extra.append(time.perf_counter() - t0 - tl.latency_s)
            events = sorted((e for e in tl.events if e.stage == "kernel"), key=lambda e: e.unit)
            if len(events) != len(manifest.units):
                raise ProfileError(
                    f"{directory}: the preload run traced {len(events)} of {len(manifest.units)} layers"
                )
            kernels.append([e.end - e.start for e in events])
            ends = [0.0] + [e.end for e in events[:-1]]
            glues.append([max(e.start - end, 0.0) for e, end in zip(events, ends, strict=True)])
            tails.append(max(tl.latency_s - events[-1].end, 0.0))
            latencies.append(tl.latency_s)
    latency = statistics.median(latencies)
    return _median(kernels), _median(glues), statistics.median(tails), latency, latency + statistics.median(extra)


def measure_model(directory: str | Path, *, repeats: int = 5, warmup: int = 1) -> LayerTimes:
    """Median read, bind, unbind, kernel and glue time of every layer of a prepared model."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    if not manifest.units:
        raise ProfileError(f"{directory} has no streamed layers to profile")
    repeats = max(1, repeats)
    reads = _time_reads(directory, manifest, repeats)
    binds, unbinds = _time_binding(manifest, repeats)
    kernels, glues, tail, latency, stream = _time_kernels(directory, manifest, repeats, warmup)
    units = manifest.units
    return LayerTimes(
        key=model_key(manifest),
        name=str(manifest.model["name"]),
        input_shape=tuple(manifest.input_shape),
        layer_names=[u.name for u in units],
        nbytes=[u.nbytes for u in units],
        payload_bytes=[u.payload_bytes for u in units],
        d=[u.d for u in units],
        f=[u.f for u in units],
        read_s=reads,
        bind_s=binds,
        unbind_s=unbinds,
        kernel_s=kernels,
        glue_s=glues,
        tail_s=tail,
        latency_s=latency,
        stream_latency_s=stream,
    )
