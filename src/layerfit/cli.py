"""The ``layerfit`` command: parses arguments, calls the library, prints results.

Thin by design: every command is a few lines over a library function. Errors caused by
the user (:class:`~layerfit.errors.LayerfitError`) are printed as one line without a
traceback and exit with status 2.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.markup import escape

from layerfit import strict_json
from layerfit.engine.openmp import COMPUTE_THREADS_HELP, kernels_on, set_compute_threads
from layerfit.errors import InputError, LayerfitError
from layerfit.extras import MissingExtraError, extra_for

if TYPE_CHECKING:
    from layerfit.store.manifest import Manifest

app = typer.Typer(
    name="layerfit",
    help="Run deep neural networks within a memory budget smaller than the networks.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()


def _print_version(value: bool) -> None:
    if value:
        from layerfit import __version__

        typer.echo(f"layerfit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="print the version and exit"
    ),
    trust_factory: list[str] | None = typer.Option(  # noqa: B008 (typer reads defaults)
        None, "--trust-factory", metavar="MODULE",
        help="run prepared folders whose factory is in MODULE (or under it), e.g. mypkg; repeatable. "
        "Zoo models need none; a folder's own manifest can never add one (also: LAYERFIT_TRUST_FACTORY=a,b)",
    ),
) -> None:
    """Run deep neural networks within a memory budget smaller than the networks."""
    if trust_factory:
        from layerfit.store.trust import trust_factories

        trust_factories(trust_factory)


def print_json(obj: Any) -> None:
    """Print ``obj`` as strict JSON on stdout (machine-readable output of ``--json``):
    a figure that is not finite is null, never a bare NaN that parsers refuse."""
    sys.stdout.write(strict_json.dumps(obj) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``layerfit`` script; returns the exit status."""
    import warnings

    warnings.showwarning = _show_warning  # one line each, as the errors are
    try:
        app(args=argv, standalone_mode=False)
    except LayerfitError as exc:
        _print_error(str(exc))
        return 2
    except ModuleNotFoundError as exc:
        if extra_for(exc) is None:  # not an optional dependency: a broken install, show it
            raise
        _print_error(str(MissingExtraError(exc.name or "", extra_for(exc) or "")))
        return 2
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        return 130
    except _usage_errors() as exc:  # a missing argument, an unknown option, a bad value
        exc.show()  # type: ignore[attr-defined]
        return exc.exit_code  # type: ignore[attr-defined]
    return 0


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    Console(stderr=True).print(f"[yellow]warning:[/] {escape(str(message))}", highlight=False, soft_wrap=True)


def _print_error(message: str) -> None:
    # escaped: "[...]" in a message (a path, a shape the user wrote) is text, not style
    Console(stderr=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)


def _usage_errors() -> tuple[type[Exception], ...]:
    """Click's usage errors, as raised in non-standalone mode: recent typer releases
    vendor their own copy of click, whose ``ClickException`` is not click's."""
    import click

    vendored = [c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"]
    return (click.ClickException, *vendored)


# --- commands -------------------------------------------------------------------------
# Each command block below belongs to one layer of the package; keep them thin.

# --- serve (Open Inference Protocol / KServe v2 server over the runtime) ----------------


@app.command("serve")
def serve_command(
    repository: str = typer.Option(..., "--repository", help="folder of prepared models, one sub-folder each"),
    memory_budget: str = typer.Option("512MB", "--memory-budget", help="memory budget of the runtime, e.g. 512MB"),
    workers: int = typer.Option(2, "--workers", min=1, help="worker threads of the runtime"),
    policy: str = typer.Option(
        "masa-fair", "--policy", help="scheduling policy: masa-fair, masa-fcfs, masa, bulk, deepeye, fcfs, ..."
    ),
    units: str = typer.Option(
        "merge:auto", "--units",
        help="what one load/execute task covers: merge:auto (consecutive layers joined while the model's minimum "
        "budget stays the same: fewer reads, lower latency), layers (one each, as the thesis) or merge:SIZE",
    ),
    cache_weights: bool = typer.Option(
        True, "--cache-weights/--no-cache-weights",
        help="keep units loaded by earlier requests in the budget's spare memory and reuse them instead of "
        "reading them again (evicted whenever a task needs the memory)",
    ),
    return_freed_memory: str = typer.Option(
        "after-pass", "--return-freed-memory",
        help="when the scratch a forward pass frees leaves the process: after-pass (when each pass ends), "
        "eagerly (as soon as it is freed: a few MB less RSS, but models that free and allocate megabytes per "
        "layer compute up to twice as slowly) or never (glibc keeps freed blocks of up to 32 MiB)",
    ),
    warm_up: bool = typer.Option(
        False, "--warm-up",
        help="run one request per model on its example input before serving it: a model that fails it "
        "(e.g. a corrupted unit) stays UNAVAILABLE with the reason, and its weights start cached",
    ),
    threads: int | None = typer.Option(
        None, "--threads",
        help=COMPUTE_THREADS_HELP + ". 1 lets requests in flight each use a core instead of sharing them "
        "(measured: +15-40 % requests per second on 2 cores)",
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on"),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="port to listen on (0: a free one)"),
    queue_limit: int = typer.Option(64, "--queue-limit", min=1, help="most inference requests held at once; more get 429"),
    max_body: str = typer.Option("64MB", "--max-body", help="largest request body; larger ones get 413"),
    request_memory: str | None = typer.Option(
        None, "--request-memory",
        help="memory all requests' bodies and decoding may hold at once, outside --memory-budget "
        "(default: twice --max-body); a request that cannot fit gets 413, one that must wait 429",
    ),
    body_timeout: float = typer.Option(
        30.0, "--body-timeout", help="seconds a request body may take to arrive (then 408)"
    ),
    min_body_rate: str = typer.Option(
        "16kB", "--min-body-rate", help="slowest a request body may arrive, per second after its first (then 408)"
    ),
    repository_api: bool = typer.Option(
        True, "--repository-api/--no-repository-api",
        help="serve the model repository extension (index, load, unload); off: those endpoints answer 404",
    ),
    verify: str = typer.Option(
        "first", "--verify",
        help="when a unit's SHA-256 is checked: first (its first read), always (every read from storage) or "
        "never; a unit that fails takes its model out of service (503) until it is loaded again",
    ),
    reverify_every: float = typer.Option(
        0.0, "--reverify-every", metavar="SECONDS",
        help="re-read and hash every ready model's weights this often, in the background (0: never): "
        "catches a file changed after its first check",
    ),
    timeout: float = typer.Option(60.0, "--timeout", help="seconds before a request is cancelled (503)"),
    shutdown_grace: float = typer.Option(
        30.0, "--shutdown-grace", help="seconds (0 or more) requests may finish after SIGTERM"
    ),
    log_level: str = typer.Option(
        "info", "--log-level", help="uvicorn log level: critical, error, warning, info, debug or trace"
    ),
) -> None:
    """Serve the repository's models over the Open Inference Protocol (KServe v2 REST)."""
    from layerfit.serve.server import ServeSettings, serve

    settings = ServeSettings(
        repository=repository, memory_budget=memory_budget, workers=workers, policy=policy, units=units,
        cache_weights=cache_weights, return_freed_memory=return_freed_memory, warm_up=warm_up, threads=threads,
        host=host,
        port=port, queue_limit=queue_limit, max_body=max_body, request_memory=request_memory,
        body_timeout=body_timeout, min_body_rate=min_body_rate, repository_api=repository_api, timeout=timeout,
        verify=verify, reverify_every=reverify_every,
        shutdown_grace=shutdown_grace, log_level=log_level, access_log=log_level.lower() in ("debug", "trace"),
    )

    def ready(url: str, built: Any) -> None:
        index = built.registry.index()
        loaded = sum(row["state"] == "READY" for row in index)
        threads = built.runtime.stats()["compute_threads"]
        console.print(f"layerfit serving {loaded} of {len(index)} models at {url}/v2, {kernels_on(threads)} "
                      "(SIGTERM drains and stops)",
                      highlight=False, soft_wrap=True)
        for name, message in built.load_errors.items():
            console.print(f"[yellow]model {escape(name)} not loaded:[/] {escape(message)}",
                          highlight=False, soft_wrap=True)

    serve(settings, on_ready=ready)

# --- zoo (the papers' networks) -------------------------------------------------------


@app.command("zoo")
def zoo_command(
    as_json: bool = typer.Option(False, "--json", help="print the table as JSON"),
) -> None:
    """List the built-in models: name, parameters, parameter MB, default input shape."""
    from rich.table import Table

    from layerfit.zoo import table

    rows = table()
    if as_json:
        print_json(rows)
        return
    out = Table(title="layerfit model zoo", title_justify="left")
    for col, justify in (("name", "left"), ("params", "right"), ("param MB", "right"),
                         ("input shape", "left"), ("published", "right")):
        out.add_column(col, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        pub = r["published_params_m"]
        out.add_row(r["name"], f"{r['params']:,}", f"{r['param_mb']:.1f}",
                    "x".join(str(d) for d in r["input_shape"]), f"{pub} M" if pub else "-")
    console.print(out)

# --- memory (Pisarchyk & Lee: activation memory planning) -------------------------------


@app.command("plan")
def plan_activations(
    model: str | None = typer.Argument(
        None, help="zoo model name (planned at its paper resolution) or a prepared model directory"
    ),
    records: str | None = typer.Option(
        None, "--records", help='JSON list of {"id", "first_op", "last_op", "size"} instead of MODEL'
    ),
    approach: str | None = typer.Option(None, "--approach", help="objects or offsets (default: both)"),
    strategy: str = typer.Option("all", "--strategy", help="a strategy name, a comma list, or all"),
    align: int = typer.Option(64, "--align", help="round tensor sizes up to this many bytes (a power of two)"),
    order: str = typer.Option("captured", "--order", help="MODEL only: captured or searched operator order"),
    input_shape: str = typer.Option(
        None, "--input-shape", help="zoo MODEL only: plan at this input shape, e.g. 1,3,96,96"
    ),
    time_limit: float = typer.Option(
        10.0, "--time-limit", help="seconds for each exact CP-SAT model and for the operator order search"
    ),
    as_json: bool = typer.Option(False, "--json", help="totals, bounds and every tensor's assignment as JSON"),
) -> None:
    """Plan activation memory: every strategy's total next to the lower bound and naive total."""

    from rich.table import Table

    from layerfit.errors import PlanError
    from layerfit.memory import check_alignment, check_time_limit, get_strategy, load_records
    from layerfit.memory.registry import check_approach
    from layerfit.memory.report import MIB, plan_report

    if (model is None) == (records is None):
        raise PlanError("give either a MODEL (zoo name or prepared directory) or --records FILE.json (not both)")
    if order not in ("captured", "searched"):
        raise PlanError(f"--order must be captured or searched, not {order!r}")
    check_alignment(align, "--align")
    check_time_limit(time_limit, "--time-limit")
    approaches = ("objects", "offsets") if approach is None else (approach,)
    names: str | list[str] = "all"
    if strategy.strip() != "all":  # a comma list, each name once, in the order given
        names = list(dict.fromkeys(s.strip() for s in strategy.split(",") if s.strip()))
    if not names:
        raise PlanError("--strategy names no strategy; give a name, a comma list, or all")
    for kind in approaches:  # bad names fail before a model is captured
        check_approach(kind)
        for name in names if names != "all" else ():
            get_strategy(kind, name)
    extra: dict[str, Any] = {}
    if records is not None:
        if input_shape is not None:
            raise PlanError("--input-shape applies to a zoo MODEL, not to --records")
        if order != "captured":
            raise PlanError("--order applies to a MODEL; records files carry their own operator order")
        recs = load_records(records, alignment=align)
        if not recs:
            raise PlanError(f"records file {records!r} holds no tensor usage records; nothing to plan")
    else:
        from layerfit.memory.from_graph import records_from_graph
        from layerfit.memory.operator_order import search_operator_order

        graph = _graph_to_plan(model, _parse_shape(input_shape))
        chosen = None
        if order == "searched":
            found = search_operator_order(graph, alignment=align, time_limit=time_limit)
            chosen = found.order
            extra["order_search"] = {k: v for k, v in found.to_dict().items() if k != "order"}
        converted = records_from_graph(graph, chosen, alignment=align)
        recs = converted.records
        if as_json:  # tensors folded into a buffer (views, in-place) take that buffer's place
            extra["buffer_of_tensor"] = {str(t): b for t, b in sorted(converted.record_of.items())}
    report = plan_report(recs, approaches, names, time_limit=time_limit, assignments=as_json)
    report.update(extra)
    if as_json:
        print_json(report)
        return
    for name, part in report["approaches"].items():
        table = Table(title=f"{name} — {report['tensors']} buffers (MiB = the paper's MB)")
        for column in ("strategy", "MiB", "bytes", "vs bound", "status", "ms"):
            table.add_column(column, justify="left" if column in ("strategy", "status") else "right", no_wrap=True)
        notes = []
        for row in part["strategies"]:
            values = (f"{row['total'] / MIB:.3f}", str(row["total"]), f"{100 * row['vs_lower_bound']:+.1f}%")
            table.add_row(row["strategy"], *values, row["status"], f"{1000 * row['seconds']:.1f}")
            if row["note"]:
                notes.append(f"{row['strategy']}: {row['note']}")
        for label in ("lower_bound", "naive"):
            table.add_row(label.replace("_", " "), f"{part[label] / MIB:.3f}", str(part[label]), "", "", "")
        console.print(table)
        for note in notes:
            console.print(f"  {note}", highlight=False)
    if "order_search" in extra:
        s = extra["order_search"]
        console.print(
            f"operator order search: offsets bound {s['captured_peak'] / MIB:.3f} → {s['peak'] / MIB:.3f} MiB "
            f"({100 * s['saving']:.1f}% saved, {'exact' if s['exact'] else 'beam'})"
        )


def _graph_to_plan(model: str, input_shape: tuple[int, ...] | None):
    """The captured graph of a prepared model directory (as prepared: its manifest holds
    it, no weights are read) or of a zoo model (captured now, at ``input_shape``)."""
    from pathlib import Path

    from layerfit.errors import PlanError
    from layerfit.memory.zoo_records import capture_zoo_model
    from layerfit.store import read_manifest

    if Path(model).is_dir():
        if input_shape is not None:
            raise PlanError(
                f"{model} was prepared for one input shape; --input-shape applies to zoo models "
                "(prepare the model again with `layerfit prepare --input-shape` to plan another)"
            )
        return read_manifest(model).graph
    if Path(model).is_file():
        raise PlanError(
            f"{model} is a file, not a zoo name or a prepared model directory; "
            f"plan a records file with --records {model}"
        )
    if "/" in model or model.startswith("."):
        raise PlanError(f"{model} is not a directory (MODEL is a zoo name or a prepared model directory)")
    return capture_zoo_model(model, input_shape)


# --- schedule (MASA / EdgeCaffe: task graphs, policies, simulator, exact optimum) -------
from layerfit.schedule.cli import app as schedule_app  # noqa: E402

app.add_typer(schedule_app, name="schedule")

# --- tradeoff (Minakova & Stefanov: buffer reuse, processing by parts, genetic search) ---
tradeoff_app = typer.Typer(
    help="Memory-throughput trade-offs: buffer reuse, processing by parts, pipelines.",
    no_args_is_help=True,
)
app.add_typer(tradeoff_app, name="tradeoff")


@tradeoff_app.command("parts")
def tradeoff_parts(
    app_file: str = typer.Argument(..., help="Application YAML file (CNNs, partitions, constraints)."),
    memory: str | None = typer.Option(None, "--memory", help="Memory constraint M^c, e.g. 15MB."),
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

    from layerfit.tradeoff.cli_support import run_parts_command

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
    result, lines, rows = run_parts_command(
        app_file, memory, throughput or [], model_throughput, generations, population, seed, select, phase_rows
    )
    if plot_path is not None:
        from layerfit.tradeoff.report import plot_pareto

        lines.append(f"plot written to {plot_pareto(result, plot_path)}")
    if json_output:
        print_json(result.to_dict())
    else:
        from rich.table import Table

        table = Table(title=f"{result.derived.app.name}: memory-throughput trade-off")
        for column in ("configuration", "memory", "buffers", "throughput", "by_parts"):
            table.add_column(column)
        for row in rows:
            table.add_row(*(str(row[c]) for c in ("configuration", "memory", "buffers", "throughput", "by_parts")))
        console.print(table)
        for line in lines:
            console.print(line, highlight=False)
    if not result.feasible:
        from layerfit.errors import TradeoffError

        raise TradeoffError("; ".join(v.message() for v in result.violations))


# --- SwapNet (profile, partition): delay model, block partition under a budget ----------


def _print_profile_warnings(caught: list) -> None:
    for w in caught:
        Console(stderr=True).print(f"[yellow]warning:[/] {escape(str(w.message))}", highlight=False, soft_wrap=True)


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

    from layerfit.tradeoff.swapnet_profile import (
        check_profile_target,
        default_profile_path,
        previous_profile,
        profile_models,
    )

    path = check_profile_target(profile or default_profile_path())  # before measuring
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        previous = None if replace else previous_profile(path)
    _print_profile_warnings(caught)
    result = profile_models(
        directories, repeats=repeats, warmup=warmup, previous=previous,
        progress=None if as_json else lambda t: console.print(
            f"  {t.name} {tuple(t.input_shape)}: {len(t.nbytes)} layers, resident run "
            f"{t.latency_s * 1e3:.1f} ms, streamed {t.stream_latency_s * 1e3:.1f} ms", highlight=False),
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
    from layerfit.tradeoff.swapnet import partition_report

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            rep = partition_report(
                directory, budget, profile_path=profile, measure_latency=measure_latency, repeats=repeats, warmup=warmup
            )
        finally:
            _print_profile_warnings(caught)
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


# --- store and engine (prepare, inspect, verify, run, plot-trace) ----------------------


def _parse_shape(text: str | None) -> tuple[int, ...] | None:
    from layerfit.errors import InputError

    if text is None:
        return None
    try:
        shape = tuple(int(p) for p in text.replace("x", ",").split(",") if p.strip())
    except ValueError:
        shape = ()
    if not shape or any(d <= 0 for d in shape):
        raise InputError(f"cannot read input shape {text!r}: write dimensions like 1,3,224,224")
    return shape


def _example_kwargs(path: str | None, input_shape: str | None) -> dict[str, Any] | None:
    """The keyword arguments stored in ``--example`` (safetensors: tensors only, nothing
    unpickled); a clear error for a missing or malformed file, or with --input-shape."""
    if path is None:
        return None
    if input_shape is not None:
        raise InputError("--example gives the example input: leave out --input-shape")
    tensors = _read_safetensors(path, f"--example {path}", "")
    if not tensors:
        raise InputError(f"--example {path} holds no tensors: store the example call's keyword arguments in it")
    return tensors


@app.command()
def prepare(
    model: str = typer.Argument(..., help="zoo name (see `layerfit zoo`) or package.module:factory"),
    output: str = typer.Option(..., "-o", "--output", help="directory to create"),
    input_shape: str = typer.Option(None, "--input-shape", help="e.g. 1,3,224,224 (default: the model's)"),
    input_dtype: str = typer.Option("float32", "--input-dtype"),
    checkpoint: str = typer.Option(None, "--checkpoint", help="weights from a .safetensors file"),
    seed: int = typer.Option(0, "--seed", help="seed of the zoo's initialisation and the example input"),
    example: str = typer.Option(
        None, "--example", help="a .safetensors file whose tensors are the example call's keyword arguments "
        "(a model of several inputs, such as input_features and decoder_input_ids), instead of --input-shape",
    ),
    force: bool = typer.Option(False, "--force", help="replace an existing directory"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Capture MODEL and pack its weights in execution order into a prepared directory."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    from layerfit.sizes import format_bytes
    from layerfit.store import prepare as do_prepare

    with Progress(
        TextColumn("[bold]preparing[/] " + model), BarColumn(), DownloadColumn(),
        console=Console(stderr=True), transient=True, disable=as_json,
    ) as bar:
        task = bar.add_task("write", total=None)
        manifest = do_prepare(
            model, output, input_shape=_parse_shape(input_shape), input_dtype=input_dtype,
            checkpoint=checkpoint, force=force, seed=seed, example=_example_kwargs(example, input_shape),
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    summary = {
        "directory": output,
        "model": manifest.model,
        "input_shape": list(manifest.input_shape),
        "units": len(manifest.units),
        "weights_bytes": manifest.total_bytes,
        "largest_unit_bytes": manifest.largest_unit_bytes,
        "resident_bytes": manifest.resident_bytes,
        "capture": manifest.graph.method,
    }
    if as_json:
        print_json(summary)
    else:
        console.print(
            f"prepared {model} -> {output}: {len(manifest.units)} units, "
            f"{format_bytes(manifest.total_bytes)} of weights, largest unit "
            f"{format_bytes(manifest.largest_unit_bytes)}, resident {format_bytes(manifest.resident_bytes)} "
            f"(capture: {manifest.graph.method})"
        )


@app.command()
def inspect(
    directory: str = typer.Argument(..., help="prepared model directory"),
    budget: str = typer.Option(
        None, "--budget", help="also show how `run --pipeline auto` spends this weight budget, e.g. 24MB or 50% (units kept, bytes read)"
    ),
    stages: int = typer.Option(2, "--stages", help="with --budget: 2 (cpu) or 3 (a copy stage, as on cuda)"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Show a prepared model: units with sizes and offsets, resident tensors, totals."""
    from rich.table import Table

    from layerfit.engine.gather import gathered_units, streamed_minimum
    from layerfit.sizes import format_bytes
    from layerfit.store import read_manifest

    m = read_manifest(directory)
    plan = None if budget is None else _auto_plan(m, budget, stages)
    reasons = {r.name: r.reason for r in m.graph.resident}  # why each is kept, from the capture
    units = [
        {"index": u.index, "name": u.name, "type": u.module_type, "nbytes": u.nbytes,
         "payload_bytes": u.payload_bytes, "offset": u.offset, "d": u.d, "f": u.f, "sha256": u.sha256}
        for u in m.units
    ]
    info = {
        "model": m.model,
        "input_shape": list(m.input_shape),
        "input_dtype": m.input_dtype,
        "input_keywords": [{"name": n, "shape": list(shape), "dtype": d} for n, shape, d in m.input_keywords],
        "weights_file": m.weights_file,
        "weights_bytes": m.total_bytes,
        "largest_unit_bytes": m.largest_unit_bytes,
        "minimum_budget_bytes": streamed_minimum(m.units) + m.resident_bytes,
        "rows_units": sorted(gathered_units([u] for u in m.units)),
        "resident_bytes": m.resident_bytes,
        "resident_tensors": [
            {"name": t.name, "nbytes": t.nbytes, "places": list(t.places), "reason": reasons.get(t.name, "")}
            for t in (m.resident.tensors if m.resident else ())
        ],
        "unused_tensors": m.graph.unused,
        "capture": m.graph.method,
        "macs": m.graph.total_macs,
        "ops": len(m.graph.ops),
        "activation_tensors": len(m.graph.tensors),
        "pass_peak_bytes": m.graph.pass_peak_bytes,
        **_activation_info(m),
        "units": units,
    }
    if plan is not None:
        info["auto_plan"] = plan
    if as_json:
        print_json(info)
        _check_weights_file(directory, m)
        return
    console.print(
        f"[bold]{m.model['name']}[/] input {_inputs_label(m)}: "
        f"{len(m.units)} units, {format_bytes(m.total_bytes)} weights, largest unit "
        f"{format_bytes(m.largest_unit_bytes)}, resident {format_bytes(m.resident_bytes)}, "
        f"{m.graph.total_macs / 1e9:.2f} GMACs, minimum budget "
        f"{format_bytes(info['minimum_budget_bytes'])}"
        + (
            f" (embedding tables read by the rows they look up: units {', '.join(map(str, info['rows_units']))})"
            if info["rows_units"]
            else ""
        )
        + "\n"
        f"activation arena {format_bytes(info['activation_arena_bytes'])} (offsets plan, best); planned "
        f"total at the minimum budget {format_bytes(info['planned_total_bytes'])}"
        + (
            f"; unplanned, the captured pass held {format_bytes(m.graph.pass_peak_bytes)} of tensors at its peak"
            if m.graph.pass_peak_bytes
            else ""
        )
    )
    if plan is not None:
        head = f"at {format_bytes(plan['budget_bytes'])} ({plan['stages']} stages) pipeline auto runs {plan['policy']}: "
        if plan["policy"] == "preload":
            console.print(head + f"every weight resident ({format_bytes(m.total_bytes)}), read once at load")
        else:
            console.print(
                head + f"{len(plan['kept_units'])} of {len(m.units)} units kept resident "
                f"({format_bytes(plan['kept_bytes'])}), buffers "
                f"{format_bytes(plan['buffer_bytes'] + plan['device_buffer_bytes'])}; each inference reads "
                f"{plan['units_read_per_inference']} units, {format_bytes(plan['bytes_read_per_inference'])}"
            )
    kept = set() if plan is None else set(plan["kept_units"])
    table = Table("#", "unit", "type", "bytes", "offset", "d", "MMACs", *(["auto"] if plan else []))
    for u in m.units:
        rows = set(plan["rows_units"]) if plan else set()
        where = (
            ["kept" if u.index in kept or plan["policy"] == "preload" else "rows" if u.index in rows else "read"]
            if plan
            else []
        )
        table.add_row(
            str(u.index), u.name, u.module_type, format_bytes(u.nbytes), str(u.offset), str(u.d), f"{u.f / 1e6:.1f}", *where
        )
    console.print(table)
    if info["resident_tensors"]:
        # resident tensors count against every budget: say which they are and why
        kept = Table("resident tensor", "bytes", "why it is not streamed", title="kept in memory for the whole inference")
        for r in sorted(info["resident_tensors"], key=lambda r: -r["nbytes"]):
            kept.add_row(r["name"], format_bytes(r["nbytes"]), r["reason"])
        console.print(kept)
    _check_weights_file(directory, m)


def _inputs_label(m: Manifest) -> str:
    """``(1, 3, 224, 224) float32``, or each keyword's for a model prepared from them."""
    if not m.input_keywords:
        return f"{tuple(m.input_shape)} {m.input_dtype}"
    return ", ".join(f"{n}={tuple(shape)} {d}" for n, shape, d in m.input_keywords)


def _auto_plan(m: Manifest, budget: str, stages: int) -> dict[str, Any]:
    """How ``run --pipeline auto`` spends ``budget`` on the model's weights, by layer (the
    plan the engine makes; nothing is loaded). Below the minimum: the engine's error."""
    from layerfit.engine.device import get_device
    from layerfit.engine.gather import gathered_units, least_room
    from layerfit.engine.parts import unit_runs
    from layerfit.engine.policies import AUTO
    from layerfit.engine.skeleton import build_skeleton
    from layerfit.engine.units import make_blocks
    from layerfit.engine.weight_plan import plan_weights
    from layerfit.sizes import parse_budget

    get_device("cpu", stages)  # the engine's own check of --stages
    sizes, budget_bytes = [u.nbytes for u in m.units], parse_budget(budget, m.total_bytes)
    # As the engine on cpu: embedding tables read by the rows they look up (two stages).
    rows = {} if stages == 3 else {i: least_room(m.units[i]) for i in gathered_units([u] for u in m.units)}
    # An encoder-decoder's decoder runs once per generated token: the plan keeps it first.
    try:
        runs = unit_runs(build_skeleton(m), make_blocks(m.units))
    except LayerfitError:  # its factory does not import here: nor would the engine load it
        runs = None
    plan = plan_weights(AUTO, sizes, m.resident_bytes, budget_bytes, stages, rows, runs)
    read = [] if plan.policy.name == "preload" else [
        i for i in range(len(sizes)) if i not in plan.kept and i not in plan.gathered
    ]
    return {
        "budget_bytes": budget_bytes,
        "stages": stages,
        "policy": plan.policy.name,
        "kept_units": sorted(plan.kept),
        "rows_units": sorted(plan.gathered),
        "kept_bytes": plan.kept_bytes,
        "buffer_bytes": plan.buffer_bytes,
        "device_buffer_bytes": plan.device_buffer_bytes,
        "units_read_per_inference": len(read),
        "bytes_read_per_inference": sum(sizes[i] for i in read),
    }


def _check_weights_file(directory: str, m: Manifest) -> None:
    """After showing the manifest, refuse (exit 2) if its weights file is missing or the
    wrong size, so that a damaged model never looks healthy (``verify`` checks the bytes)."""
    from pathlib import Path

    from layerfit.store import check_weights_file

    check_weights_file(Path(directory) / m.weights_file, m.weights_size)


def _activation_info(m) -> dict[str, Any]:
    """The planned activation arena next to the minimum weight budget (Pisarchyk & Lee)."""
    from layerfit.engine.arena import memory_summary, plan_activations

    # Planned activations read embedding tables whole (the arena replays the captured ops).
    return memory_summary(plan_activations(m.graph), m.largest_unit_bytes + m.resident_bytes)


@app.command()
def verify(directory: str = typer.Argument(..., help="prepared model directory")) -> None:
    """Read every unit and check its SHA-256 against the manifest."""
    from layerfit.store.verify import verify_folder

    checked = verify_folder(directory)
    console.print(f"{directory}: {checked.segments} segments verified ({checked.io_mode} I/O)")


def _read_safetensors(path: str, what: str, hint: str) -> dict[str, Any]:
    """The tensors of a .safetensors file (nothing unpickled); a clear error naming
    ``what`` (and ``hint``) for a missing or malformed file."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except FileNotFoundError:
        raise InputError(f"{what}: no such file{hint}") from None
    except (SafetensorError, OSError, ValueError) as exc:
        raise InputError(f"{what} is not a readable .safetensors file: {exc}{hint}") from None


def _device_call(path: str | None, engine) -> tuple[tuple, dict]:
    """:func:`_load_call` for ``engine``, on its device."""
    args, keywords = _load_call(path, engine.manifest)
    to_device = engine.device.to_device
    return tuple(to_device(a) for a in args), {k: to_device(v) for k, v in keywords.items()}


def _load_call(path: str | None, manifest) -> tuple[tuple, dict]:
    """``(args, kwargs)`` of ``run``'s call: the seeded default, ``--input``'s one tensor,
    or (a model prepared from an example of keyword arguments) ``--input``'s
    ``.safetensors`` file of them."""
    from layerfit.store import example_call

    if path is None:
        return example_call(manifest)
    if not manifest.input_keywords:
        return (_load_input(path, manifest),), {}
    tensors = _read_safetensors(
        path, f"input {path}", " (this model takes keyword arguments: give a .safetensors file of them)"
    )
    names = [name for name, _, _ in manifest.input_keywords]
    if sorted(tensors) != sorted(names):
        raise InputError(f"input {path} holds {', '.join(sorted(tensors)) or 'no tensors'}; the model takes {', '.join(names)}")
    for name, shape, dtype in manifest.input_keywords:
        t = tensors[name]
        if t.dim() != len(shape) or str(t.dtype).removeprefix("torch.") != dtype:
            raise InputError(
                f"input {path}: {name} is {str(t.dtype).removeprefix('torch.')} {tuple(t.shape)}; the model "
                f"was prepared with {dtype} {tuple(shape)} (the same dtype and number of dimensions are needed)"
            )
    return (), tensors


def _load_input(path: str | None, manifest):
    from layerfit.errors import InputError
    from layerfit.store import example_input

    if path is None:
        return example_input(manifest.input_shape, manifest.input_dtype, manifest.seed)
    import numpy as np
    import torch

    if str(path).lower().endswith(".safetensors"):
        raise InputError(
            f"input {path} is a .safetensors file: this model takes one tensor, give it as a .npy file "
            "(numpy.save); a .safetensors file of named tensors is for a model prepared from keyword arguments"
        )
    _check_npy_header(path, manifest)
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, SyntaxError, TypeError, MemoryError, OverflowError) as exc:
        raise InputError(f"cannot read input {path}: {exc}") from exc
    if not isinstance(arr, np.ndarray):  # an .npz archive
        arr.close()
        raise InputError(f"input {path} is an .npz archive: save the one input tensor with numpy.save as .npy")
    if not arr.dtype.isnative:  # the same values in this machine's byte order
        arr = arr.astype(arr.dtype.newbyteorder("="))
    if tuple(arr.shape) != tuple(manifest.input_shape) or str(arr.dtype) != manifest.input_dtype:
        hint = ""
        if str(arr.dtype) == manifest.input_dtype and arr.ndim == len(manifest.input_shape):
            shape = ",".join(str(n) for n in arr.shape)
            hint = f" (it was prepared for that shape: prepare it again with --input-shape {shape})"
        raise InputError(
            f"input {path} is {arr.dtype} {tuple(arr.shape)}; the model expects "
            f"{manifest.input_dtype} {tuple(manifest.input_shape)}{hint}"
        )
    return torch.from_numpy(arr)


def _check_npy_header(path: str, manifest) -> None:
    """Read a ``.npy`` file's header only, and refuse one that is not an array of the
    model's input shape and dtype before a byte of its data is read (a crafted header
    may declare terabytes, or a dtype that needs pickle)."""
    import numpy as np

    try:
        with open(path, "rb") as fh:
            if fh.read(6) != b"\x93NUMPY":
                return  # not .npy: np.load says what it is (.npz, or nothing it reads)
            fh.seek(0)
            version = np.lib.format.read_magic(fh)
            read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read is None:
                raise ValueError(f"unknown .npy format version {version}")
            shape, _, dtype = read(fh)
    except FileNotFoundError:
        raise InputError(f"input {path} does not exist") from None
    except IsADirectoryError:
        raise InputError(f"input {path} is a directory, not a .npy file") from None
    except Exception as exc:  # numpy parses the header with tokenize and ast: any of their errors
        raise InputError(f"cannot read input {path}: its .npy header is not valid ({type(exc).__name__}: {exc})") from None
    expected = tuple(manifest.input_shape)
    if dtype.hasobject or tuple(shape) != expected or str(dtype.newbyteorder("=")) != manifest.input_dtype:
        hint = ""
        if str(dtype.newbyteorder("=")) == manifest.input_dtype and len(shape) == len(expected):
            hint = f" (it was prepared for that shape: prepare it again with --input-shape {','.join(map(str, shape))})"
        raise InputError(
            f"input {path} is {dtype} {tuple(shape)}; the model expects {manifest.input_dtype} {expected}{hint}"
        )


def _save_output(path: str, out) -> None:
    """Write the output tensors to ``path`` (.npy: the one output; .npz: every output),
    through a temporary file and a rename."""
    import numpy as np

    from layerfit.engine import flat_outputs
    from layerfit.store.outputs import write_atomic

    def into(save):  # through an open file: numpy appends .npy/.npz to a name not ending in it
        def write(tmp) -> None:
            with open(tmp, "wb") as fh:
                save(fh)

        return write

    outs = [t.detach().cpu().numpy() for t in flat_outputs(out)]
    if path.lower().endswith(".npz"):
        write_atomic(path, into(lambda fh: np.savez(fh, *outs)))
    elif len(outs) == 1:
        write_atomic(path, into(lambda fh: np.save(fh, outs[0])))
    else:
        from layerfit.errors import InputError

        raise InputError(f"the model has {len(outs)} outputs: save them to a .npz file")


def _pipeline_label(report: dict) -> str:
    """The pipeline that ran, and that ``auto`` chose it where it did."""
    if report["pipeline_requested"] == report["pipeline"]:
        return report["pipeline"]
    return f"{report['pipeline']}, chosen by {report['pipeline_requested']}"


def _units_label(report: dict) -> str:
    """How many units there are, how many ``auto`` keeps resident beside the buffer, and
    how many are embedding tables read by rows."""
    from layerfit.sizes import format_bytes

    notes = []
    if report["kept_units"]:
        notes.append(f"{report['kept_units']} kept resident, {format_bytes(report['kept_bytes'])}")
    if report.get("rows_units"):
        notes.append(f"{report['rows_units']} read by rows")
    return f"{report['units']} units" + (f" ({'; '.join(notes)})" if notes else "")


@app.command()
def run(
    directory: str = typer.Argument(..., help="prepared model directory"),
    pipeline: str = typer.Option(
        "auto", "--pipeline",
        help="auto (preload when --budget holds every weight or is not given, else async), preload, sequential, sync or async",
    ),
    budget: str = typer.Option(None, "--budget", help="weight memory, e.g. 24MB, or a share of the model's weights, e.g. 50% (default: the pipeline's own)"),
    units: str = typer.Option("layers", "--units", help="layers, blocks:N, merge:SIZE (consecutive layers up to SIZE per block) or swapnet (SwapNet partition for --budget)"),
    input_path: str = typer.Option(
        None, "--input", help="input .npy, or .safetensors of keyword arguments for a model prepared with "
        "--example (default: seeded random)",
    ),
    output_path: str = typer.Option(None, "--output", help="save the output to .npy/.npz"),
    repeats: int = typer.Option(3, "--repeats", min=1),
    warmup: int = typer.Option(1, "--warmup", min=0),
    trace: str = typer.Option(None, "--trace", help="write a Chrome trace of the median run"),
    direct_io: bool = typer.Option(True, "--direct-io/--buffered-io"),
    activations: str = typer.Option(
        "default", "--activations", help="default (PyTorch allocates) or planned (one arena laid out by the planner)"
    ),
    coalesce: str = typer.Option(
        "4MiB", "--coalesce", help="read adjacent units with one request up to this size (0: one read per unit)"
    ),
    gather_rows: bool = typer.Option(
        True, "--rows/--tables-whole",
        help="read an untied embedding table by the rows its ids look up (default), or stream it whole",
    ),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or cuda:N"),
    stages: int = typer.Option(
        None, "--stages", help="2: kernels use the read buffer (cpu default); 3: read, copy, kernel (cuda)"
    ),
    threads: int | None = typer.Option(None, "--threads", help=COMPUTE_THREADS_HELP),
    force: bool = typer.Option(False, "--force", help="replace existing --output and --trace files"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Execute a prepared model under a weight budget and report latency and memory."""
    from layerfit.engine import load, measure
    from layerfit.sizes import format_bytes
    from layerfit.store.outputs import check_output_file

    # Checked before the model runs: finding out afterwards would lose the run.
    if output_path:
        check_output_file(output_path, force=force, option="--output", suffixes=(".npy", ".npz"))
    if trace:
        check_output_file(trace, force=force, option="--trace")
    set_compute_threads(threads, "--threads")
    options = {"budget": budget, "pipeline": pipeline, "units": units}
    if units == "swapnet":
        import warnings

        from layerfit.tradeoff.swapnet import swapnet_engine_options

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                options = swapnet_engine_options(directory, budget)
            finally:
                _print_profile_warnings(caught)
    with load(
        directory,
        **options,
        direct_io=direct_io,
        trace=trace is not None,
        activations=activations,
        coalesce=coalesce,
        device=device,
        stages=stages,
        gather_rows=gather_rows,
    ) as engine:
        args, keywords = _device_call(input_path, engine)
        out, report = measure(engine, args, repeats=repeats, warmup=warmup, keywords=keywords)
        if trace:
            engine.last_timeline.save(trace)
            report["trace"] = trace
    if output_path:
        _save_output(output_path, out)
    if as_json:
        report.pop("latencies_s", None)
        print_json(report)
        return
    console.print(
        f"{report['model']} [{_pipeline_label(report)}, {_units_label(report)}, {report['stages']} stages on "
        f"{report['device']}, {report['io_mode']} I/O, {kernels_on(report['compute_threads'])}]: "
        f"latency {report['latency_s'] * 1e3:.1f} ms (median of {repeats}), weights peak "
        f"{format_bytes(report['weights_peak_bytes'])} of {format_bytes(report['weights_total_bytes'])}, "
        f"peak RSS {format_bytes(report['rss_peak_bytes'])}\n"
        f"activations {report['activations']}: planned arena {format_bytes(report['activation_arena_bytes'])}, "
        f"planned total {format_bytes(report['planned_total_bytes'])} (weight buffers + arena)\n"
        f"output {report['output_shape']} sha256 {report['output_sha256'][:16]}",
        markup=False,  # the [pipeline, ...] part is text, not a rich style tag
    )


@app.command("plot-trace")
def plot_trace(
    trace_file: str = typer.Argument(..., help="trace written by `layerfit run --trace`"),
    output: str = typer.Option(..., "-o", "--output", help="image to write (png, svg, pdf)"),
    force: bool = typer.Option(False, "--force", help="replace an existing image"),
) -> None:
    """Draw the read/copy/kernel Gantt chart with the weight buffer's use beneath it."""
    from layerfit.engine.plot import plot_timeline
    from layerfit.engine.trace import load_timeline
    from layerfit.store.outputs import check_output_file

    check_output_file(output, force=force, option="--output", image=True)
    plot_timeline(load_timeline(trace_file), output)
    console.print(f"wrote {output}")


@tradeoff_app.command("delay")
def tradeoff_delay(
    directory: str = typer.Argument(..., help="prepared model directory"),
    pipeline: str = typer.Option(
        "async", "--pipeline", help="a pipeline that uses a larger budget: async (the paper's search) or auto"
    ),
    step: str = typer.Option("1MB", "--step", help="budget increment per point, e.g. 1MB or 5% of the weights"),
    repeats: int = typer.Option(3, "--repeats", min=1),
    warmup: int = typer.Option(1, "--warmup", min=0),
    until: str = typer.Option(None, "--until", help="stop phase 1 at this budget, e.g. 40MB or 60% (default: model size)"),
    patience: int = typer.Option(None, "--patience", help="stop phase 1 after N points without a new minimum"),
    tolerance: float = typer.Option(0.01, "--tolerance", help="relative slack when matching the minimum"),
    as_json: bool = typer.Option(False, "--json"),
    plot: str = typer.Option(None, "--plot", help="write the delay-memory curve (Fig. 13) here"),
    force: bool = typer.Option(False, "--force", help="replace an existing --plot image"),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda or cuda:N"),
    stages: int = typer.Option(None, "--stages", help="2 (cpu default) or 3: read, copy, kernel (cuda)"),
) -> None:
    """Find the minimal-delay buffer size by growing the budget (Demand Layering V-D)."""
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
    with load(directory, pipeline=pipeline, device=device, stages=stages) as engine:
        args, keywords = _device_call(None, engine)  # a model prepared from keywords: all of them
        curve = minimal_delay_search(
            engine, args, keywords=keywords, step=step_bytes, repeats=repeats, warmup=warmup,
            until=until_bytes, patience=patience, tolerance=tolerance,
            progress=None if as_json else lambda p: console.print(
                f"  {format_bytes(p.budget_bytes):>10}  {p.mean_s * 1e3:9.1f} ms  "
                f"[{p.min_s * 1e3:.1f} - {p.max_s * 1e3:.1f}]", highlight=False),
        )
    with load(directory, pipeline="preload", device=device, stages=stages) as pre:
        times = [timed_call(pre, args, keywords) for _ in range(repeats + warmup)][warmup:]
        curve.preload_s = sorted(times)[len(times) // 2]
    if plot:
        plot_delay_curve(curve, plot, title=f"{engine.manifest.model['name']}: minimal-delay search")
    if as_json:
        print_json(curve.to_dict())
        return
    md = curve.minimal
    console.print(
        f"minimal delay: {md.mean_s * 1e3:.1f} ms at {format_bytes(md.budget_bytes)} "
        f"(start {curve.points[0].mean_s * 1e3:.1f} ms at {format_bytes(curve.points[0].budget_bytes)}; "
        f"preload {curve.preload_s * 1e3:.1f} ms)"
    )


if __name__ == "__main__":
    sys.exit(main())
