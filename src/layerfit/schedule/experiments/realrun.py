"""A workload file run by the real executor, and the simulator run on the same workload.

:func:`run_workload` releases a :class:`~layerfit.schedule.experiments.workload.Workload`'s
arrivals into a :class:`~layerfit.schedule.runtime.executor.Runtime` — open workloads at their
arrival times (the driver sleeps until each one), closed workloads one after the other
— and returns the same :class:`~layerfit.schedule.report.RunReport` the simulator
returns (``executor = "real"``). Network names are model folders of the runtime's
repository; every network gets the deterministic example input of its prepared model.

:func:`compare_with_simulator` runs the simulator on the same workload, policy, budget
and workers with the runtime's profiles (no paging: the real executor keeps the
budget), and again with every task's duration replaced by the mean of what the real
run measured for it; given a contention model, also under that model (with profiled
durations, and with the run's durations turned back into work alone by the model). It
reports each against the real run.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections import defaultdict
from concurrent.futures import Future, wait
from dataclasses import replace
from pathlib import Path
from typing import Any

from layerfit.errors import LayerfitError
from layerfit.schedule.contention import NO_CONTENTION, SHARED_KINDS, ContentionModel
from layerfit.schedule.experiments.workload import Workload
from layerfit.schedule.profile import NetworkProfile, ProfileSet
from layerfit.schedule.report import RunReport
from layerfit.schedule.runtime.config import RuntimeConfig
from layerfit.schedule.runtime.executor import InferenceJob, Runtime
from layerfit.schedule.tasks import TaskKind

_SHARED = {kind.name for kind in SHARED_KINDS}


def run_workload(runtime: Runtime, workload: Workload, *, warmup: bool = False) -> RunReport:
    """Run ``workload`` on ``runtime`` (created with ``trace=True``) and report it.

    With ``warmup``, every network of the workload runs once first, alone, and is not
    reported (first reads verify checksums; PyTorch sets up its kernels).
    """
    jobs = workload.jobs(runtime.profile_set())
    inputs = _inputs(runtime, jobs)
    if warmup:
        warm_up(runtime, workload)
    futures: list[Future] = []
    start = time.monotonic()
    for job in jobs:
        spec = InferenceJob(
            _names(job),
            {name: inputs[name] for name in _names(job)},
            deadline=job.deadline,
            tag=job.input,
        )
        if workload.mode == "open":
            delay = start + job.arrival - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # the next arrival is in the future: nothing to do until then
            futures.append(runtime.submit(spec))
        else:
            future = runtime.submit(spec)
            wait([future])
            futures.append(future)
    wait(futures)
    return runtime.run_report(workload.name)


def warm_up(runtime: Runtime, workload: Workload) -> None:
    """Run every network of ``workload`` once, alone, and forget it: first reads verify
    checksums and PyTorch sets up its kernels, which a measured run should not include.
    Separate from :func:`run_workload` so a caller can act in between (a benchmark sets
    its memory limit once the process is warm)."""
    for name, x in _inputs(runtime, workload.jobs(runtime.profile_set())).items():
        with contextlib.suppress(LayerfitError):  # e.g. too large: the run reports it
            runtime.infer(name, x).result()
    runtime.clear_trace()


def _inputs(runtime: Runtime, jobs: list[Any]) -> dict[str, Any]:
    return {name: runtime.example_input(name) for job in jobs for name in _names(job)}


def _names(job: Any) -> tuple[str, ...]:
    return tuple(profile.name for profile in job.networks)


def measured_profiles(
    report: RunReport, profiles: ProfileSet, *, contention: ContentionModel | None = None
) -> ProfileSet:
    """``profiles`` with each task's duration replaced by its mean in the real run.

    Means, not medians: a queue depends on the total work, and medians drop the tail.
    With ``contention``, each load's and execution's duration is first turned back into
    its work alone: the integral, over its span, of the rate the model gives it beside
    the loads and executions the trace shows in flight with it (for a simulator that
    applies the model itself; without that, a simulator with the model would count the
    run's contention twice).
    """
    durations = _alone_work(report, contention) if contention is not None else {}
    samples: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    for index, record in enumerate(report.tasks):
        name = record.network.rsplit("/", 1)[-1].split(".", 1)[-1]
        samples[(name, record.kind, record.layer)].append(
            durations.get(index, record.end - record.start)
        )

    def mean(name: str, kind: str, layer: int, default: float) -> float:
        values = samples.get((name, kind, layer))
        return statistics.fmean(values) if values else default

    out: list[NetworkProfile] = []
    for profile in profiles.values():
        layers = tuple(
            replace(
                layer,
                load_time=mean(profile.name, "LOAD", i, layer.load_time),
                exec_time=mean(profile.name, "EXEC", i, layer.exec_time),
            )
            for i, layer in enumerate(profile.layers)
        )
        out.append(
            replace(
                profile,
                layers=layers,
                init_time=mean(profile.name, "INIT", -1, profile.init_time),
                unload_time=statistics.fmean(
                    [
                        mean(profile.name, "UNLOAD", i, profile.unload_time)
                        for i in range(len(profile.layers))
                    ]
                ),
                source="measured-in-run" + ("-decontended" if contention is not None else ""),
            )
        )
    which = "de-contended durations" if contention is not None else "durations"
    return ProfileSet(out, label=f"{profiles.label} ({which} of the real run)")


def _alone_work(report: RunReport, contention: ContentionModel) -> dict[int, float]:
    """Index in ``report.tasks`` -> the work alone of each load and execution, by the model."""
    shared = [(i, r) for i, r in enumerate(report.tasks) if r.kind in _SHARED and r.end > r.start]
    changes = sorted({t for _, r in shared for t in (r.start, r.end)})
    starting: dict[float, list[int]] = defaultdict(list)
    for i, r in shared:
        starting[r.start].append(i)
    work = dict.fromkeys((i for i, _ in shared), 0.0)
    inflight: set[int] = set()
    tasks = report.tasks
    for lo, hi in zip(changes, changes[1:], strict=False):
        inflight = {i for i in inflight if tasks[i].end > lo}
        inflight.update(starting.get(lo, ()))
        loads = sum(tasks[i].kind == TaskKind.LOAD.name for i in inflight)
        execs = len(inflight) - loads
        for i in inflight:
            work[i] += (hi - lo) * contention.rate_in(TaskKind[tasks[i].kind], loads, execs)
    return work


def compare_with_simulator(
    real: RunReport, workload: Workload, profiles: ProfileSet, *, memory: int, workers: int,
    estimate_factor: float = 1.0, contention: ContentionModel = NO_CONTENTION,
) -> dict[str, Any]:
    """The simulator on the same run vs real: with profiled durations, and with the mean
    durations the run measured. With a ``contention`` model, also under that model with
    profiled durations, and with the run's durations turned back into work alone by the
    model (the simulator then adds the model's slowdowns to its own schedule)."""
    from layerfit.schedule.experiments.simulator import simulate

    out: dict[str, Any] = {"real": _headline(real)}
    measured = measured_profiles(real, profiles)
    variants = [
        ("profiled_durations", profiles, NO_CONTENTION),
        ("measured_durations", measured, NO_CONTENTION),
    ]
    alone = measured  # the run's work alone: with no contention, its durations
    if not contention.free:
        alone = measured_profiles(real, profiles, contention=contention)
        variants += [
            ("profiled_durations_contention", profiles, contention),
            ("decontended_durations_contention", alone, contention),
        ]
    for label, used, shared in variants:
        sim = simulate(
            workload,
            real.policy,
            memory=memory,
            workers=workers,
            paging=None,
            estimate_factor=estimate_factor,
            profiles=used,
            trace=False,
            contention=shared,
        )
        headline = _headline(sim)
        headline["difference"] = {
            key: _relative(headline[key], out["real"][key])
            for key in ("mean_response_s", "p95_response_s", "makespan_s")
        }
        if not shared.free:
            headline["contention_model"] = shared.describe()
        out[f"simulated_{label}"] = headline
    out["lower_bound"] = _lower_bounds(
        real, workload, {"profiled_work": profiles, "run_work": alone}, workers, contention
    )
    return out


def _lower_bounds(
    real: RunReport, workload: Workload, works: dict[str, ProfileSet], workers: int,
    contention: ContentionModel,
) -> dict[str, Any]:
    """The least mean response any policy could give the jobs this run served, with each
    of ``works`` (the profiles; the run's own durations, de-contended by the model)."""
    from layerfit.schedule.experiments.bounds import response_time_bound, served_jobs

    mean = _headline(real)["mean_response_s"]
    out: dict[str, Any] = {}
    for label, used in works.items():
        jobs = served_jobs(real, workload.jobs(used))
        if not jobs:
            return {}
        bound = response_time_bound(jobs, workers=workers, contention=contention, mode=workload.mode)
        out[label] = {**bound.to_dict(), "real_over_bound": _ratio(mean, bound.mean_response_s)}
    return out


def real_repository(
    workload_path: str | Path,
    repository: str | Path | None = None,
    zoo_cache: str | Path | None = None,
    resolution: int = 64,
) -> str | Path:
    """The folder of prepared models a real run of the workload uses: ``repository``, or
    the thesis networks the workload names prepared from the zoo into ``zoo_cache`` at
    ``resolution`` (:mod:`layerfit.schedule.experiments.thesis_zoo`); exactly one of the two."""
    from layerfit.errors import ScheduleError
    from layerfit.schedule.experiments.thesis_zoo import THESIS_ZOO, prepare_thesis_models
    from layerfit.schedule.experiments.workload import load_workload

    if (repository is None) == (zoo_cache is None):
        raise ScheduleError(
            "running real models needs exactly one of --repository DIR (prepared models, one "
            "per sub-folder named as in the workload) and --zoo-cache DIR (prepare the thesis "
            "networks from the zoo); or pass --simulate"
        )
    if zoo_cache is not None:
        names = {n for arrival in load_workload(workload_path).arrivals for n in arrival.networks}
        unknown = sorted(n for n in names if n not in THESIS_ZOO)
        if unknown:
            raise ScheduleError(
                f"--zoo-cache prepares the thesis networks ({', '.join(THESIS_ZOO)}); the workload "
                f"also names {', '.join(unknown)}: prepare those into a --repository instead"
            )
        repository = prepare_thesis_models(zoo_cache, sorted(names), resolution=resolution)
    assert repository is not None
    return repository


def run_real(
    workload_path: str | Path,
    config: RuntimeConfig,
    *,
    compare: bool = False,
    contention: ContentionModel = NO_CONTENTION,
) -> tuple[RunReport, Workload, dict[str, Any]]:
    """``layerfit schedule run`` without ``--simulate``: the workload on real prepared models.

    The runtime is ``config``'s (traced: the report needs every task); its repository's
    folders are the workload's network names (:func:`real_repository`). ``contention`` is
    the model the simulator comparison also runs with. Returns the report, the workload
    and extra facts (runtime stats, model states and, with ``compare``, the simulator's
    view of the same run).
    """
    from layerfit.errors import WorkloadError
    from layerfit.schedule.experiments.workload import load_workload

    with Runtime(replace(config, trace=True)) as runtime:
        index = runtime.index()
        try:
            workload = load_workload(workload_path, runtime.profile_set())
        except WorkloadError as exc:
            unavailable = [f"{m['name']} ({m['reason']})" for m in index if m["state"] != "READY"]
            if not unavailable:
                raise
            raise WorkloadError(f"{exc}; unavailable models: {'; '.join(unavailable)}") from None
        report = run_workload(runtime, workload)
        extra: dict[str, Any] = {"runtime": runtime.stats(), "models": index}
        profiles = runtime.profile_set()
    if compare:
        extra["simulator_comparison"] = compare_with_simulator(
            report, workload, profiles, memory=config.memory_budget, workers=config.workers,
            estimate_factor=config.estimate_factor, contention=contention,
        )
    return report, workload, extra


def _headline(report: RunReport) -> dict[str, Any]:
    stats = report.response_stats()
    return {
        "mean_response_s": stats["mean"],
        "p95_response_s": stats["p95"],
        "makespan_s": report.makespan,
        "progress_rule_fired": report.progress_count,
        "peak_ledger_bytes": report.peak_memory,
        "jobs_done": len(report.completed),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    """a / b; None where undefined."""
    if a is None or b is None or not math.isfinite(a) or not math.isfinite(b) or b <= 0:
        return None
    return a / b


def _relative(simulated: float, real: float) -> float | None:
    """(simulated - real) / real; None where undefined."""
    if real is None or simulated is None or not math.isfinite(real) or real == 0:
        return None
    return (simulated - real) / real


__all__ = [
    "compare_with_simulator",
    "measured_profiles",
    "real_repository",
    "run_real",
    "run_workload",
    "warm_up",
]
