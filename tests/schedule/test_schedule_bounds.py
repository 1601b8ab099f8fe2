"""The lower bound on the mean response time that no policy can beat."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schedule_helpers import net

from layerfit.errors import ScheduleError
from layerfit.schedule.contention import ContentionModel
from layerfit.schedule.experiments.bounds import (
    capacity,
    critical_path,
    response_time_bound,
    served_jobs,
)
from layerfit.schedule.experiments.simulator import simulate
from layerfit.schedule.experiments.workload import Arrival, Workload
from layerfit.schedule.policies import policy_names
from layerfit.schedule.tasks import Job


def test_capacity_without_contention_is_one_task_per_worker():
    cap = capacity(3)
    assert (cap.loads, cap.executions, cap.loads_and_executions, cap.workers) == (3, 3, 3, 3)


def test_capacity_takes_the_best_mix_under_contention():
    # two loads at 1/2 each: no better than one; a load beside an execution: 1/1.25 + 1/1.25
    model = ContentionModel(load_by_load=2.0, load_by_exec=1.25, exec_by_load=1.25, exec_by_exec=1.0)
    cap = capacity(2, model)
    assert cap.loads == pytest.approx(1.0)
    assert cap.executions == pytest.approx(2.0)
    assert cap.loads_and_executions == pytest.approx(2.0)  # two executions beat a load + an execution
    cap3 = capacity(3, model)
    assert cap3.loads_and_executions == pytest.approx(3.0)
    assert capacity(1, model).loads_and_executions == 1.0
    with pytest.raises(ScheduleError, match="workers"):
        capacity(0)


def test_critical_path_is_the_longest_load_then_the_executions_after_it():
    profile = dataclasses.replace(
        net("n", [1, 1, 1], load=[1.0, 5.0, 0.5], execs=[2.0, 1.0, 3.0], init_time=0.25),
        unload_time=0.125,
    )
    # init 0.25 + max(1 + 6, 5 + 4, 0.5 + 3) + last unload 0.125
    assert critical_path(profile) == pytest.approx(0.25 + 9.0 + 0.125)


def test_closed_jobs_on_one_worker_meet_the_bound_exactly():
    """One worker runs each job's tasks back to back: the bound is reached by every policy."""
    a = net("a", [1, 2], load=[1.0, 2.0], execs=[0.5, 0.5])
    b = net("b", [3], load=[3.0], execs=[1.0])
    workload = Workload(
        (Arrival(0.0, ("a",)), Arrival(0.0, ("a", "b"))), name="w", mode="closed", profiles=None
    )
    from layerfit.schedule.profile import ProfileSet

    profiles = ProfileSet([a, b])
    bound = response_time_bound(workload, workers=1, profiles=profiles)
    assert bound.mean_response_s == pytest.approx((4.0 + 8.0) / 2)
    assert bound.mode == "closed" and bound.jobs == 2
    for name in ("masa", "bulk", "linear-fcfs"):
        report = simulate(workload, name, memory=100, workers=1, paging=None, profiles=profiles)
        assert report.response_stats()["mean"] == pytest.approx(bound.mean_response_s)


def test_open_jobs_are_bounded_by_shortest_remaining_work_first():
    # one worker, work 3 at t=0 and 1 at t=0 and 1 at t=1: SRPT finishes them at 1, 2 and 5
    jobs = [
        Job("long", (net("l", [1], load=[2.0], execs=[1.0]),), arrival=0.0, seq=0),
        Job("short", (net("s", [1], load=[0.5], execs=[0.5]),), arrival=0.0, seq=1),
        Job("late", (net("t", [1], load=[0.5], execs=[0.5]),), arrival=1.0, seq=2),
    ]
    bound = response_time_bound(jobs, workers=1)
    assert bound.by_bound["workers"] == pytest.approx((1.0 + (2.0 - 1.0) + 5.0) / 3)
    assert bound.mean_response_s == pytest.approx(bound.by_bound["workers"])
    assert bound.binding in ("workers", "loads+executions")  # equal: no init or unload work
    # a non-preemptive policy that runs "short" first reaches it; every policy is at or above
    for name in policy_names():
        report = simulate(jobs, name, memory=100, workers=1, paging=None)
        assert report.response_stats()["mean"] >= bound.mean_response_s - 1e-9


def test_contention_raises_the_bound_of_parallel_loads():
    jobs = [Job(f"j{k}", (net(f"n{k}", [1], load=[2.0], execs=[0.0]),), seq=k) for k in range(2)]
    free = response_time_bound(jobs, workers=2)
    shared = response_time_bound(jobs, workers=2, contention=ContentionModel(load_by_load=2.0))
    assert free.mean_response_s == pytest.approx(2.0)  # both loads at once
    assert shared.mean_response_s == pytest.approx((2.0 + 4.0) / 2)  # the disk serves one
    assert shared.binding == "loads"
    assert shared.to_dict()["capacity"]["loads"] == pytest.approx(1.0)


def test_a_run_is_bounded_over_the_jobs_it_served():
    small = Job("small", (net("s", [2]),), arrival=0.0, seq=0)
    huge = Job("huge", (net("h", [50]),), arrival=1.0, seq=1)  # larger than the budget: rejected
    later = Job("later", (net("t", [3]),), arrival=2.0, seq=2)
    report = simulate([small, huge, later], "masa", memory=10, workers=1, paging=None)
    assert [job.id for job in served_jobs(report, [small, huge, later])] == ["small", "later"]
    assert served_jobs(report, [small, huge]) == []  # not this run's jobs


def test_bad_input_is_refused():
    with pytest.raises(ScheduleError, match="no jobs"):
        response_time_bound([], workers=2)
    job = Job("j", (net("n", [1]),))
    with pytest.raises(ScheduleError, match="mode"):
        response_time_bound([job], workers=2, mode="batch")


layer = st.tuples(st.integers(1, 12), st.integers(0, 4), st.integers(0, 3))
network = st.tuples(st.lists(layer, min_size=1, max_size=3), st.integers(0, 2), st.integers(0, 1))
slowdown = st.sampled_from([1.0, 1.25, 2.0, 3.0])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(st.lists(network, min_size=1, max_size=2), min_size=1, max_size=4),
    gaps=st.lists(st.integers(0, 6), min_size=4, max_size=4),
    workers=st.integers(1, 3),
    factors=st.tuples(slowdown, slowdown, slowdown, slowdown),
    memory=st.integers(12, 40),
    mode=st.sampled_from(["open", "closed"]),
)
def test_no_policy_beats_the_bound(specs, gaps, workers, factors, memory, mode):
    """Every policy's simulated mean response, with contention and paging, is at least the
    bound: the bound ignores memory and counts every task at its alone speed."""
    jobs, at = [], 0.0
    for j, spec in enumerate(specs):
        networks = tuple(
            dataclasses.replace(
                net(f"n{j}{k}", [w for w, _, _ in layers], load=[float(lt) for _, lt, _ in layers],
                    execs=[float(et) for _, _, et in layers], init_time=float(init)),
                unload_time=0.5 * unload,
            )
            for k, (layers, init, unload) in enumerate(spec)
        )
        jobs.append(Job(f"j{j}", networks, arrival=at, seq=j))
        at += gaps[j]
    model = ContentionModel(*factors)
    bound = response_time_bound(jobs, workers=workers, contention=model, mode=mode)
    for name in policy_names():
        report = simulate(jobs, name, memory=memory, workers=workers, contention=model, mode=mode)
        assert all(job.status == "done" for job in report.jobs)  # every task fits the budget
        mean = report.response_stats()["mean"]
        assert mean >= bound.mean_response_s * (1 - 1e-9) - 1e-9, (name, mean, bound)
