"""Minimal-delay buffer size: Demand Layering's iterative search (Section V-D).

An asynchronous pipeline may use more buffer than its minimum to hide more reads. The
search starts at the pipeline's minimum (resident tensors + 2 x the largest unit for
``async``), grows the budget by ``step`` up to the model size and records the delay at
each point (phase 1); phase 2 walks the points from the start and stops at the first
whose mean delay equals the minimum. Measurements are noisy, so "equals" means within
``tolerance`` of the minimum. ``patience`` optionally ends phase 1 early after that many
steps without a new minimum (not in the paper; useful for large models).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from layerfit.engine import Engine
from layerfit.errors import LayerfitError


@dataclass(frozen=True)
class DelayPoint:
    """Delay measured at one budget (seconds; mean, median, min and max of repeats)."""

    budget_bytes: int
    weights_peak_bytes: int
    mean_s: float
    median_s: float
    min_s: float
    max_s: float


@dataclass
class DelayCurve:
    """Phase-1 points and the minimal-delay configuration chosen in phase 2."""

    pipeline: str
    step_bytes: int
    points: list[DelayPoint]
    minimal: DelayPoint
    tolerance: float
    preload_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "step_bytes": self.step_bytes,
            "tolerance": self.tolerance,
            "preload_s": self.preload_s,
            "minimal": asdict(self.minimal),
            "points": [asdict(p) for p in self.points],
            **self.extra,
        }


def _measure(engine: Engine, inputs: tuple, repeats: int, warmup: int) -> tuple[list[float], int]:
    for _ in range(warmup):
        engine(*inputs)
    times, peak = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        engine(*inputs)
        times.append(time.perf_counter() - t0)
        peak = max(peak, engine.last_weights_peak)
    return times, peak


def minimal_delay_search(
    engine: Engine,
    inputs: tuple,
    *,
    step: int = 1_000_000,
    repeats: int = 3,
    warmup: int = 1,
    until: int | None = None,
    patience: int | None = None,
    tolerance: float = 0.01,
    progress: Callable[[DelayPoint], None] | None = None,
) -> DelayCurve:
    """Run the two-phase search on ``engine`` (reconfigured in place, not reloaded)."""
    if engine.policy.name not in ("async",):
        raise LayerfitError(
            f"the minimal-delay search needs a pipeline whose buffer can grow (async), not {engine.policy.name!r}"
        )
    if step <= 0:
        raise LayerfitError("the search step must be positive, e.g. --step 1MB")
    mem = engine.memory
    start = mem.resident_bytes + 2 * mem.largest_unit_bytes
    stop = mem.resident_bytes + mem.total_weight_bytes
    if until is not None:
        stop = min(stop, max(until, start))
    points: list[DelayPoint] = []
    best, since_best = float("inf"), 0
    budget = start
    while True:
        engine.reconfigure(budget=budget)
        times, peak = _measure(engine, inputs, repeats, warmup)
        point = DelayPoint(
            budget, peak, statistics.fmean(times), statistics.median(times), min(times), max(times)
        )
        points.append(point)
        if progress:
            progress(point)
        if point.mean_s < best:
            best, since_best = point.mean_s, 0
        else:
            since_best += 1
        if budget >= stop or (patience is not None and since_best >= patience):
            break
        budget = min(budget + step, stop)
    minimum = min(p.mean_s for p in points)
    minimal = next(p for p in points if p.mean_s <= minimum * (1 + tolerance))
    return DelayCurve(engine.policy.name, step, points, minimal, tolerance)


def plot_delay_curve(curve: DelayCurve, path: str | Path, title: str | None = None) -> None:
    """Delay (mean, with min-max band) against weight memory, as the paper's Fig. 13."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mb = [p.budget_bytes / 1e6 for p in curve.points]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(mb, [p.mean_s * 1e3 for p in curve.points], color="tab:blue", label=f"{curve.pipeline} (mean)")
    ax.fill_between(
        mb, [p.min_s * 1e3 for p in curve.points], [p.max_s * 1e3 for p in curve.points],
        alpha=0.25, color="tab:blue", label="min-max",
    )
    ax.scatter([curve.minimal.budget_bytes / 1e6], [curve.minimal.mean_s * 1e3], color="tab:red", zorder=3,
               label=f"minimal delay ({curve.minimal.budget_bytes / 1e6:.1f} MB)")
    if curve.preload_s is not None:
        ax.axhline(curve.preload_s * 1e3, color="black", linestyle="--", label="preload (optimal)")
    ax.set_xlabel("weight memory (MB)")
    ax.set_ylabel("delay (ms)")
    ax.set_title(title or "minimal-delay search")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
