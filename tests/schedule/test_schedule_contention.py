"""Contention in the simulator: concurrent loads share the storage, executions the CPU."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runtime_helpers import prepare_models
from schedule_helpers import net
from test_schedule_simulator import check_run

from layerfit.errors import ScheduleError
from layerfit.schedule.contention import ContentionModel, load_contention
from layerfit.schedule.experiments.simulator import simulate
from layerfit.schedule.policies import policy_names
from layerfit.schedule.runtime.profiler import measure_contention
from layerfit.schedule.tasks import Job, TaskKind


def two_jobs(load_a: float, load_b: float) -> list[Job]:
    """Two one-layer jobs arriving together: their loads overlap on two workers."""
    return [
        Job("a", (net("a", [1], load=[load_a], execs=[1.0]),), arrival=0.0, seq=0),
        Job("b", (net("b", [1], load=[load_b], execs=[1.0]),), arrival=0.0, seq=1),
    ]


def responses(report) -> dict[str, float]:
    return {job.id: job.response for job in report.jobs}


def test_without_contention_concurrent_loads_take_their_profiled_time():  # the thesis's model
    report = simulate(two_jobs(2.0, 2.0), "masa", memory=100, workers=2, paging=None)
    assert responses(report) == {"a": 3.0, "b": 3.0}
    assert report.contention is None


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        (ContentionModel(load_by_load=2.0), 5.0),  # both loads at half speed: 0..4, executions 4..5
        (ContentionModel(load_by_load=2.0, exec_by_exec=2.0), 6.0),  # executions too: 4..6
        (ContentionModel(load_by_load=1.5), 2.0 * 1.5 + 1.0),  # each load 1.5x longer
        (ContentionModel(load_by_exec=3.0, exec_by_load=3.0), 3.0),  # never a load beside an execution
    ],
)
def test_equal_loads_slow_each_other(model, expected):
    report = simulate(two_jobs(2.0, 2.0), "masa", memory=100, workers=2, paging=None, contention=model)
    assert responses(report) == pytest.approx({"a": expected, "b": expected})
    assert report.contention["load_by_load"] == model.load_by_load


def test_a_load_speeds_up_when_the_other_one_finishes():
    # both at half speed until a's 1 s of work is done at t=2; b has 2 s left, alone: ends at 4
    model = ContentionModel(load_by_load=2.0)
    report = simulate(two_jobs(1.0, 3.0), "masa", memory=100, workers=2, paging=None, contention=model)
    loads = {t.job: (t.start, t.end) for t in report.tasks if t.kind == "LOAD"}
    assert loads == {"a": pytest.approx((0.0, 2.0)), "b": pytest.approx((0.0, 4.0))}
    assert responses(report) == pytest.approx({"a": 3.0, "b": 5.0})


def test_an_execution_beside_a_load_slows_down_and_back():
    # a: load 1, exec 2; b: load 3. a's exec runs 1..? beside b's load: exec at 1/2 speed
    # (exec_by_load 2), b's load at 1/1.5 (load_by_exec 1.5) until b's load ends.
    model = ContentionModel(load_by_exec=1.5, exec_by_load=2.0)
    jobs = [
        Job("a", (net("a", [1], load=[1.0], execs=[2.0]),), arrival=0.0, seq=0),
        Job("b", (net("b", [1], load=[3.0], execs=[0.0]),), arrival=0.0, seq=1),
    ]
    report = simulate(jobs, "masa", memory=100, workers=2, paging=None, contention=model)
    spans = {(t.job, t.kind): (t.start, t.end) for t in report.tasks}
    # 0..1 both loads alone of each other (no load_by_load): a's load ends at 1, b has 2 left.
    # From 1: b's load at 2/3 speed, a's exec at 1/2: a's exec needs 4 s, b's load 3 s -> b ends at 4,
    # a's exec has done 1.5 of 2 by then and runs the last 0.5 alone: ends at 4.5.
    assert spans[("b", "LOAD")] == pytest.approx((0.0, 4.0))
    assert spans[("a", "EXEC")] == pytest.approx((1.0, 4.5))


def test_one_worker_never_contends():
    model = ContentionModel(2.0, 2.0, 2.0, 2.0)
    plain = simulate(two_jobs(1.0, 3.0), "masa", memory=100, workers=1, paging=None)
    shared = simulate(two_jobs(1.0, 3.0), "masa", memory=100, workers=1, paging=None, contention=model)
    assert [(t.start, t.end) for t in shared.tasks] == [(t.start, t.end) for t in plain.tasks]


layer = st.tuples(st.integers(1, 12), st.integers(0, 4), st.integers(0, 3))
job_spec = st.lists(st.lists(layer, min_size=1, max_size=3), min_size=1, max_size=2)


def random_jobs(specs, gaps) -> list[Job]:
    jobs, at = [], 0.0
    for j, spec in enumerate(specs):
        networks = tuple(
            net(f"n{j}{k}", [w for w, _, _ in layers], load=[float(lt) for _, lt, _ in layers],
                execs=[float(et) for _, _, et in layers])
            for k, layers in enumerate(spec)
        )
        jobs.append(Job(f"j{j}", networks, arrival=at, seq=j))
        at += gaps[j]
    return jobs


slowdown = st.sampled_from([1.0, 1.25, 2.0, 3.0])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    specs=st.lists(job_spec, min_size=1, max_size=3),
    gaps=st.lists(st.integers(0, 5), min_size=3, max_size=3),
    workers=st.integers(1, 3),
    factors=st.tuples(slowdown, slowdown, slowdown, slowdown),
)
def test_every_task_does_exactly_its_work_at_the_model_rates(specs, gaps, workers, factors):
    """Every policy completes its jobs with precedence and budget kept, and replaying the
    trace with the model's rates gives each task exactly its profiled work: between two
    consecutive starts or ends the set in flight is fixed, and so is each task's rate."""
    jobs = random_jobs(specs, gaps)
    model = ContentionModel(*factors)
    for name in policy_names():
        plain = simulate(jobs, name, memory=30, workers=workers, paging=None)
        report = simulate(jobs, name, memory=30, workers=workers, paging=None, contention=model)
        check_run(report, jobs, name)
        work = {t.task: t.end - t.start for t in plain.tasks}
        shared = [t for t in report.tasks if t.kind in ("LOAD", "EXEC") and t.end > t.start]
        done = dict.fromkeys((t.task for t in shared), 0.0)
        instants = sorted({x for t in shared for x in (t.start, t.end)})
        for lo, hi in zip(instants, instants[1:], strict=False):
            inside = [t for t in shared if t.start <= lo and hi <= t.end]
            loads = sum(t.kind == "LOAD" for t in inside)
            execs = len(inside) - loads
            for t in inside:
                kind = TaskKind[t.kind]
                mine = (kind is TaskKind.LOAD, kind is TaskKind.EXEC)
                done[t.task] += (hi - lo) * model.rate(kind, loads - mine[0], execs - mine[1])
        for t in shared:
            assert done[t.task] == pytest.approx(work[t.task], rel=1e-6, abs=1e-6), (name, t.task)
            assert t.end - t.start >= work[t.task] - 1e-9


def test_contention_model_rejects_nonsense_and_round_trips(tmp_path):
    for bad in (0.5, 0, -1, math.nan, math.inf, "two", True):
        with pytest.raises(ScheduleError, match="must be a finite slowdown"):
            ContentionModel(load_by_load=bad)
    model = ContentionModel(1.6, 1.1, 1.7, 1.7, "measured", {"repeats": 3})
    assert not model.free and ContentionModel().free
    path = tmp_path / "contention.json"
    model.save(path)
    assert load_contention(path) == model
    assert json.loads(path.read_text())["notes"] == {"repeats": 3}
    for text, message in (
        ('{"format": "something-else"}', "not a layerfit-contention file"),
        ('{"format": "layerfit-contention", "load_by_load": true}', "load_by_load must be a number"),
        ('{"format": "layerfit-contention", "exec_by_exec": 0.5}',
         "contention.json: exec_by_exec must be a finite slowdown"),
        ("{not json", "not valid JSON"),
    ):
        path.write_text(text)
        with pytest.raises(ScheduleError, match=message):
            load_contention(path)
    with pytest.raises(ScheduleError, match="not found"):
        load_contention(tmp_path / "missing.json")


def test_measure_contention_on_real_models(tmp_path):
    repo = prepare_models(tmp_path, ["chain", "big"])
    model = measure_contention([repo / "chain", repo / "big"], repeats=1)
    assert model.source == "measured"
    assert model.notes["models"] == ["chain", "big"]
    assert model.notes["bytes_read"] > 0
    for name in ("load_by_load", "load_by_exec", "exec_by_load", "exec_by_exec"):
        measured = model.notes[name]
        assert len(measured["alone_s"]) == len(measured["beside_s"]) == 1
        assert measured["raw"] == pytest.approx(measured["beside_s"][0] / measured["alone_s"][0])
        assert getattr(model, name) == max(1.0, measured["raw"])
    with pytest.raises(ScheduleError, match="at least one prepared model"):
        measure_contention([])
    with pytest.raises(ScheduleError, match="repeats must be at least 1"):
        measure_contention([repo / "chain"], repeats=0)


def test_run_durations_are_decontended_by_the_model():
    """The real run's per-task means; with a model, each run's duration is first turned
    back into work alone: the model's rate integrated over its span."""
    from layerfit.schedule.experiments.realrun import measured_profiles
    from layerfit.schedule.profile import ProfileSet
    from layerfit.schedule.report import RunReport, TaskRecord

    profiles = ProfileSet([net("a", [1, 1], load=[9.0, 9.0], execs=[9.0, 9.0])])

    def record(job, kind, layer, start, end, worker=0):
        return TaskRecord(f"{job}{kind}{layer}", job, f"{job}/0.a", kind, layer, worker, start, end, 1.0, "fits", 1)

    tasks = [
        record("j1", "LOAD", 0, 0.0, 1.0),  # alone: work 1
        record("j2", "LOAD", 0, 2.0, 5.0),  # 2..4 alone (2), 4..5 beside a load at 1/2 (0.5)
        record("j3", "LOAD", 0, 4.0, 7.0, worker=1),  # 4..5 beside j2's load (0.5), then alone (2)
        record("j1", "UNLOAD", 0, 4.5, 4.7, worker=1),  # unloads neither slow nor are slowed
        record("j1", "LOAD", 1, 10.0, 12.0),  # 10..11 alone (1), 11..12 beside an exec at 1/1.5
        record("j2", "EXEC", 1, 11.0, 15.0, worker=1),  # 11..12 beside a load at 1/3 (1/3), 12..15 (3)
    ]
    report = RunReport("masa", 2, 100, 100, "real", [], tasks=tasks)
    plain = measured_profiles(report, profiles)["a"]
    assert plain.layers[0].load_time == pytest.approx((1 + 3 + 3) / 3)
    assert plain.layers[1].exec_time == pytest.approx(4.0)
    model = ContentionModel(load_by_load=2.0, load_by_exec=1.5, exec_by_load=3.0)
    alone = measured_profiles(report, profiles, contention=model)["a"]
    assert alone.layers[0].load_time == pytest.approx((1 + 2.5 + 2.5) / 3)
    assert alone.layers[1].load_time == pytest.approx(1 + 1 / 1.5)
    assert alone.layers[1].exec_time == pytest.approx(1 / 3 + 3)
    assert alone.layers[0].exec_time == 9.0  # never ran: the profile's
    assert alone.unload_time == pytest.approx((0.2 + 0.0) / 2)  # layer 1 has no unload: profile's 0
    assert alone.source == "measured-in-run-decontended"
    assert plain.source == "measured-in-run"
