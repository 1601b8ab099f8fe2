"""Minimal-delay buffer size: Demand Layering's iterative search (Section V-D).

An asynchronous pipeline may use more buffer than its minimum to hide more reads
(``auto`` also keeps units resident with it, and every weight once it holds them all). The
search starts at the pipeline's minimum (resident tensors + 2 x the largest unit for
``async``), grows the budget by ``step`` up to the model size and records the delay at
each point (phase 1); phase 2 walks the points from the start and stops at the first
whose mean delay equals the minimum. Measurements are noisy, so "equals" means within
``tolerance`` of the minimum. ``patience`` optionally ends phase 1 early after that many
steps without a new minimum (not in the paper; useful for large models).

On a shared or throttling machine the speed drifts while the search runs, and the drift
can exceed the differences being searched for. ``reference`` (typically a ``preload``
engine of the same model) is then run alternately with every measurement, and each
point is scored by its *relative* delay, the fastest run over the reference's fastest
(interference only ever slows a run down, so the fastest runs show the undisturbed
cost). Not in the paper either; ``bench/demand_layering.py`` uses it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from layerfit.engine import Engine
from layerfit.engine.policies import AUTO
from layerfit.errors import LayerfitError, TradeoffError
from layerfit.extras import require


@dataclass(frozen=True)
class DelayPoint:
    """Delay measured at one budget (seconds; mean, median, min and max of repeats)."""

    budget_bytes: int
    weights_peak_bytes: int
    mean_s: float
    median_s: float
    min_s: float
    max_s: float
    relative: float | None = None  # fastest run / the reference's fastest (``reference`` given)

    @property
    def score(self) -> float:
        """What the search minimises: relative delay if measured, else mean seconds."""
        return self.mean_s if self.relative is None else self.relative


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


def timed_call(engine: Engine, inputs: tuple, keywords: Mapping[str, Any] | None = None) -> float:
    """Seconds one inference of ``engine`` on ``inputs`` (and ``keywords``) takes."""
    t0 = time.perf_counter()
    engine(*inputs, **(keywords or {}))
    return time.perf_counter() - t0


def _measure(
    engine: Engine, inputs: tuple, repeats: int, warmup: int, reference: Engine | None, keywords: Mapping[str, Any]
) -> tuple[list[float], int, float | None]:
    """Times of ``engine``, its weight peak, and its fastest run over the reference's."""
    for _ in range(warmup):
        engine(*inputs, **keywords)
    times, ref_times, peak = [], [], 0
    for _ in range(repeats):
        if reference is not None:
            ref_times.append(timed_call(reference, inputs, keywords))
        times.append(timed_call(engine, inputs, keywords))
        peak = max(peak, engine.last_weights_peak)
    relative = min(times) / min(ref_times) if ref_times else None
    return times, peak, relative


def check_search_options(tolerance: float, patience: int | None) -> None:
    """Refuse a tolerance that is not a finite number >= 0 and a negative patience."""
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not (
        math.isfinite(tolerance) and tolerance >= 0
    ):
        raise LayerfitError(
            f"the tolerance is the relative slack when matching the minimal delay: give a finite "
            f"number >= 0, e.g. --tolerance 0.01 (got {tolerance!r})"
        )
    if patience is not None and patience < 0:
        raise LayerfitError(
            f"the patience is a number of points without a new minimum: give 0 or more (0: measure the "
            f"start only), e.g. --patience 3, or leave it out to search up to --until (got {patience})"
        )


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
    reference: Engine | None = None,
    keywords: Mapping[str, Any] | None = None,
) -> DelayCurve:
    """Run the two-phase search on ``engine`` (reconfigured in place, not reloaded);
    ``reference`` scores every point relative to that engine, run alternately. Each
    inference is ``engine(*inputs, **keywords)``."""
    if engine.pipeline not in ("async", AUTO):
        raise LayerfitError(
            "the minimal-delay search needs a pipeline that uses a larger budget (async or auto), "
            f"not {engine.pipeline!r}"
        )
    if step <= 0:
        raise LayerfitError("the search step must be positive, e.g. --step 1MB")
    check_search_options(tolerance, patience)
    mem = engine.memory
    start = mem.resident_bytes + 2 * mem.largest_unit_bytes  # async's minimum with 2 or 3 stages
    # the whole model fits each buffer: one with two stages, a read and a device one with
    # three; auto holds it all in one (preload) from the model's size on
    buffers = 1 if engine.pipeline == AUTO else engine.device.stages - 1
    units_bytes = mem.total_weight_bytes - mem.resident_bytes  # the total counts resident tensors too
    stop = mem.resident_bytes + units_bytes * buffers
    if until is not None:
        stop = min(stop, max(until, start))
    points: list[DelayPoint] = []
    best, since_best = float("inf"), 0
    budget = start
    while True:
        engine.reconfigure(budget=budget)
        times, peak, relative = _measure(engine, inputs, repeats, warmup, reference, keywords or {})
        point = DelayPoint(
            budget,
            peak,
            statistics.fmean(times),
            statistics.median(times),
            min(times),
            max(times),
            relative,
        )
        points.append(point)
        if progress:
            progress(point)
        if point.score < best:
            best, since_best = point.score, 0
        else:
            since_best += 1
        if budget >= stop or (patience is not None and since_best >= patience):
            break
        budget = min(budget + step, stop)
    minimum = min(p.score for p in points)
    minimal = next(p for p in points if p.score <= minimum * (1 + tolerance))
    return DelayCurve(engine.pipeline, step, points, minimal, tolerance)


def plot_delay_curve(curve: DelayCurve, path: str | Path, title: str | None = None) -> Path:
    """Delay (mean, with min-max band) against weight memory, as the paper's Fig. 13.

    Written atomically (check the path with :func:`~layerfit.store.outputs.check_output_file`
    before a long search, to fail early).
    """
    require("matplotlib")  # the plot extra
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from layerfit.store.outputs import save_figure

    mb = [p.budget_bytes / 1e6 for p in curve.points]
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
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
    return save_figure(fig, path, error=TradeoffError, dpi=120)
