"""Shared benchmark plumbing: isolated child runs, cgroup memory, result files.

Each measured configuration runs in a fresh child process, so peak RSS belongs to that
configuration alone. Where a memory cgroup (v1) can be created (as root), the child runs
inside its own cgroup and ``cgroup_peak_bytes`` reports ``memory.max_usage_in_bytes``,
which also counts the page cache the child caused. Nothing here asserts a timing.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psutil

RESULTS = Path(__file__).parent / "results"
CGROUP_V1 = Path("/sys/fs/cgroup")


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    import torch

    return {
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "load_average_at_start": os.getloadavg(),
    }


def own_memory_cgroup() -> Path | None:
    """This process's memory cgroup directory (v1), or None."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                directory = CGROUP_V1 / "memory" / path.lstrip("/")
                return directory if (directory / "memory.usage_in_bytes").is_file() else None
    return None


class Cgroup:
    """A temporary cgroup (v1) of ``controller`` (``memory`` by default, or ``blkio``);
    ``None``-like (``available`` False) where not allowed."""

    def __init__(self, controller: str = "memory") -> None:
        self.path = CGROUP_V1 / controller / f"layerfit-bench-{uuid.uuid4().hex[:8]}"
        try:
            self.path.mkdir()
            self.available = True
        except OSError:
            self.available = False

    def enter_fn(self):
        if not self.available:
            return None
        procs = str(self.path / "cgroup.procs")

        def enter() -> None:
            with open(procs, "w") as fh:
                fh.write(str(os.getpid()))

        return enter

    def peak_bytes(self) -> int | None:
        if not self.available:
            return None
        return int((self.path / "memory.max_usage_in_bytes").read_text())

    def oom_kills(self) -> int:
        """How many processes the kernel killed for this memory cgroup's limit."""
        with contextlib.suppress(OSError, ValueError):
            for line in (self.path / "memory.oom_control").read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        return 0

    def remove(self) -> None:
        if self.available:
            with contextlib.suppress(OSError):
                self.path.rmdir()


def run_child(script: str, args: list[str], timeout: float = 1800) -> dict[str, Any]:
    """Run ``python script --child ARGS`` in its own cgroup; its last stdout line is JSON."""
    cg = Cgroup()
    try:
        proc = subprocess.run(
            [sys.executable, script, "--child", *args],
            capture_output=True, text=True, timeout=timeout, preexec_fn=cg.enter_fn(),
        )
        if proc.returncode != 0:
            return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["failed"]}
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        result["cgroup_peak_bytes"] = cg.peak_bytes()
        return result
    finally:
        cg.remove()


def write_results(name: str, data: dict[str, Any], markdown: str) -> tuple[Path, Path]:
    RESULTS.mkdir(parents=True, exist_ok=True)
    js, md = RESULTS / f"{name}.json", RESULTS / f"{name}.md"
    js.write_text(json.dumps(data, indent=2, default=str) + "\n")
    md.write_text(markdown)
    return js, md


def mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e6:.1f}"


def prepared_zoo_model(name: str, resolution: int, cache: Path) -> Path:
    """A zoo model prepared at ``resolution`` x ``resolution`` under ``cache`` (reused)."""
    from layerfit import zoo
    from layerfit.errors import LayerfitError
    from layerfit.store import prepare, read_manifest

    entry = zoo.get(name)
    shape = (*entry.input_shape[:-2], resolution, resolution)
    out = cache / f"{name}-{resolution}"
    try:
        if read_manifest(out).input_shape == shape:
            return out
    except LayerfitError:
        pass  # missing or stale: prepare it again
    prepare(name, out, input_shape=shape, force=True)
    return out


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
