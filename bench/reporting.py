"""What a bench reports: the machine and commit it measured, result files, progress, sizes in MB,
and a timing's overhead stated with its noise (paired rounds, CPU steal).

Imports nothing beyond the standard library at load, so a child running in another virtual
environment (bench/vs_mmap.py's llama.cpp) uses it too. Nothing here asserts a timing.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def layerfit_commit() -> str | None:
    """The commit of the code measured (``-dirty`` when ``src/`` differs from it), or None
    outside a git checkout: a result says which defaults and which code it measured."""
    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "src"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return rev + ("-dirty" if changed else "")


def machine() -> dict[str, Any]:
    """What the numbers were measured on, and the commit of the code measured."""
    import psutil
    import torch

    return {
        "layerfit_commit": layerfit_commit(),
        "cpu": platform.processor() or platform.machine(),
        **cpu_model(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "load_average_at_start": os.getloadavg(),
    }


#: the CPU features PyTorch's and llama.cpp's kernels dispatch on (x86 and Arm)
SIMD_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8", "avx_vnni", "asimd", "sve")


def cpu_model() -> dict[str, Any]:
    """The CPU's model name and its SIMD features from ``/proc/cpuinfo`` (Linux; nothing
    elsewhere): the same machine name can hide CPUs whose kernels differ several times in
    speed (PyTorch's bf16 and int4 kernels on an AVX2-only EPYC against an AVX-512 one)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    return {"cpu_model": fields.get("model name", fields.get("CPU part", "")),
            "cpu_simd": [f for f in SIMD_FLAGS if f in flags]}


def write_results(name: str, data: dict[str, Any], markdown: str) -> tuple[Path, Path]:
    RESULTS.mkdir(parents=True, exist_ok=True)
    js, md = RESULTS / f"{name}.json", RESULTS / f"{name}.md"
    js.write_text(json.dumps(data, indent=2, default=str) + "\n")
    md.write_text(markdown)
    return js, md


def progress(items: Any, label: str, total: int | None = None) -> Any:
    """``items`` one by one, with a bar labelled ``label`` on stderr where it is a terminal
    (layerfit.console.track): nothing where the output is piped or logged, nor in a child
    whose environment has no layerfit (its items, plainly)."""
    try:
        from layerfit.console import track
    except ImportError:
        return items
    return track(items, label, total=total)


def mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e6:.1f}"


def paired_overhead(times: list[float], reference: list[float], seed: int = 0) -> dict[str, float]:
    """Median of per-round ratios ``times[k] / reference[k] - 1`` with a 90 % bootstrap
    interval, and the ratio of the fastest runs. Rounds run the configurations back to
    back, so slow drift of a shared machine cancels in each ratio; interference only ever
    slows a run down, so the fastest runs show what each configuration costs undisturbed."""
    import random
    import statistics

    ratios = [t / r for t, r in zip(times, reference, strict=True)]
    rnd = random.Random(seed)
    boot = sorted(statistics.median(rnd.choices(ratios, k=len(ratios))) for _ in range(2000))
    return {
        "median": statistics.median(ratios) - 1,
        "ci90_low": boot[100] - 1,
        "ci90_high": boot[1899] - 1,
        "min_ratio": min(times) / min(reference) - 1,
        "rounds": len(ratios),
    }


class StealMeter:
    """Share of CPU time the hypervisor gave to others (``steal`` in /proc/stat) and the
    load average, over a measured stretch: says how quiet the machine was."""

    def __init__(self) -> None:
        self.start = self._read()

    @staticmethod
    def _read() -> tuple[int, int]:
        try:
            fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        except (OSError, ValueError):
            return 0, 0
        return (fields[7] if len(fields) > 7 else 0), sum(fields)

    def stop(self) -> dict[str, float]:
        steal, total = self._read()
        d_total = total - self.start[1]
        return {
            "steal_share": (steal - self.start[0]) / d_total if d_total > 0 else 0.0,
            "load_average_1m": os.getloadavg()[0],
        }

