"""``layerfit schedule …``: task graphs, workloads and simulated runs. Thin: parse, call, print.

Heavy libraries (networkx, SimPy, matplotlib, OR-Tools) are imported inside the
commands, so building the ``layerfit`` command stays fast. Every output path is checked
(:func:`~layerfit.store.outputs.check_output_file`) before the work whose result it holds,
and ``--json`` is strict JSON: a figure that does not exist is ``null``, never ``NaN``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from layerfit.cli.app import app, console, print_json, renamed_option
from layerfit.cli.runtime_options import RUNTIME_OPTIONS, RuntimeOptions, runtime_options
from layerfit.engine.openmp import (
    COMPUTE_THREADS_HELP,
    check_compute_threads,
    kernels_on,
    set_compute_threads,
)
from layerfit.errors import ScheduleError
from layerfit.store.outputs import check_output_file

if TYPE_CHECKING:
    from layerfit.schedule.contention import ContentionModel
    from layerfit.schedule.experiments.workload import Workload
    from layerfit.schedule.report import RunReport

schedule_app = typer.Typer(
    help="Schedule many requests over one memory budget (MASA and baselines): graphs, workloads, runs.",
    no_args_is_help=True,
)
app.add_typer(schedule_app, name="schedule")


def _seconds(value: float | None) -> str:
    """A duration for the text report; "-" where it does not exist."""
    return "-" if value is None or not math.isfinite(value) else f"{value:.3f} s"


def _network(name: str, profiles: str | None):
    """A profile from a file, the profile set, or a zoo model captured now (estimated)."""
    from layerfit.schedule.experiments.profile_sets import resolve_network, resolve_profiles

    path = Path(name)
    if path.suffix in (".json", ".yaml", ".yml") or path.exists():
        return resolve_network(name)
    known = resolve_profiles(profiles)
    if name in known:
        return known[name]
    try:
        from layerfit import zoo
    except ImportError:  # pragma: no cover - the zoo is part of the package
        zoo = None
    if zoo is not None and name in zoo.names():
        import torch

        from layerfit.capture import capture
        from layerfit.schedule.profile import profile_from_graph

        entry = zoo.get(name)
        model = zoo.build(name)
        graph = capture(model, torch.zeros(entry.input_shape))
        return profile_from_graph(graph, name, architecture=name)
    raise ScheduleError(
        f"unknown network {name!r}: not a profile file, not in {known.label} "
        f"({', '.join(known.names())}) and not a zoo model"
    )


@schedule_app.command("graph")
def graph_command(
    network: str = typer.Argument(
        ..., help="profile file, profile name (e.g. agenet) or zoo model"
    ),
    scheme: str = typer.Option("partial", "--scheme", help="partial, linear, bulk or deepeye"),
    output: str = typer.Option(..., "-o", "--output", help="image to write (.png, .svg, .pdf)"),
    profiles: str = typer.Option(
        None, "--profiles", help="profile set: 'thesis' (default) or a file"
    ),
    force: bool = typer.Option(False, "--force", help="replace an existing image"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Draw a network's task dependency graph under a scheme (thesis Appendix B)."""
    from layerfit.schedule.graph import build_graph, draw_graph, parse_scheme

    scheme_value = parse_scheme(scheme)
    image_path = check_output_file(output, force=force, option="--output", image=True)
    profile = _network(network, profiles)
    graph = build_graph([profile], scheme_value, job=profile.name)
    draw_graph(graph, image_path, title=f"{profile.name}: {scheme_value.value} dependency graph")
    info = {
        "network": profile.name,
        "scheme": scheme_value.value,
        "tasks": graph.number_of_nodes(),
        "edges": graph.number_of_edges(),
        "source": profile.source,
        "image": str(output),
    }
    if as_json:
        print_json(info)
    else:
        console.print(
            f"{profile.name} ({profile.source}): {info['tasks']} tasks, {info['edges']} dependencies "
            f"({scheme_value.value}) -> {output}",
            highlight=False,
        )


@schedule_app.command("profiles")
def profiles_command(
    profiles: str = typer.Option(
        None, "--profiles", help="profile set: 'thesis' (default) or a file"
    ),
    save: str = typer.Option(None, "--save", help="also write the set to this JSON/YAML file"),
    force: bool = typer.Option(False, "--force"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """List the networks of a profile set: layers, weights, bulk peak, minimum budget, time."""
    from layerfit.schedule.experiments.profile_sets import resolve_profiles
    from layerfit.sizes import format_bytes

    if save is not None:
        check_output_file(save, force=force, option="--save")
    known = resolve_profiles(profiles)
    if save is not None:
        known.save(save)
    rows = [
        {
            "name": p.name,
            "source": p.source,
            "architecture": p.architecture,
            "layers": len(p.layers),
            "weights_bytes": p.weight_bytes,
            "bulk_peak_bytes": p.bulk_peak,
            "largest_task_bytes": p.largest_task_memory,
            "serial_time_s": round(p.total_time, 4),
        }
        for p in known.values()
    ]
    if as_json:
        print_json(rows)
        return
    from layerfit.console import table as new_table

    table = new_table(
        "name", "source", "architecture", "layers", "weights", "bulk peak", "largest task", "serial time",
        title=known.label,
    )
    for r in rows:
        table.add_row(
            r["name"],
            r["source"],
            str(r["architecture"]),
            str(r["layers"]),
            format_bytes(r["weights_bytes"]),
            format_bytes(r["bulk_peak_bytes"]),
            format_bytes(r["largest_task_bytes"]),
            f"{r['serial_time_s']:.2f} s",
        )
    console.print(table)


@schedule_app.command("contention")
def contention_command(
    models: list[str] = typer.Argument(..., help="prepared model folders to read and run"),  # noqa: B008
    repeats: int = typer.Option(3, "--repeats", min=1),
    save: str = typer.Option(None, "--save", help="write the model to this JSON file (for --contention)"),
    force: bool = typer.Option(False, "--force"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Measure how much a load or an execution slows down beside another one on this machine.

    The result feeds ``schedule run --simulate --contention FILE``: without it the
    simulator runs every task at its profiled speed however many run at once."""
    from layerfit.schedule.runtime.profiler import measure_contention

    if save is not None:  # before measuring: a bad path must not lose the measurement
        check_output_file(save, force=force, option="--save")
    model = measure_contention([Path(m) for m in models], repeats=repeats)
    if save is not None:
        model.save(save)
    if as_json:
        print_json(model.describe())
        return
    console.print(
        f"slowdown beside one other task (torch {model.notes['torch_threads']} threads): "
        f"load by load {model.load_by_load:.2f}x, load by execution {model.load_by_exec:.2f}x, "
        f"execution by load {model.exec_by_load:.2f}x, execution by execution "
        f"{model.exec_by_exec:.2f}x" + (f"; written to {save}" if save else ""),
        highlight=False,
    )


@schedule_app.command("bound")
def bound_command(
    workload: str = typer.Option(..., "--workload", help="workload YAML"),
    workers: int = typer.Option(2, "--workers", min=1),
    contention_file: str = typer.Option(
        None, "--contention", help="contention model (file from 'schedule contention')"
    ),
    profiles: str = typer.Option(None, "--profiles", help="profile set (default: the workload's)"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """The least mean response time any policy could give the workload on this many workers.

    Memory is not counted, so it holds at every budget: a policy at 1.2x the bound can
    gain at most a sixth of its response time, whatever the scheduler."""
    from layerfit.schedule.contention import NO_CONTENTION, load_contention
    from layerfit.schedule.experiments.bounds import response_time_bound
    from layerfit.schedule.experiments.profile_sets import resolve_profiles
    from layerfit.schedule.experiments.workload import load_workload

    contention = load_contention(contention_file) if contention_file else NO_CONTENTION
    known = resolve_profiles(profiles) if profiles else None
    loaded = load_workload(workload, known)
    bound = response_time_bound(loaded, workers=workers, contention=contention, profiles=known)
    if as_json:
        print_json({"workload": loaded.name, **bound.to_dict()})
        return
    console.print(_bound_line(bound, loaded.name), highlight=False)


def _bound_line(bound: Any, name: str) -> str:
    parts = ", ".join(f"{key} {value:.3f} s" for key, value in bound.by_bound.items())
    return (
        f"{name}: {bound.jobs} jobs ({bound.mode}), {bound.workers} "
        f"worker{'s' if bound.workers != 1 else ''}: no policy's mean "
        f"response is below {bound.mean_response_s:.3f} s (binding: {bound.binding}; {parts})"
    )


@schedule_app.command("generate")
def generate_command(
    scenario: str = typer.Argument(
        ...,
        help="small-3, mixed-3, large-3, lifelogging, all-networks (batch), random-arrivals, "
        "random-composition, all-random (stochastic I-III), or 'batch' with --networks",
    ),
    output: str = typer.Option(..., "-o", "--output", help="workload YAML to write"),
    count: int = typer.Option(
        150, "--count", min=1, help="number of arrivals (images), at most 1,000,000"
    ),
    intensity: float = typer.Option(
        1.0, "--intensity", help="traffic intensity (stochastic): 0.8, 1.0, 1.2"
    ),
    seed: int = typer.Option(0, "--seed"),
    period: float = typer.Option(
        None, "--period", help="seconds between images (batch); none: closed"
    ),
    networks: str = typer.Option(None, "--networks", help="comma-separated networks for 'batch'"),
    iat_sd: float = typer.Option(0.2, "--iat-sd", help="inter-arrival standard deviation, seconds"),
    profiles: str = typer.Option(
        None, "--profiles", help="profile set: 'thesis' (default) or a file"
    ),
    force: bool = typer.Option(False, "--force"),
) -> None:
    """Write a workload file for a thesis scenario (or a custom batch)."""
    from layerfit.schedule.experiments.profile_sets import resolve_profiles
    from layerfit.schedule.experiments.workload_generators import (
        batch_workload,
        scenario_workload,
        stochastic_workload,
    )

    check_output_file(output, force=force, option="--output")
    known = resolve_profiles(profiles)
    if scenario == "batch":
        if not networks:
            raise ScheduleError("'batch' needs --networks, e.g. --networks agenet,gendernet")
        names = [n.strip() for n in networks.split(",") if n.strip()]
        for name in names:
            known[name]
        workload = batch_workload(names, count, period)
    elif networks:
        names = [n.strip() for n in networks.split(",") if n.strip()]
        workload = stochastic_workload(
            scenario,
            known,
            count=count,
            intensity=intensity,
            seed=seed,
            iat_sd=iat_sd,
            candidates=names,
            profiles_spec=profiles or "thesis",
        )
    else:
        workload = scenario_workload(
            scenario,
            known,
            count=count,
            intensity=intensity,
            seed=seed,
            period=period,
            iat_sd=iat_sd,
        )
    if profiles is not None:
        from dataclasses import replace

        workload = replace(
            workload, profiles=str(Path(profiles).resolve()) if profiles != "thesis" else "thesis"
        )
    workload.save(output)
    span = workload.arrivals[-1].at if workload.mode == "open" else 0.0
    console.print(
        f"{workload.name}: {len(workload.arrivals)} arrivals ({workload.mode}"
        + (f", last at {span:.1f} s" if workload.mode == "open" else "")
        + f") -> {output}",
        highlight=False,
    )


# A real run's runtime options; the simulator takes --policy, --workers, --estimate-factor
# and --gated/--ungated from them too. The defaults are RuntimeConfig's, the thesis's
# (--units layers, no weight cache), which the reproductions of its experiments rely on.
_RUN_RUNTIME_OPTIONS = (
    "policy", "workers", "estimate_factor", "gated", "estimates", "units", "cache_weights", "return_freed_memory"
)


@schedule_app.command("run")
@runtime_options(*_RUN_RUNTIME_OPTIONS)
def run_command(
    workload: str = typer.Option(..., "--workload", help="workload YAML"),
    budget: str | None = typer.Option(None, "--budget", help="memory budget, e.g. 512MB (required)"),
    memory: str | None = typer.Option(None, "--memory", hidden=True),
    runtime: RuntimeOptions = RUNTIME_OPTIONS,  # --policy, --workers, ... (runtime_options)
    simulate: bool = typer.Option(
        False, "--simulate", help="discrete-event simulation from the profiles"
    ),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
    plot: bool = typer.Option(
        False, "--plot", help="write memory over time and the worker timeline"
    ),
    plot_file: str = typer.Option(
        None,
        "--plot-file",
        help="image for --plot (default <workload>-<policy>.png); implies --plot",
    ),
    force: bool = typer.Option(False, "--force", help="replace an existing plot image"),
    physical_memory: str = typer.Option(
        None, "--physical-memory", help="RAM for the paging model (default: budget)"
    ),
    oversize: str = typer.Option(
        "reject", "--oversize", help="a task larger than the budget: reject or alone"
    ),
    no_paging: bool = typer.Option(False, "--no-paging", help="no page-fault slowdown"),
    contention_file: str = typer.Option(
        None,
        "--contention",
        help="how concurrent loads and executions slow each other (file from 'schedule "
        "contention'); for --simulate and for a real run's --compare-simulator",
    ),
    profiles: str = typer.Option(None, "--profiles", help="profile set (default: the workload's)"),
    trace: bool = typer.Option(False, "--trace", help="with --json: every task's start and end"),
    repository: str = typer.Option(
        None, "--repository", help="real run: prepared models, one sub-folder per network name"
    ),
    zoo_cache: str = typer.Option(
        None, "--zoo-cache", help="real run: prepare the thesis networks from the zoo into DIR"
    ),
    resolution: int = typer.Option(
        64, "--resolution", min=32, help="input size for --zoo-cache where the network allows"
    ),
    compare_simulator: bool = typer.Option(
        False, "--compare-simulator", help="real run: also simulate it and report the difference"
    ),
    threads: int | None = typer.Option(
        None, "--threads",
        help="real run: " + COMPUTE_THREADS_HELP + ". 1 lets networks in flight each use a core",
    ),
) -> None:
    """Run a workload under a policy and report response times, deadlines, memory, utilisation.

    Without --simulate the real executor runs prepared models (--repository or --zoo-cache);
    --estimates, --units, --cache-weights, --return-freed-memory and --threads apply to it.
    Exits 2 (after the report) when no job was served, e.g. a budget below every job."""
    from layerfit.schedule.contention import NO_CONTENTION, load_contention

    # every option and the plot path are checked before the (possibly long) run
    memory_budget = _run_budget(budget, memory)
    physical = _positive_size(physical_memory, "--physical-memory")
    policy_name = _check_run_options(runtime, simulate, threads, oversize)
    plot_path = None
    if plot or plot_file is not None:
        plot_path = check_output_file(
            plot_file or f"{Path(workload).stem}-{policy_name}.png", force=force, option="--plot-file", image=True
        )
    contention = load_contention(contention_file) if contention_file else NO_CONTENTION
    if simulate:
        report, loaded, extra = _simulated_run(
            workload, runtime, memory_budget, physical, oversize, no_paging, profiles, contention
        )
    else:
        from layerfit.schedule.experiments.realrun import real_repository, run_real

        set_compute_threads(threads, "--threads")  # before the runtime's threads run a kernel
        folder = real_repository(workload, repository, zoo_cache, resolution)
        report, loaded, extra = run_real(
            workload, runtime.config(folder, memory_budget), compare=compare_simulator, contention=contention
        )
    _report_run(report, loaded.name, memory_budget, runtime["workers"], simulate, contention, extra,
                plot_path, as_json=as_json, trace=trace)


def _run_budget(budget: str | None, memory: str | None) -> int:
    """``schedule run``'s budget in bytes: ``--budget`` (or its old name ``--memory``), required."""
    given = renamed_option(budget, "--budget", memory, "--memory")
    if given is None:
        raise ScheduleError("give the memory budget as --budget, e.g. 512MB")
    size = _positive_size(given, "--budget")
    assert size is not None
    return size


def _positive_size(given: str | None, option: str) -> int | None:
    """``given`` in bytes (``None`` when not given); refused unless it is positive."""
    from layerfit.sizes import parse_bytes

    if given is None:
        return None
    size = parse_bytes(given)
    if size <= 0:
        raise ScheduleError(f"{option} must be a positive size, got {given!r}")
    return size


def _check_run_options(runtime: RuntimeOptions, simulate: bool, threads: int | None, oversize: str) -> str:
    """Refuse ``schedule run``'s options that cannot work, and a real run's options given
    to the simulator; the policy's name."""
    from layerfit.schedule.graph import check_estimate_factor
    from layerfit.schedule.policies import make_policy

    check_estimate_factor(runtime["estimate_factor"], "--estimate-factor")
    policy_name = make_policy(runtime["policy"]).name  # fail early on an unknown name
    if simulate:  # a real run's options; the simulator needs neither PyTorch nor the runtime
        if runtime["units"] != "layers":
            raise ScheduleError("--units applies to a real run; the simulator schedules the profiles' layers")
        if runtime["cache_weights"]:
            raise ScheduleError("--cache-weights applies to a real run; the simulator reads every job's weights")
        if "return_freed_memory" in runtime.given:
            raise ScheduleError("--return-freed-memory applies to a real run; the simulator allocates nothing")
        if threads is not None:
            raise ScheduleError("--threads applies to a real run; the simulator runs no kernels")
    else:
        from layerfit.schedule.runtime.config import check_runtime_units, freed_memory_mode

        check_runtime_units(runtime["units"])
        freed_memory_mode(runtime["return_freed_memory"], "--return-freed-memory")
        check_compute_threads(threads, "--threads")
    if oversize not in ("reject", "alone"):
        raise ScheduleError(f"--oversize must be 'reject' or 'alone', got {oversize!r}")
    return policy_name


def _simulated_run(
    workload: str,
    runtime: RuntimeOptions,
    budget: int,
    physical: int | None,
    oversize: str,
    no_paging: bool,
    profiles: str | None,
    contention: ContentionModel,
) -> tuple[RunReport, Workload, dict[str, Any]]:
    """``schedule run --simulate``: the report, the workload and the lower bound of the jobs served."""
    from layerfit.schedule.experiments.bounds import response_time_bound, served_jobs
    from layerfit.schedule.experiments.penalty import PagingModel
    from layerfit.schedule.experiments.profile_sets import resolve_profiles
    from layerfit.schedule.experiments.simulator import simulate as run_simulation
    from layerfit.schedule.experiments.workload import load_workload

    known = resolve_profiles(profiles) if profiles else None
    loaded = load_workload(workload, known)
    workers = runtime["workers"]
    report = run_simulation(
        loaded,
        runtime["policy"],
        memory=budget,
        workers=workers,
        physical_memory=physical,
        paging=None if no_paging else PagingModel(),
        estimate_factor=runtime["estimate_factor"],
        oversize=oversize,  # type: ignore[arg-type]
        gated=runtime["gated"],
        profiles=known,
        trace=True,
        contention=contention,
    )
    extra: dict[str, Any] = {}
    served = served_jobs(report, loaded.jobs(known))
    if served:
        bound = response_time_bound(served, workers=workers, contention=contention, mode=loaded.mode)
        extra["lower_bound"] = bound.to_dict()
    return report, loaded, extra


def _report_run(
    report: RunReport,
    name: str,
    budget: int,
    workers: int,
    simulate: bool,
    contention: ContentionModel,
    extra: dict[str, Any],
    plot_path: Path | None,
    *,
    as_json: bool,
    trace: bool,
) -> None:
    """Plot, then print the report (JSON or text); raise if the plot failed or no job was served."""
    image, plot_error = None, None
    if plot_path is not None:
        from layerfit.schedule.plot import plot_run

        try:
            image = plot_run(report, plot_path)
        except ScheduleError as exc:  # e.g. the disk filled up: print the report first
            plot_error = exc
    if as_json:
        data = report.to_dict(trace=trace)
        if image is not None:
            data["plot"] = str(image)
        data.update(extra)
        print_json(data)
    else:
        _print_run(report, name, budget, workers, simulate, contention, extra, image)
    if plot_error is not None:  # the report is out; now say what failed
        raise plot_error
    unserved = report.unserved()
    if unserved:
        raise ScheduleError(unserved)


def _print_run(
    report: RunReport,
    name: str,
    budget: int,
    workers: int,
    simulate: bool,
    contention: ContentionModel,
    extra: dict[str, Any],
    image: Path | None,
) -> None:
    """The text report of ``schedule run``."""
    from layerfit.sizes import format_bytes

    summary = report.summary()
    stats = summary["response_time_s"]
    lines = [
        f"{name}: {summary['jobs']} jobs, policy {report.policy}, {workers} workers, "
        f"budget {format_bytes(budget)} ({'simulated' if simulate else 'real executor'}"
        f"{', with contention' if simulate and not contention.free else ''}"
        f"{'' if simulate else ', ' + kernels_on(extra['runtime']['compute_threads'])})",
        "response time: "
        + (
            "- (no job completed)"
            if stats["mean"] is None
            else ", ".join(f"{key} {_seconds(stats[key])}" for key in ("mean", "p50", "p95", "max"))
        ),
        f"jobs: {summary['jobs_by_status']}; deadline misses: {summary['deadline_misses']}",
        f"makespan {summary['makespan_s']:.3f} s; utilisation "
        + ", ".join(f"{u:.0%}" for u in summary["worker_utilisation"]),
        f"peak ledger {format_bytes(summary['peak_ledger_bytes'])}, peak resident "
        f"{format_bytes(summary['peak_resident_bytes'])}; progress rule fired {summary['progress_rule_fired']}x, "
        f"over-commits {summary['overcommits']}, slowed tasks {summary['slowed_tasks']}",
    ]
    rejected = [job for job in report.jobs if job.status == "rejected"]
    for job in rejected:
        lines.append(f"[yellow]rejected[/] {job.error}")
    needs = [job.min_budget for job in rejected if job.min_budget is not None]
    if needs and report.completed:  # served some: say what would serve them all
        lines.append(
            f"[yellow]{len(rejected)} of {len(report.jobs)} jobs rejected[/]: a budget of at "
            f"least {format_bytes(max(needs))} ({max(needs)} bytes) serves every job"
        )
    if "lower_bound" in extra:
        least = extra["lower_bound"]["mean_response_s"]
        lines.append(
            f"lower bound for any policy: mean {least:.3f} s ({extra['lower_bound']['binding']})"
            + (f"; this run is {stats['mean'] / least:.2f}x it" if least > 0 else "")
        )
    comparison = extra.get("simulator_comparison")
    if comparison:
        real_mean = comparison["real"]["mean_response_s"]
        for key, label in (
            ("simulated_profiled_durations", "profiled durations"),
            ("simulated_measured_durations", "the run's durations"),
            ("simulated_profiled_durations_contention", "profiled durations, contention"),
            ("simulated_decontended_durations_contention", "the run's durations de-contended, contention"),
        ):
            if key not in comparison:
                continue
            sim = comparison[key]
            diff = sim["difference"]["mean_response_s"]
            lines.append(
                f"simulator ({label}): mean response {_seconds(sim['mean_response_s'])} "
                f"vs real {_seconds(real_mean)}"
                + (f" ({diff:+.0%})" if diff is not None else "")
            )
    for key, label in (("profiled_work", "profiled work"), ("run_work", "the run's own work")):
        bound = (comparison or {}).get("lower_bound", {}).get(key)
        if bound and bound["real_over_bound"] is not None:
            lines.append(
                f"lower bound for any policy from {label}: mean {bound['mean_response_s']:.3f} s; "
                f"this run is {bound['real_over_bound']:.2f}x it"
            )
    if image is not None:
        lines.append(f"plot written to {image}")
    for line in lines:
        console.print(line, highlight=False)
