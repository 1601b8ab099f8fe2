"""Pictures of a run: memory over time against the budget, and the tasks on each worker."""

from __future__ import annotations

from pathlib import Path

from layerfit.errors import ScheduleError
from layerfit.extras import require
from layerfit.schedule.report import RunReport
from layerfit.store.outputs import save_figure

_COLOURS = {"INIT": "#9e9e9e", "LOAD": "#4e79a7", "EXEC": "#f28e2b", "UNLOAD": "#76b7b2"}


def plot_run(report: RunReport, path: str | Path, title: str | None = None) -> Path:
    """Save a two-panel figure: ledger and resident memory over time, and a worker Gantt chart."""
    require("matplotlib")  # the plot extra
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (mem_ax, gantt_ax) = plt.subplots(
        2, 1, figsize=(11, 6.5), sharex=True, gridspec_kw={"height_ratios": [1.2, 1]}
    )
    mib = 1024 * 1024
    for series, label, style in (
        (report.memory, "ledger (estimates)", "-"),
        (report.resident, "resident (actual)", "--"),
    ):
        if series:
            times = [t for t, _ in series]
            used = [u / mib for _, u in series]
            mem_ax.step(times, used, where="post", linestyle=style, linewidth=0.9, label=label)
    mem_ax.axhline(report.budget / mib, color="red", linewidth=0.8, label="budget")
    if report.physical_memory != report.budget:
        mem_ax.axhline(
            report.physical_memory / mib,
            color="purple",
            linewidth=0.8,
            linestyle=":",
            label="physical",
        )
    mem_ax.set_ylabel("memory (MiB)")
    mem_ax.legend(loc="upper right", fontsize=7)
    for kind, colour in _COLOURS.items():
        for worker in range(report.workers):
            spans = [
                (t.start, t.end - t.start)
                for t in report.tasks
                if t.worker == worker and t.kind == kind
            ]
            if spans:
                gantt_ax.broken_barh(spans, (worker - 0.4, 0.8), facecolors=colour, linewidth=0)
    for kind, colour in _COLOURS.items():
        gantt_ax.bar(0, 0, color=colour, label=kind.lower())
    gantt_ax.set_yticks(range(report.workers), [f"worker {w}" for w in range(report.workers)])
    gantt_ax.set_xlabel("time (s)")
    gantt_ax.legend(loc="upper right", fontsize=7, ncol=4)
    mean = report.response_stats()["mean"]
    fig.suptitle(
        title
        or f"{report.workload}: {report.policy}, {report.workers} workers, budget {report.budget / mib:.0f} MiB — "
        + ("no job completed" if mean is None else f"mean response {mean:.2f} s")
    )
    return save_figure(fig, path, error=ScheduleError, close=True, dpi=130, bbox_inches="tight")
