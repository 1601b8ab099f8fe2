"""The simulator: every policy completes random jobs, keeps precedence and the budget."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schedule_helpers import net

from layerfit.errors import JobRejectedError, ScheduleError
from layerfit.schedule.dispatch import Dispatcher
from layerfit.schedule.experiments.penalty import PagingModel
from layerfit.schedule.experiments.simulator import simulate
from layerfit.schedule.graph import build_job_graph
from layerfit.schedule.ledger import MemoryLedger
from layerfit.schedule.policies import POLICIES, make_policy, policy_names
from layerfit.schedule.tasks import Job


def check_run(report, jobs, policy_name):
    """Precedence from the graphs, budget from the ledger history, completion of every job."""
    scheme = POLICIES[policy_name].scheme
    by_task = {t.task: t for t in report.tasks}
    results = {j.id: j for j in report.jobs}
    for job in jobs:
        result = results[job.id]
        graph = build_job_graph(job, scheme)
        largest = max(t.memory for _, t in graph.nodes(data="task"))
        if largest > report.budget:
            assert result.status == "rejected"
            continue
        assert result.status == "done", (policy_name, job.id, result)
        assert set(graph.nodes) <= set(by_task)
        for a, b in graph.edges:
            assert by_task[a].end <= by_task[b].start + 1e-9, (policy_name, a, b)
        assert result.finished == pytest.approx(max(by_task[n].end for n in graph.nodes))
    assert report.budget_violations == 0
    for sample in report.ledger_history:
        assert sample.used - sample.progress_held <= report.budget
        if sample.used > report.budget:
            assert sample.progress_held > 0
    if report.progress_count == 0:
        assert report.peak_memory <= report.budget


layer = st.tuples(st.integers(0, 12), st.integers(0, 4), st.integers(0, 3), st.integers(0, 3))
network = st.lists(layer, min_size=1, max_size=4)
job_spec = st.lists(network, min_size=1, max_size=2)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(job_spec, min_size=1, max_size=3),
    gaps=st.lists(st.integers(0, 6), min_size=3, max_size=3),
    budget=st.integers(4, 40),
    workers=st.integers(1, 3),
    kinds=st.lists(st.sampled_from(["conv", "fc", "other"]), min_size=4, max_size=4),
)
def test_every_policy_completes_random_jobs_within_the_budget(specs, gaps, budget, workers, kinds):
    jobs = []
    at = 0.0
    for j, spec in enumerate(specs):
        networks = tuple(
            net(
                f"n{j}{k}",
                [w for w, _, _, _ in layers],
                load=[float(lt) for _, lt, _, _ in layers],
                execs=[float(et) for _, _, et, _ in layers],
                exec_memory=[em for _, _, _, em in layers],
                kinds=kinds[: len(layers)],
                init_memory=j % 2,
            )
            for k, layers in enumerate(spec)
        )
        jobs.append(Job(f"j{j}", networks, arrival=at, seq=j))
        at += gaps[j]
    for name in policy_names():
        report = simulate(jobs, name, memory=budget, workers=workers, paging=None)
        check_run(report, jobs, name)


def alone_minimum(profile) -> int:
    """The least memory ``profile`` runs in alone: one layer at a time, beside its init."""
    return profile.init_memory + max(
        max(layer.load_peak, layer.memory + layer.exec_memory) for layer in profile.layers
    )


# weights, extra load peak, execute memory, load time, execute time
fair_layer = st.tuples(
    st.integers(0, 30), st.integers(0, 20), st.integers(0, 10), st.integers(1, 4), st.integers(1, 4)
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(
        st.lists(
            st.tuples(st.integers(0, 8), st.lists(fair_layer, min_size=1, max_size=5)),
            min_size=1,
            max_size=3,
        ),
        min_size=2,
        max_size=7,
    ),
    gaps=st.lists(st.integers(0, 3), min_size=7, max_size=7),
    slack=st.integers(0, 30),
    workers=st.integers(1, 3),
)
def test_masa_fair_never_needs_the_progress_rule_when_every_network_runs_alone_in_the_budget(
    specs, gaps, slack, workers
):
    # The Banker's guarantee: a safe state always has a task that fits and keeps it safe,
    # so with networks that each fit alone the budget is never exceeded, under any traffic.
    jobs, at = [], 0.0
    for j, spec in enumerate(specs):
        networks = tuple(
            net(
                f"n{j}{k}",
                [w for w, *_ in layers],
                load=[float(lt) for *_, lt, _ in layers],
                execs=[float(et) for *_, et in layers],
                exec_memory=[em for _, _, em, _, _ in layers],
                load_memory=[w + extra for w, extra, *_ in layers],
                init_memory=init,
            )
            for k, (init, layers) in enumerate(spec)
        )
        jobs.append(Job(f"j{j}", networks, arrival=at, seq=j))
        at += gaps[j]
    budget = max(alone_minimum(n) for job in jobs for n in job.networks) + slack + 1
    report = simulate(jobs, "masa-fair", memory=budget, workers=workers, paging=None)
    check_run(report, jobs, "masa-fair")
    assert report.progress_count == 0 and report.peak_memory <= budget


def test_a_job_too_large_for_the_budget_is_rejected_while_others_run():
    small = Job("small", (net("s", [3, 4]),), arrival=0.0, seq=0)
    huge = Job("huge", (net("h", [2, 50, 2]),), arrival=0.5, seq=1)
    after = Job("after", (net("t", [5]),), arrival=1.0, seq=2)
    report = simulate([small, huge, after], "masa", memory=20, workers=2, paging=None)
    status = {j.id: j for j in report.jobs}
    assert status["small"].status == "done" and status["after"].status == "done"
    assert status["huge"].status == "rejected"
    assert "needs a budget of at least 50 B (50 bytes)" in status["huge"].error
    dispatcher = Dispatcher(make_policy("masa"), MemoryLedger(20), 1)
    state = dispatcher.submit(huge)
    assert isinstance(state.error, JobRejectedError) and state.error.min_budget == 50


def test_oversize_alone_runs_it_with_the_progress_rule_and_paging():
    huge = Job("huge", (net("h", [2, 50, 2], load=[1, 1, 1]),))
    report = simulate([huge], "masa", memory=20, workers=2, oversize="alone")
    assert report.jobs[0].status == "done"
    assert report.progress_count >= 1 and report.peak_memory >= 50
    slowed = [t for t in report.tasks if t.slowdown > 1.0]
    assert any(t.task.endswith("/L1") for t in slowed)


def test_memory_oblivious_policies_overcommit_when_ungated():
    job = Job("j", (net("a", [6, 6, 6]), net("b", [6, 6, 6])))
    ungated = simulate([job], "fcfs", memory=10, workers=3, gated=False)
    gated = simulate([job], "fcfs", memory=10, workers=3)
    masa = simulate([job], "masa", memory=10, workers=3, gated=False)
    assert ungated.overcommit_count > 0 and ungated.peak_memory > 10
    assert gated.overcommit_count == 0 and masa.overcommit_count == 0
    assert any(t.slowdown > 1 for t in ungated.tasks)


def test_underestimated_memory_shows_up_as_paging_not_as_a_broken_ledger():
    job = Job("j", (net("a", [6, 6]), net("b", [6, 6])))
    exact = simulate([job], "masa", memory=12, workers=2)
    under = simulate([job], "masa", memory=12, workers=2, estimate_factor=0.5)
    assert exact.peak_resident <= 12 and not any(t.slowdown > 1 for t in exact.tasks)
    assert under.peak_memory <= 12 and under.peak_resident > 12
    assert any(t.slowdown > 1 for t in under.tasks)
    assert under.makespan > exact.makespan


def test_closed_mode_submits_each_job_when_the_previous_is_done():
    jobs = [Job(f"j{i}", (net("a", [1, 1]),), seq=i) for i in range(3)]
    report = simulate(jobs, "masa", memory=10, workers=2, mode="closed", paging=None)
    arrivals = [j.arrival for j in report.jobs]
    finishes = [j.finished for j in report.jobs]
    assert arrivals[1] == pytest.approx(finishes[0]) and arrivals[2] == pytest.approx(finishes[1])


def test_report_statistics_and_deadlines():
    jobs = [
        Job(f"j{i}", (net("a", [2, 2]),), arrival=float(i), deadline=3.5, seq=i) for i in range(4)
    ]
    report = simulate(jobs, "linear-fcfs", memory=10, workers=1, paging=None)
    responses = sorted(report.responses)
    stats = report.response_stats()
    assert stats["max"] == responses[-1] and stats["p50"] == pytest.approx(
        (responses[1] + responses[2]) / 2
    )
    assert report.summary()["deadline_misses"] == sum(r > 3.5 for r in responses) > 0
    assert len(report.utilisation) == 1 and 0 < report.utilisation[0] <= 1
    data = report.to_dict(trace=True)
    assert data["job_results"][0]["id"] == "j0" and data["task_trace"] and data["memory_over_time"]


def test_masa_beats_bulk_and_deepeye_at_a_tight_budget_on_thesis_small_3():
    from layerfit.schedule.experiments.thesis import MIB
    from layerfit.schedule.experiments.workload_generators import batch_workload

    workload = batch_workload("small-3", 3)
    means = {
        p: simulate(workload, p, memory=512 * MIB).response_stats()["mean"]
        for p in ("masa", "bulk", "deepeye")
    }
    assert means["masa"] < 0.7 * min(means["bulk"], means["deepeye"])


def test_failed_task_fails_its_job_returns_memory_and_others_continue():
    policy = make_policy("masa")
    ledger = MemoryLedger(100)
    dispatcher = Dispatcher(policy, ledger, 2)
    a = dispatcher.submit(Job("a", (net("x", [10, 10]),)))
    b = dispatcher.submit(Job("b", (net("y", [10]),)))
    running = []
    while (assignment := dispatcher.assign(len(running))) is not None:
        running.append(assignment.task)
    for t in running:
        dispatcher.complete(t)
    loads = []
    while (assignment := dispatcher.assign(0)) is not None:
        loads.append(assignment.task)
    victim = next(t for t in loads if t.job == "a")
    dispatcher.fail(victim, RuntimeError("boom"))
    assert a.status.value == "failed" and "boom" in str(a.error)
    for t in loads:
        if t is not victim:
            dispatcher.complete(t)
    assert all(not key.startswith("a/") for key in ledger._reservations)
    while dispatcher.unresolved():
        assignment = dispatcher.assign(0)
        assert assignment is not None
        dispatcher.complete(assignment.task)
    assert b.status.value == "done" and ledger.used == 0 and policy.empty()


def test_penalty_model_passes_through_the_fig_6_3_points():
    model = PagingModel()
    assert model.slowdown(0.87, 1.0) == 1.0
    assert model.slowdown(1.74, 1.0) == pytest.approx(2.5)
    assert model.slowdown(1.74, 0.001) == pytest.approx(1.0, abs=0.01)
    assert model.slowdown(3.48, 1.0) == pytest.approx(7.2)
    assert model.slowdown(3.48, 0.0) == pytest.approx(7.2)
    assert model.slowdown(5.0, 1.0) > 7.2


def test_bad_simulation_arguments():
    job = Job("j", (net("a", [1]),))
    with pytest.raises(ScheduleError, match="at least one worker"):
        simulate([job], "masa", memory=10, workers=0)
    with pytest.raises(ScheduleError, match="mode must be"):
        simulate([job], "masa", memory=10, mode="batchy")
    with pytest.raises(ScheduleError, match="oversize"):
        simulate([job], "masa", memory=10, oversize="maybe")


def test_one_builder_records_a_task_for_the_simulator_and_the_real_executor():
    from layerfit.schedule.ledger import Admission
    from layerfit.schedule.report import TaskRecord
    from layerfit.schedule.tasks import Task, TaskKind

    task = Task("j0/0.a/L1", "j0", "j0/0.a", "a", 0, TaskKind.LOAD, 1, "conv", 0.5, memory=100, retained=100)
    assert TaskRecord.of(task, 1, 2.0, 3.0, Admission.PROGRESS) == TaskRecord(
        "j0/0.a/L1", "j0", "j0/0.a", "LOAD", 1, 1, 2.0, 3.0, 1.0, "progress", 100
    )
    assert TaskRecord.of(task, 0, 0.0, 1.5, Admission.FIT, slowdown=3.0).slowdown == 3.0
