"""Run an engine repeatedly and report what the user judges us by.

Latency is the median of ``repeats`` runs after ``warmup`` runs. Memory is reported
twice: the engine's own ledger (weight bytes in buffers at peak) and the operating
system's peak RSS over the measured runs. The output's shape and SHA-256 identify it
exactly, so two runs can be compared for bit-identity without saving tensors.
"""

from __future__ import annotations

import hashlib
import statistics
import time
from typing import Any

import torch

from layerfit.engine.arena import engine_activation_report
from layerfit.engine.engine import Engine
from layerfit.engine.osmem import peak_rss_bytes, reset_peak_rss


def flat_outputs(out: Any) -> list[torch.Tensor]:
    """Every tensor of a model output (tensor, tuple, list or dict), in order."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in flat_outputs(v)]
    if isinstance(out, dict):
        return [t for v in out.values() for t in flat_outputs(v)]
    return []


def output_digest(out: Any) -> str:
    """SHA-256 over the bytes of every output tensor."""
    h = hashlib.sha256()
    for t in flat_outputs(out):
        h.update(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _tokens(inputs: tuple, keywords: dict[str, Any]) -> int | None:
    """The tokens a pass takes: its integer ids (the first positional input, or
    ``input_ids``); None for a model of other inputs."""
    ids = keywords.get("input_ids", inputs[0] if inputs else None)
    if isinstance(ids, torch.Tensor) and not ids.is_floating_point() and ids.numel():
        return ids.numel()
    return None


def measure(
    engine: Engine, inputs: tuple, *, repeats: int = 3, warmup: int = 1, keywords: dict[str, Any] | None = None
) -> tuple[Any, dict[str, Any]]:
    """``(output, report)`` of running ``engine(*inputs, **keywords)`` ``warmup + repeats`` times."""
    keywords = keywords or {}
    out = None
    for _ in range(warmup):
        out = engine(*inputs, **keywords)
    reset_ok = reset_peak_rss()
    times, peaks = [], []
    timelines = []
    read_before = engine.bytes_read
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        out = engine(*inputs, **keywords)
        times.append(time.perf_counter() - t0)
        peaks.append(engine.last_weights_peak)
        if engine.last_timeline is not None:
            timelines.append(engine.last_timeline)
    outs = flat_outputs(out)
    read_per_pass = (engine.bytes_read - read_before) / max(1, repeats)
    tokens = _tokens(inputs, keywords)
    report: dict[str, Any] = {
        "model": engine.manifest.model["name"],
        "pipeline": engine.policy.name,
        "pipeline_requested": engine.pipeline,  # differs where ``auto`` chose
        "units": len(engine.blocks),
        "kept_units": len(engine.kept_units),  # resident beside the buffer (auto)
        "kept_bytes": engine.memory.kept_bytes,
        "rows_units": len(engine.rows_units),  # embedding tables read by rows
        "latency_s": statistics.median(times),
        "latency_min_s": min(times),
        "latency_max_s": max(times),
        "latencies_s": times,
        "weights_peak_bytes": max(peaks),
        "device": str(engine.device.torch_device),
        "stages": engine.device.stages,
        "compute_threads": torch.get_num_threads(),  # the output's last bits depend on it
        "weight_buffer_bytes": engine.memory.weight_bytes,
        "device_buffer_bytes": engine.memory.device_buffer_bytes,
        "weights_total_bytes": engine.memory.total_weight_bytes,
        "largest_unit_bytes": engine.memory.largest_unit_bytes,
        "resident_bytes": engine.memory.resident_bytes,
        "rss_peak_bytes": peak_rss_bytes(),
        "rss_peak_reset": reset_ok,
        "io_mode": engine.io_mode,
        "coalesce_bytes": engine.config.coalesce_bytes,
        "output_shape": [list(t.shape) for t in outs] if len(outs) != 1 else list(outs[0].shape),
        "output_sha256": output_digest(out),
        "read_bytes_per_pass": read_per_pass,  # from storage (a quantized model's blocks as stored)
        "read_bytes_per_token": read_per_pass / tokens if tokens else None,
        # the process's footprint beside the weights, where a memory limit bounds it
        "memory_limit": None if engine.footprint is None else engine.footprint.to_dict(),
    }
    report.update(engine_activation_report(engine))
    if timelines:
        median_tl = sorted(timelines, key=lambda t: t.latency_s)[len(timelines) // 2]
        report["read_s"] = median_tl.stage_total("read")
        report["copy_s"] = median_tl.stage_total("copy")
        report["kernel_s"] = median_tl.stage_total("kernel")
    return out, report
