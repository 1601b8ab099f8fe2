"""``layerfit tradeoff parts|delay``, ``profile`` and ``partition``: memory-throughput
trade-offs (Minakova & Stefanov), the minimal-delay budget (Demand Layering) and SwapNet."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from layerfit.cli.app import app, console, print_json, print_warnings, renamed_option
from layerfit.cli.engine_options import ENGINE_OPTIONS, EngineOptions, engine_options
from layerfit.engine.openmp import set_compute_threads

if TYPE_CHECKING:
    pass

# --- tradeoff (Minakova & Stefanov: buffer reuse, processing by parts, genetic search) ---
tradeoff_app = typer.Typer(
    help="Memory-throughput trade-offs: buffer reuse, processing by parts, pipelines.",
    no_args_is_help=True,
)
app.add_typer(tradeoff_app, name="tradeoff")


@tradeoff_app.command("parts")
def tradeoff_parts(
    app_file: str = typer.Argument(..., help="Application YAML file (CNNs, partitions, constraints)."),
    budget: str | None = typer.Option(None, "--budget", help="Memory constraint M^c, e.g. 15MB."),
    memory: str | None = typer.Option(None, "--memory", hidden=True),
    throughput: list[str] | None = typer.Option(  # noqa: B008 (typer reads defaults)
        None, "--throughput", help="Throughput constraint: fps for every CNN (40) or CNN=fps; repeatable."
    ),
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    plot: bool = typer.Option(False, "--plot", help="Write the Pareto front to <APP>-pareto.png."),
    force: bool = typer.Option(False, "--force", help="Replace an existing <APP>-pareto.png."),
    model_throughput: bool = typer.Option(
        False, "--model-throughput", help="Use the analytic delay model instead of measuring."
    ),
    generations: int = typer.Option(30, "--generations", min=1, help="GA generations."),
    population: int = typer.Option(40, "--population", min=4, help="GA population size."),
    seed: int = typer.Option(0, "--seed", help="GA seed."),
    select: str = typer.Option("throughput", "--select", help="Among feasible points: throughput or memory."),
    threads: int | None = typer.Option(
        None, "--threads", help="PyTorch intra-op threads while measuring (default: PyTorch's)."
    ),
    phase_rows: int = typer.Option(1, "--phase-rows", min=1, help="Rows per phase of by-parts layers (paper: 1)."),
) -> None:
    """Choose which layers process by parts so the application fits (Algorithm 2)."""
    from pathlib import Path

    from layerfit.cli.parts_search import run_parts_command

    plot_path = None
    if plot:  # checked before the search, which may take minutes
        from layerfit.errors import OutputPathError
        from layerfit.store.outputs import check_output_file

        plot_path = Path(Path(app_file).stem + "-pareto.png")
        try:
            check_output_file(plot_path, force=force, option="--plot", image=True)
        except OutputPathError as exc:  # the user did not choose the name: say where it comes from
            raise OutputPathError(f"{exc} (--plot writes <APP>-pareto.png in the current folder)") from None
    set_compute_threads(threads, "--threads")
    from layerfit.console import progress_bar

    with progress_bar("GA generations", total=generations, disable=json_output, output=console) as bar:
        result, lines, rows = run_parts_command(
            app_file, renamed_option(budget, "--budget", memory, "--memory"), throughput or [], model_throughput,
            generations, population, seed, select, phase_rows,
            progress=lambda done, total: bar.update(completed=done, total=total),
        )
    if plot_path is not None:
        from layerfit.cli.parts_search import plot_pareto

        lines.append(f"plot written to {plot_pareto(result, plot_path)}")
    if json_output:
        print_json(result.to_dict())
    else:
        from layerfit.console import table as new_table

        columns = ("configuration", "memory", "buffers", "throughput", "by_parts")
        table = new_table(*columns, title=f"{result.derived.app.name}: memory-throughput trade-off")
        for row in rows:
            table.add_row(*(str(row[c]) for c in columns))
        console.print(table)
        for line in lines:
            console.print(line, highlight=False)
    if not result.feasible:
        from layerfit.errors import TradeoffError

        raise TradeoffError("; ".join(v.message() for v in result.violations))


# --- SwapNet (profile, partition): delay model, block partition under a budget ----------




@app.command("profile")
def profile_command(
    directories: list[str] = typer.Argument(..., help="prepared model directories to profile"),  # noqa: B008
    repeats: int = typer.Option(5, "--repeats", min=1, help="timed runs per measurement (medians)"),
    warmup: int = typer.Option(1, "--warmup", min=0),
    profile: str = typer.Option(None, "--profile", help="device profile file (default ~/.cache/layerfit/device-profile.json)"),
    replace: bool = typer.Option(False, "--replace", help="forget models profiled before instead of adding to them"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Measure per-layer read/bind/kernel/unbind times and fit SwapNet's delay model."""
    import warnings

    from layerfit.console import progress_bar
    from layerfit.tradeoff.swapnet.profile import (
        check_profile_target,
        default_profile_path,
        previous_profile,
        profile_models,
    )

    path = check_profile_target(profile or default_profile_path())  # before measuring
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        previous = None if replace else previous_profile(path)
    print_warnings(caught)

    def measured(t) -> None:  # a line per model, and the bar on to the next
        bar.print(
            f"  {t.name} {tuple(t.input_shape)}: {len(t.nbytes)} layers, resident run "
            f"{t.latency_s * 1e3:.1f} ms, streamed {t.stream_latency_s * 1e3:.1f} ms", highlight=False)
        bar.advance()

    with progress_bar("profiling models", total=len(directories), disable=as_json, output=console) as bar:
        result = profile_models(
            directories, repeats=repeats, warmup=warmup, previous=previous, progress=None if as_json else measured,
        )
    written = result.save(path)
    summary = result.summary()
    summary["path"] = str(written)
    if as_json:
        print_json(summary)
        return
    f = result.fits
    console.print(
        f"device profile written to {written} ({len(result.models)} models)\n"
        f"  t_in  = alpha*s + beta*d + kappa: alpha {result.alpha:.3e} s/B, beta {result.beta:.3e} s/tensor, "
        f"kappa {result.kappa_read:.3e} s/block   R2 {f['t_in'].r2:.3f} "
        f"(paper's form without kappa: R2 {f['t_in_paper'].r2:.3f})\n"
        f"  t_ex  = gamma*f: gamma {result.gamma:.3e} s/MAC   R2 {f['t_ex'].r2:.3f}  (glue ratio {result.glue_ratio:.3f})\n"
        f"  t_out = eta*d: eta {result.eta:.3e} s/tensor   R2 {f['t_out'].r2:.3f}\n"
        f"  block hand-over {result.kappa_exec * 1e3:.3f} ms/block; profiled models are predicted from "
        "their measured per-layer times, others from the regression",
        highlight=False,
    )


@app.command("partition")
def partition_command(
    directory: str = typer.Argument(..., help="prepared model directory"),
    budget: str = typer.Option(..., "--budget", help="memory budget of the model in all, e.g. 100MB"),
    profile: str = typer.Option(None, "--profile", help="device profile file (default ~/.cache/layerfit/device-profile.json)"),
    measure_latency: bool = typer.Option(True, "--measure/--no-measure", help="run the chosen partition"),
    repeats: int = typer.Option(3, "--repeats", min=1),
    warmup: int = typer.Option(1, "--warmup", min=0),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Choose SwapNet's block partition for a budget: lookup tables and exact optimum."""
    import warnings

    from layerfit.sizes import format_bytes
    from layerfit.tradeoff.swapnet.model import partition_report

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            rep = partition_report(
                directory, budget, profile_path=profile, measure_latency=measure_latency, repeats=repeats, warmup=warmup
            )
        finally:
            print_warnings(caught)
    if as_json:
        print_json(rep)
        return
    d, r = rep["decision"], rep["reserve"]
    lines = [
        f"[bold]{rep['model']}[/]: budget {format_bytes(d['budget_bytes'])}, reserve {format_bytes(r['total_bytes'])} "
        f"(delta {d['delta']:.1%}: skeleton {format_bytes(r['skeleton_bytes'])}, activations "
        f"{format_bytes(r['activation_bytes'])}, tables {format_bytes(r['table_bytes'])}, resident "
        f"{format_bytes(r['resident_bytes'])}); two blocks may hold {format_bytes(d['capacity_bytes'])}; "
        f"minimum budget {format_bytes(rep['minimum_budget_bytes'])}; execution times {rep['exec_source']}",
    ]
    if d["pipeline"] == "preload":
        lines.append(f"the model fits ({format_bytes(rep['demand_bytes'])} with the reserve): every weight resident, "
                     f"predicted {d['predicted_s'] * 1e3:.1f} ms")
    else:
        rows = sum(t["rows"] for t in rep["tables"])
        lines.append(
            f"lookup tables: {len(rep['tables'])} block counts, {rows} rows, "
            f"{format_bytes(sum(t['bytes'] for t in rep['tables']))}, built in {rep['tables_build_s']:.2f} s; "
            f"paper's n = ceil(2s/b) = {d['paper_blocks']}"
        )
        lines.append(
            f"  table choice: {d['blocks']} blocks at {d['points']}, largest pair {format_bytes(d['max_pair_bytes'])}, "
            f"predicted {d['predicted_s'] * 1e3:.1f} ms (lookup {d['lookup_s'] * 1e3:.2f} ms)"
        )
        dp = rep["dp"]
        lines.append(
            f"  exact DP:     {dp['blocks']} blocks at {dp['points']}, largest pair {format_bytes(dp['max_pair_bytes'])}, "
            f"predicted {dp['predicted_s'] * 1e3:.1f} ms ({dp['seconds']:.2f} s)"
        )
    for key, label in (("chosen", "chosen partition"), ("dp", "DP partition"), ("direct", "all weights resident")):
        m = rep.get("measured", {}).get(key)
        if m is None:
            continue
        pred = {"chosen": d["predicted_s"], "dp": (rep["dp"] or {}).get("predicted_s"), "direct": m.get("predicted_s")}[key]
        lines.append(
            f"  measured {label}: {m['latency_s'] * 1e3:.1f} ms (predicted {pred * 1e3:.1f} ms, "
            f"{m['latency_s'] / pred - 1:+.1%}), peak {format_bytes(m['accounted_peak_bytes'])} accounted"
        )
    for line in lines:
        console.print(line, highlight=False)


@tradeoff_app.command("delay")
@engine_options("pipeline", "device", "stages")  # the search grows the budget of auto or async (the paper's)
def tradeoff_delay(
    directory: str = typer.Argument(..., help="prepared model directory"),
    options: EngineOptions = ENGINE_OPTIONS,  # --pipeline, --device, --stages (engine_options)
    step: str = typer.Option("1MB", "--step", help="budget increment per point, e.g. 1MB or 5% of the weights"),
    repeats: int = typer.Option(3, "--repeats", min=1),
    warmup: int = typer.Option(1, "--warmup", min=0),
    until: str = typer.Option(None, "--until", help="stop phase 1 at this budget, e.g. 40MB or 60% (default: model size)"),
    patience: int = typer.Option(None, "--patience", help="stop phase 1 after N points without a new minimum"),
    tolerance: float = typer.Option(0.01, "--tolerance", help="relative slack when matching the minimum"),
    as_json: bool = typer.Option(False, "--json"),
    plot: str = typer.Option(None, "--plot", help="write the delay-memory curve (Fig. 13) here"),
    force: bool = typer.Option(False, "--force", help="replace an existing --plot image"),
) -> None:
    """Find the minimal-delay buffer size by growing the budget (Demand Layering V-D)."""
    from layerfit.console import progress_bar
    from layerfit.engine import load
    from layerfit.sizes import format_bytes, parse_budget
    from layerfit.store import read_manifest
    from layerfit.store.outputs import check_output_file
    from layerfit.tradeoff.delay import (
        check_search_options,
        minimal_delay_search,
        plot_delay_curve,
        timed_call,
    )

    check_search_options(tolerance, patience)  # before loading and measuring anything
    if plot:
        check_output_file(plot, force=force, option="--plot", image=True)
    weights = read_manifest(directory).total_bytes  # what a share (--step 5%) is of
    step_bytes = parse_budget(step, weights)
    until_bytes = None if until is None else parse_budget(until, weights)
    def measured(p) -> None:  # a line per budget (the curve), and the bar on to the next
        bar.print(
            f"  {format_bytes(p.budget_bytes):>10}  {p.mean_s * 1e3:9.1f} ms  "
            f"[{p.min_s * 1e3:.1f} - {p.max_s * 1e3:.1f}]", highlight=False)
        bar.update(advance=1, description=f"minimal-delay search: {format_bytes(p.budget_bytes)} measured")

    # the number of budgets is known only as the search goes (--patience stops it early)
    with progress_bar("minimal-delay search", disable=as_json, output=console) as bar:
        with load(directory, options.config()) as searched:
            # imported here: models' commands register after these
            from layerfit.cli.models import device_call

            args, keywords = device_call(None, searched)  # a model prepared from keywords: all of them
            curve = minimal_delay_search(
                searched, args, keywords=keywords, step=step_bytes, repeats=repeats, warmup=warmup,
                until=until_bytes, patience=patience, tolerance=tolerance, progress=None if as_json else measured,
            )
        bar.update(description="minimal-delay search: preload, for comparison")
        with load(directory, options.config(pipeline="preload")) as pre:
            times = [timed_call(pre, args, keywords) for _ in range(repeats + warmup)][warmup:]
            curve.preload_s = sorted(times)[len(times) // 2]
    if plot:
        plot_delay_curve(curve, plot, title=f"{searched.manifest.model['name']}: minimal-delay search")
    if as_json:
        print_json(curve.to_dict())
        return
    md = curve.minimal
    console.print(
        f"minimal delay: {md.mean_s * 1e3:.1f} ms at {format_bytes(md.budget_bytes)} "
        f"(start {curve.points[0].mean_s * 1e3:.1f} ms at {format_bytes(curve.points[0].budget_bytes)}; "
        f"preload {curve.preload_s * 1e3:.1f} ms)"
    )
