"""``layerfit tradeoff parts`` past its options: the constraints the command line adds to the
application file's, then Algorithm 2, and the table, sentences and plot of its result.
Imported when the command runs (it needs the ``tradeoff`` extra), not with the command
line."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from layerfit.errors import BudgetError, TradeoffError
from layerfit.extras import require
from layerfit.sizes import format_bytes, parse_bytes
from layerfit.store.outputs import save_figure
from layerfit.tradeoff.parts.appfile import load_application, parse_throughput
from layerfit.tradeoff.parts.search import Evaluation, GAParams, TradeoffResult, reduce_buffers
from layerfit.tradeoff.parts.throughput import estimator_for


def parse_throughput_options(values: Sequence[str], cnn_names: set[str]) -> dict[str, float]:
    """``--throughput 40`` (every CNN) or ``--throughput name=40`` (repeatable)."""
    result: dict[str, float] = {}
    for value in values:
        name, sep, fps = value.partition("=")
        try:
            number = float(fps if sep else name)
        except ValueError:
            raise TradeoffError(f"--throughput {value!r}: expected a number of fps or CNN=fps") from None
        if sep:
            result.update(parse_throughput({name: number}, cnn_names, "--throughput"))
        else:
            result.update(parse_throughput(number, cnn_names, "--throughput"))
    return result


def run_parts_command(
    app_file: str,
    memory: str | None,
    throughput: Sequence[str],
    model_throughput: bool,
    generations: int,
    population: int,
    seed: int,
    select: str,
    phase_rows: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[TradeoffResult, list[str], list[dict[str, Any]]]:
    """Load the application, apply command-line constraints over the file's, search
    (``progress(done, total)`` after each GA generation)."""
    app, constraints = load_application(app_file)
    if memory is not None:
        try:
            constraints = replace(constraints, memory=parse_bytes(memory))
        except BudgetError as exc:
            raise TradeoffError(f"--budget: {exc}") from exc
    if throughput:
        merged = dict(constraints.throughput)
        merged.update(parse_throughput_options(throughput, {c.name for c in app.cnns}))
        constraints = replace(constraints, throughput=merged)
    if constraints.memory is None:
        raise TradeoffError("no memory constraint: pass --budget (e.g. 15MB) or set constraints.memory in the file")
    if select not in ("throughput", "memory"):
        raise TradeoffError(f"--select: expected 'throughput' or 'memory', got {select!r}")
    result = reduce_buffers(
        app,
        constraints,
        estimator_for(app, model_throughput, phase_rows),
        GAParams(population=population, generations=generations, seed=seed),
        select=select,  # type: ignore[arg-type]
        phase_rows=phase_rows,
        progress=progress,
    )
    return result, describe(result), summary_rows(result)


def summary_rows(result: TradeoffResult) -> list[dict[str, Any]]:
    """One row per configuration: the baselines and the chosen one."""
    labels = {
        "no_reduction": "no reduction",
        "reuse_only": "buffer reuse only",
        "all_parts": "all layers by parts, no reuse [17]",
        "all_parts_reuse": "all layers by parts + reuse",
    }
    rows = [_row(labels[k], e) for k, e in result.baselines.items()]
    rows.append(_row("chosen" + (" (early exit)" if result.early_exit else ""), result.chosen))
    return rows


def _row(label: str, e: Evaluation) -> dict[str, Any]:
    return {
        "configuration": label,
        "memory": format_bytes(e.memory.total),
        "buffers": format_bytes(e.memory.buffers),
        "throughput": ", ".join(f"{c} {t:.1f} fps" for c, t in e.throughput.items()),
        "by_parts": e.parts,
    }


def plot_pareto(result: TradeoffResult, path: str | Path) -> Path:
    """Memory vs throughput of every Pareto point, baselines and constraints, as a PNG."""
    require("matplotlib")  # the plot extra
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    path = Path(path)
    cnns = list(result.chosen.throughput)
    fig = Figure(figsize=(6.4, 4.2))
    ax = fig.add_subplot()
    for cnn in cnns:
        xs = [e.memory.total / 1e6 for e in result.pareto]
        ys = [e.throughput[cnn] for e in result.pareto]
        ax.plot(xs, ys, "o-", ms=4, label=f"Pareto front ({cnn})" if len(cnns) > 1 else "Pareto front")
        ax.plot([result.chosen.memory.total / 1e6], [result.chosen.throughput[cnn]], "*", ms=14, color="C3")
    for key, marker in (("no_reduction", "s"), ("reuse_only", "^"), ("all_parts", "v")):
        e = result.baselines[key]
        ax.plot([e.memory.total / 1e6], [e.throughput[cnns[0]]], marker, ms=7, label=key.replace("_", " "))
    if result.constraints.memory is not None:
        ax.axvline(result.constraints.memory / 1e6, color="grey", ls="--", lw=1, label="memory constraint")
    for fps in result.constraints.throughput.values():
        if fps > 0:
            ax.axhline(fps, color="grey", ls=":", lw=1)
    ax.set_xlabel("memory (MB)")
    ax.set_ylabel("throughput (fps)")
    ax.set_title(f"{result.derived.app.name}: memory vs throughput (chosen: *)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path, error=TradeoffError, dpi=110)


def describe(result: TradeoffResult) -> list[str]:
    """Plain sentences: what was chosen, and which constraints fail by how much."""
    lines = []
    chosen = result.chosen
    if result.early_exit:
        lines.append(f"buffer reuse alone fits: {format_bytes(chosen.memory.total)}, no layer processes by parts")
    elif result.feasible:
        lines.append(
            f"{chosen.parts} layer(s) process by parts: {format_bytes(chosen.memory.total)} "
            f"({result.evaluations} configurations evaluated)"
        )
    else:
        lines.append(f"constraints cannot all be met; least-memory Pareto point: {format_bytes(chosen.memory.total)}")
        lines.extend(v.message() for v in result.violations)
    return lines
