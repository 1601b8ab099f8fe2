"""The exact optimum of small instances: Appendix A's constraint model in OR-Tools CP-SAT.

Variables and constraints (Appendix A numbering):

- every task ``i`` is an interval ``[S_i, C_i]`` with ``C_i = S_i + P_i`` (A.3, A.4);
- at most ``W`` tasks run at once (A.2 + A.5). For identical workers this cumulative
  constraint is equivalent to assigning each task to one worker without overlap — an
  interval graph with at most ``W`` overlapping intervals can be coloured with ``W``
  colours — and the assignment is recovered from the solution by greedy colouring;
- ``C_i <= S_k`` for every dependency ``i -> k`` (A.6);
- memory (A.7–A.9): a task uses ``memory - retained`` on its own interval (M_tasks); its
  ``retained`` bytes are a *locked interval* from ``S_i`` to the completion of the task
  that releases it — a load's weights until its unload, an init's structure until the
  last task of its network (M_locked); the sum never exceeds the budget;
- objective: minimise the makespan ``C_max`` (A.1), with the implied bound
  ``W * C_max >= sum(P_i)`` added to help the solver prove optimality.

There is no progress rule here: an instance with a task larger than the budget is
infeasible. The model counts memory exactly as the ledger and the simulator do, so its
makespan is a lower bound for every policy that stays within the budget.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import reduce

from layerfit.errors import ScheduleError
from layerfit.extras import require
from layerfit.schedule.graph import build_job_graph
from layerfit.schedule.tasks import Job, Scheme, Task

nx = require("networkx")


@dataclass
class OptimalSchedule:
    """A CP-SAT solution: status, makespan (in the tasks' time unit) and the schedule."""

    status: str  # OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN, MODEL_INVALID
    makespan: float | None
    lower_bound: float
    starts: dict[str, float] = field(default_factory=dict)
    workers: dict[str, int] = field(default_factory=dict)
    solve_seconds: float = 0.0
    time_unit: float = 1.0

    @property
    def optimal(self) -> bool:
        return self.status == "OPTIMAL"


def _time_unit(durations: Sequence[float]) -> float:
    """CP-SAT counts time in whole units: 1 when every duration is whole; otherwise the
    coarsest of 1 ms, 100 µs and 10 µs that makes every non-zero duration at least 100
    units (rounding moves none by more than 0.5 %), and 1 µs where a task is shorter
    still (profiled tasks last from microseconds on)."""
    if all(float(d).is_integer() for d in durations):
        return 1.0
    shortest = min((d for d in durations if d > 0), default=1.0)
    return next((unit for unit in (1e-3, 1e-4, 1e-5) if shortest >= 100 * unit), 1e-6)


def solve_optimal(
    graph: nx.DiGraph,
    *,
    budget: int,
    workers: int,
    time_limit: float = 10.0,
    search_workers: int = 2,
    time_unit: float | None = None,
) -> OptimalSchedule:
    """Minimum makespan of the tasks of ``graph`` on ``workers`` workers within ``budget``.

    One CP-SAT model stated in one place (about 85 lines): intervals, precedences, the
    workers' and the memory's cumulative constraints and the objective share the
    per-task variables, which pieces would pass back and forth."""
    cp_model = require("ortools.sat.python.cp_model")

    if workers < 1:
        raise ScheduleError(f"need at least one worker, got {workers}")
    tasks: list[Task] = [data["task"] for _, data in graph.nodes(data=True)]
    if not tasks:
        return OptimalSchedule("OPTIMAL", 0.0, 0.0)
    unit = time_unit or _time_unit([t.duration for t in tasks])
    duration = {t.id: int(round(t.duration / unit)) for t in tasks}
    memory_values = [t.memory for t in tasks] + [t.retained for t in tasks] + [budget]
    scale = reduce(math.gcd, [v for v in memory_values if v] or [1])
    if any(t.memory > budget for t in tasks):
        return OptimalSchedule("INFEASIBLE", None, math.inf, time_unit=unit)

    model = cp_model.CpModel()
    horizon = sum(duration.values())
    start, end, interval = {}, {}, {}
    for t in tasks:
        start[t.id] = model.new_int_var(0, horizon, f"S[{t.id}]")
        end[t.id] = model.new_int_var(0, horizon, f"C[{t.id}]")
        interval[t.id] = model.new_interval_var(
            start[t.id], duration[t.id], end[t.id], f"T[{t.id}]"
        )
    model.add_cumulative([interval[t.id] for t in tasks], [1] * len(tasks), workers)
    for a, b in graph.edges:
        model.add(end[a] <= start[b])

    network_end = {}
    for uid in dict.fromkeys(t.network for t in tasks):
        network_end[uid] = model.new_int_var(0, horizon, f"end[{uid}]")
        model.add_max_equality(network_end[uid], [end[t.id] for t in tasks if t.network == uid])
    releaser = {key: t.id for t in tasks for key in t.releases}
    mem_intervals, mem_demands = [], []
    for t in tasks:
        transient = (t.memory - t.retained) // scale
        if transient:
            mem_intervals.append(interval[t.id])
            mem_demands.append(transient)
        if t.retained:
            lock_end = end[releaser[t.id]] if t.id in releaser else network_end[t.network]
            size = model.new_int_var(0, horizon, f"lock[{t.id}]")
            mem_intervals.append(
                model.new_interval_var(start[t.id], size, lock_end, f"locked[{t.id}]")
            )
            mem_demands.append(t.retained // scale)
    if mem_intervals:
        model.add_cumulative(mem_intervals, mem_demands, budget // scale)
    makespan = model.new_int_var(0, horizon, "C_max")
    model.add_max_equality(makespan, list(end.values()))
    # Redundant (implied by the worker constraint) but it proves optimality of many small
    # instances at once: W workers need at least sum(P_i) / W time.
    model.add(makespan * workers >= horizon)
    model.minimize(makespan)

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = max(1, min(int(search_workers), 2))
    began = time.perf_counter()
    status = solver.solve(model)
    elapsed = time.perf_counter() - began
    name = solver.status_name(status)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return OptimalSchedule(
            name, None, solver.best_objective_bound * unit, solve_seconds=elapsed, time_unit=unit
        )
    starts = {t.id: solver.value(start[t.id]) * unit for t in tasks}
    return OptimalSchedule(
        status=name,
        makespan=solver.value(makespan) * unit,
        lower_bound=solver.best_objective_bound * unit,
        starts=starts,
        workers=_assign_workers(
            tasks, {t.id: solver.value(start[t.id]) for t in tasks}, duration, workers
        ),
        solve_seconds=elapsed,
        time_unit=unit,
    )


def _assign_workers(
    tasks: Sequence[Task], start: dict[str, int], duration: dict[str, int], workers: int
) -> dict[str, int]:
    """Greedy interval colouring: each task to the lowest-numbered free worker.

    A zero-length task takes no worker time (the cumulative constraint ignores it), so it
    goes to any worker, free or not, without occupying it.
    """
    free_at = [0] * workers
    assignment = {}
    for t in sorted(tasks, key=lambda t: (start[t.id], duration[t.id])):
        if duration[t.id] == 0:
            assignment[t.id] = next((w for w in range(workers) if free_at[w] <= start[t.id]), 0)
            continue
        worker = next((w for w in range(workers) if free_at[w] <= start[t.id]), None)
        if worker is None:  # cannot happen when the cumulative constraint holds
            raise ScheduleError(f"no free worker for {t.id} at {start[t.id]}")
        assignment[t.id] = worker
        free_at[worker] = start[t.id] + duration[t.id]
    return assignment


def solve_jobs(
    jobs: Sequence[Job],
    *,
    budget: int,
    workers: int,
    time_limit: float = 10.0,
    search_workers: int = 2,
) -> OptimalSchedule:
    """The optimum for ``jobs`` all available at time 0 (their partial graphs together)."""
    graph = nx.DiGraph()
    for job in jobs:
        graph = nx.union(graph, build_job_graph(job, Scheme.PARTIAL))
    return solve_optimal(
        graph, budget=budget, workers=workers, time_limit=time_limit, search_workers=search_workers
    )


def check_schedule(graph: nx.DiGraph, schedule: OptimalSchedule, budget: int) -> None:
    """Raise if ``schedule`` breaks a dependency, a worker or the memory budget (for tests)."""
    tasks = {node: data["task"] for node, data in graph.nodes(data=True)}
    end = {i: schedule.starts[i] + tasks[i].duration for i in tasks}
    eps = 1e-9
    for a, b in graph.edges:
        if end[a] > schedule.starts[b] + eps:
            raise ScheduleError(f"{b} starts before {a} ends")
    releaser = {key: t.id for t in tasks.values() for key in t.releases}
    network_end: dict[str, float] = {}
    for t in tasks.values():
        network_end[t.network] = max(network_end.get(t.network, 0.0), end[t.id])
    events = sorted({schedule.starts[i] for i in tasks})
    for moment in events:
        used = 0
        for t in tasks.values():
            s = schedule.starts[t.id]
            if s <= moment < end[t.id]:
                used += t.memory - t.retained
            lock_end = end[releaser[t.id]] if t.id in releaser else network_end[t.network]
            if t.retained and s <= moment < lock_end:
                used += t.retained
        if used > budget:
            raise ScheduleError(f"memory {used} above budget {budget} at t={moment}")
    per_worker: dict[int, list[tuple[float, float]]] = {}
    for i, w in schedule.workers.items():
        if tasks[i].duration > 0:
            per_worker.setdefault(w, []).append((schedule.starts[i], end[i]))
    for spans in per_worker.values():
        spans.sort()
        for (_, e0), (s1, _) in zip(spans, spans[1:], strict=False):
            if s1 < e0 - eps:
                raise ScheduleError("two tasks overlap on one worker")


__all__ = ["OptimalSchedule", "check_schedule", "solve_jobs", "solve_optimal"]
