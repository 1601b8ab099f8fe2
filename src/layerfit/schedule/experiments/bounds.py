"""How fast *any* policy could serve a workload: a lower bound on the mean response time.

A policy's mean response time alone does not say how much better a scheduler could do.
This module bounds it from below for every policy at once, from the profiled work and
the machine's capacity, ignoring memory (a budget only adds waiting, so the bound holds
at every budget):

- **critical path**: a job cannot finish before its longest chain of dependent tasks,
  ``init → load_i → exec_i → … → exec_last → unload_last`` of its slowest network, each
  at its alone speed (no scheme allows less; contention and paging only slow tasks);
- **capacity**: at any instant the tasks in flight on ``workers`` workers complete at
  most ``c`` seconds of alone-speed work per second, where ``c`` is the best mix of
  loads and executions under the :class:`~layerfit.schedule.contention.ContentionModel`
  (``workers`` with no contention). Bounds are taken for the loads' work, the
  executions' work, both together, and every task's work (init and unload included,
  ``c = workers``).

For a closed workload (each job arrives when the previous one has finished) each job
runs alone, and its response is at least the largest of these bounds. For an open
workload, the capacity bounds become a single machine of speed ``c`` that serves jobs
as they arrive by shortest remaining work first, preemptively: that order minimises the
total completion time on one machine (SRPT), and any schedule of the real system is a
schedule of that machine. The bound is the largest of the totals, over the jobs.

A closed workload on one worker reaches the bound (each job's tasks back to back). In
general it says how much of a baseline's response time any scheduler could remove: a
target "policy ≤ 0.5 × baseline" is out of reach when ``bound > 0.5 × baseline``.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from layerfit.errors import ScheduleError
from layerfit.schedule.contention import NO_CONTENTION, ContentionModel
from layerfit.schedule.experiments.workload import Workload
from layerfit.schedule.profile import NetworkProfile, ProfileSet
from layerfit.schedule.tasks import Job, TaskKind

if TYPE_CHECKING:
    from layerfit.schedule.report import RunReport

# the work each capacity bound counts ("workers": every task, init and unload included)
_RESOURCES = ("loads", "executions", "loads+executions", "workers")


@dataclass(frozen=True)
class Capacity:
    """Most alone-speed work per second that ``workers`` workers can complete."""

    loads: float
    executions: float
    loads_and_executions: float
    workers: float

    def of(self, resource: str) -> float:
        return {
            "loads": self.loads,
            "executions": self.executions,
            "loads+executions": self.loads_and_executions,
            "workers": self.workers,
        }[resource]


def capacity(workers: int, contention: ContentionModel = NO_CONTENTION) -> Capacity:
    """The best throughput of each kind of work over every mix of ``workers`` tasks."""
    if workers < 1:
        raise ScheduleError(f"workers must be at least 1, got {workers}")
    best = {"loads": 0.0, "executions": 0.0, "both": 0.0}
    for loads in range(workers + 1):
        for execs in range(workers + 1 - loads):
            load_rate = loads * contention.rate_in(TaskKind.LOAD, loads, execs) if loads else 0.0
            exec_rate = execs * contention.rate_in(TaskKind.EXEC, loads, execs) if execs else 0.0
            best["loads"] = max(best["loads"], load_rate)
            best["executions"] = max(best["executions"], exec_rate)
            best["both"] = max(best["both"], load_rate + exec_rate)
    return Capacity(best["loads"], best["executions"], best["both"], float(workers))


def network_work(profile: NetworkProfile) -> dict[str, float]:
    """Alone-speed seconds of each kind of work in one run of ``profile``."""
    loads = sum(layer.load_time for layer in profile.layers)
    execs = sum(layer.exec_time for layer in profile.layers)
    return {
        "loads": loads,
        "executions": execs,
        "loads+executions": loads + execs,
        "workers": profile.total_time,
    }


def critical_path(profile: NetworkProfile) -> float:
    """The longest chain of dependent tasks of ``profile``, every task at its alone speed.

    Execution *i* needs load *i* and execution *i − 1*; every load needs the init; the
    last unload follows the last execution.
    """
    longest, tail = 0.0, 0.0
    for layer in reversed(profile.layers):
        tail += layer.exec_time  # exec_i … exec_last
        longest = max(longest, layer.load_time + tail)
    return profile.init_time + longest + (profile.unload_time if profile.layers else 0.0)


def _srpt_total_completion(releases: Sequence[float], works: Sequence[float], speed: float) -> float:
    """Σ completion times of jobs on one preemptive machine of ``speed``, shortest
    remaining work first (optimal for that machine)."""
    order = sorted(range(len(releases)), key=lambda j: releases[j])
    pending: list[float] = []  # remaining work of released, unfinished jobs (a heap)
    now, total, k = 0.0, 0.0, 0
    while k < len(order) or pending:
        if not pending:
            now = max(now, releases[order[k]])
        while k < len(order) and releases[order[k]] <= now:
            heapq.heappush(pending, works[order[k]])
            k += 1
        remaining = heapq.heappop(pending)
        next_release = releases[order[k]] if k < len(order) else float("inf")
        done_at = now + remaining / speed
        if done_at <= next_release:
            now = done_at
            total += now
        else:  # preempted (or not) at the next arrival: it keeps the rest of its work
            heapq.heappush(pending, remaining - (next_release - now) * speed)
            now = next_release
    return total


@dataclass(frozen=True)
class ResponseBound:
    """A lower bound on the mean response time of a workload under any policy."""

    mean_response_s: float
    binding: str  # the largest bound (closed: the one largest for the most jobs)
    by_bound: dict[str, float]  # the mean response each bound alone gives
    capacity: Capacity
    workers: int
    mode: str
    jobs: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "mean_response_s": self.mean_response_s,
            "binding": self.binding,
            "by_bound": dict(self.by_bound),
            "capacity": {resource: self.capacity.of(resource) for resource in _RESOURCES},
            "workers": self.workers,
            "mode": self.mode,
            "jobs": self.jobs,
        }


def response_time_bound(
    workload: Workload | Sequence[Job],
    *,
    workers: int,
    contention: ContentionModel = NO_CONTENTION,
    profiles: ProfileSet | None = None,
    mode: str | None = None,
) -> ResponseBound:
    """The least mean response time any policy could give ``workload`` on ``workers``.

    Memory is not counted: the bound holds at every budget, and for the simulator
    exactly (with the same ``contention``). For the real executor it holds as far as
    the profiles are not slower than the run. ``mode`` overrides the workload's.
    """
    if isinstance(workload, Workload):
        jobs = workload.jobs(profiles)
        mode = mode or workload.mode
    else:
        jobs = list(workload)
        mode = mode or "open"
    if mode not in ("open", "closed"):
        raise ScheduleError(f"mode must be 'open' or 'closed', got {mode!r}")
    if not jobs:
        raise ScheduleError("no jobs to bound")
    cap = capacity(workers, contention)
    paths = [max((critical_path(n) for n in job.networks), default=0.0) for job in jobs]
    per_job = [[network_work(n) for n in job.networks] for job in jobs]
    works = {
        resource: [sum(net[resource] for net in nets) for nets in per_job]
        for resource in _RESOURCES
    }
    by_bound: dict[str, float]
    if mode == "closed":  # each job alone: the largest of its own bounds, averaged
        alone = {"critical path": paths} | {
            resource: [w / cap.of(resource) for w in works[resource]]
            for resource in _RESOURCES
            if cap.of(resource)
        }
        by_bound = {name: sum(values) / len(jobs) for name, values in alone.items()}
        largest = [max(alone, key=lambda name: alone[name][j]) for j in range(len(jobs))]
        mean = sum(alone[name][j] for j, name in enumerate(largest)) / len(jobs)
        binding = Counter(largest).most_common(1)[0][0]
    else:
        releases = [job.arrival for job in jobs]
        arrived = sum(releases)
        by_bound = {"critical path": sum(paths) / len(jobs)}
        for resource in _RESOURCES:
            if cap.of(resource):
                total = _srpt_total_completion(releases, works[resource], cap.of(resource))
                by_bound[resource] = (total - arrived) / len(jobs)
        mean = max(by_bound.values())
        binding = max(by_bound, key=lambda name: by_bound[name])
    return ResponseBound(mean, binding, by_bound, cap, workers, mode, len(jobs))


def served_jobs(report: RunReport, jobs: Sequence[Job]) -> list[Job]:
    """Those of ``jobs`` (in the order they were submitted) that ``report``'s run completed:
    the jobs a bound for that run counts (a rejected job costs nothing). Matched by order,
    since an executor may name its jobs itself; empty when the counts differ."""
    submitted = sorted(report.jobs, key=lambda result: result.arrival)
    if len(submitted) != len(jobs):
        return []
    return [job for job, result in zip(jobs, submitted, strict=True) if result.status == "done"]


__all__ = [
    "Capacity",
    "ResponseBound",
    "capacity",
    "critical_path",
    "network_work",
    "response_time_bound",
    "served_jobs",
]
