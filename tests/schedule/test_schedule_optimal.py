"""The CP-SAT optimum: valid schedules, and never worse than any policy."""

from __future__ import annotations

import random

import pytest
from schedule_helpers import net

from layerfit.schedule.experiments.optimal import check_schedule, solve_jobs
from layerfit.schedule.experiments.simulator import simulate
from layerfit.schedule.graph import build_job_graph
from layerfit.schedule.policies import policy_names
from layerfit.schedule.tasks import Job


def tiny_job(rng: random.Random) -> Job:
    def one(name: str):
        n = rng.randint(1, 3)
        return net(
            name,
            [rng.randint(1, 6) for _ in range(n)],
            load=[rng.randint(0, 3) for _ in range(n)],
            execs=[rng.randint(1, 3) for _ in range(n)],
            exec_memory=[rng.randint(0, 2) for _ in range(n)],
            kinds=[rng.choice(["conv", "fc"]) for _ in range(n)],
        )

    return Job("j", (one("a"), one("b")))


@pytest.mark.parametrize("seed", range(4))
def test_optimum_is_a_lower_bound_for_every_policy(seed):
    rng = random.Random(seed)
    job = tiny_job(rng)
    weights = [layer.memory for p in job.networks for layer in p.layers]
    for budget in (max(weights) + 3, sum(weights) + 10):
        workers = rng.randint(1, 3)
        optimum = solve_jobs([job], budget=budget, workers=workers, time_limit=10)
        assert optimum.optimal
        check_schedule(build_job_graph(job, "partial"), optimum, budget)
        for name in policy_names():
            report = simulate([job], name, memory=budget, workers=workers, paging=None)
            if report.progress_count == 0:  # within the budget, like the model
                assert optimum.makespan <= report.makespan + 1e-9, (seed, budget, name)


def test_one_worker_optimum_is_the_serial_time_and_more_workers_help():
    job = Job("j", (net("a", [2, 2], execs=[3, 3]), net("b", [1, 4], execs=[2, 1])))
    serial = sum(p.total_time for p in job.networks)
    assert solve_jobs([job], budget=100, workers=1).makespan == serial
    assert solve_jobs([job], budget=100, workers=2).makespan < serial


def test_memory_bound_and_infeasible_instances():
    job = Job(
        "j",
        (net("a", [5, 5], load=[1, 1], execs=[1, 1]), net("b", [5, 5], load=[1, 1], execs=[1, 1])),
    )
    loose = solve_jobs([job], budget=100, workers=4)
    tight = solve_jobs([job], budget=10, workers=4)
    assert tight.makespan > loose.makespan
    check_schedule(build_job_graph(job, "partial"), tight, 10)
    assert solve_jobs([job], budget=4, workers=2).status == "INFEASIBLE"


def test_short_fractional_durations_are_not_rounded_away():
    """Profiled tasks last fractions of a millisecond: the optimum must still count them."""
    job = Job("j", (net("a", [1, 1, 1], load=[0.0004, 0.0021, 0.00035], execs=[0.0003, 0.0012, 0.0009]),))
    serial = sum(layer.load_time + layer.exec_time for layer in job.networks[0].layers)
    optimum = solve_jobs([job], budget=100, workers=1, time_limit=10)
    assert optimum.optimal and optimum.time_unit <= 1e-5
    assert optimum.makespan == pytest.approx(serial, rel=5e-3)
