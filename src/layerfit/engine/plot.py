"""Gantt chart of a timeline (Demand Layering Fig. 10/11) with buffer use beneath it."""

from __future__ import annotations

from pathlib import Path

from layerfit.engine.trace import STAGES, Timeline
from layerfit.extras import require
from layerfit.store.outputs import image_suffixes, save_figure


def plot_timeline(timeline: Timeline, path: str | Path, title: str | None = None) -> None:
    """Write a PNG/SVG/PDF: one row per stage, one bar per unit, occupancy below.

    The format is the extension of ``path`` (one of :func:`image_suffixes`); the image is
    written through a temporary file and a rename, so an existing one is never left
    half-written.
    """
    from layerfit.errors import OutputPathError

    if Path(path).suffix.lower() not in image_suffixes():  # before drawing anything
        raise OutputPathError(
            f"cannot write an image to {path}: end the name with one of {', '.join(image_suffixes())}"
        )
    require("matplotlib")  # the plot extra
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(
        2, 1, figsize=(12, 5), sharex=True, gridspec_kw={"height_ratios": [2, 1]}
    )
    stages = [s for s in STAGES if any(e.stage == s for e in timeline.events)]
    colours = {"read": "tab:blue", "copy": "tab:orange", "kernel": "tab:green"}
    for row, stage in enumerate(reversed(stages)):
        bars = [(e.start * 1e3, (e.end - e.start) * 1e3) for e in timeline.events if e.stage == stage]
        ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=colours[stage], edgecolor="white", linewidth=0.3)
    ax.set_yticks(range(len(stages)), list(reversed(stages)))
    ax.set_title(title or f"{timeline.pipeline}: {timeline.latency_s * 1e3:.1f} ms")
    if timeline.occupancy:
        ts = [t * 1e3 for t, _ in timeline.occupancy]
        mb = [b / 1e6 for _, b in timeline.occupancy]
        ax2.step(ts, mb, where="post", color="tab:purple")
        ax2.fill_between(ts, mb, step="post", alpha=0.3, color="tab:purple")
    ax2.axhline(timeline.budget_bytes / 1e6, color="tab:red", linestyle="--", label="budget")
    ax2.set_ylabel("weight buffer (MB)")
    ax2.set_xlabel("time (ms)")
    ax2.legend(loc="upper right")
    fig.tight_layout()
    try:
        save_figure(fig, path, dpi=120)
    finally:
        plt.close(fig)
