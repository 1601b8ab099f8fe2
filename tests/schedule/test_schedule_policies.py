"""Each policy on small hand-made cases with the order it must produce."""

from __future__ import annotations

import pytest
from schedule_helpers import net, task

from layerfit.errors import ScheduleError
from layerfit.schedule.experiments.simulator import simulate
from layerfit.schedule.graph import network_tasks
from layerfit.schedule.policies import POLICIES, make_policy, policy_names
from layerfit.schedule.tasks import Job, Pool, Scheme
from layerfit.schedule.tasks import TaskKind as K

BIG = 10**9


def drain(policy, worker=0, free=BIG):
    """Take tasks one by one, completing each, until the policy gives nothing."""
    order = []
    while (t := policy.next(worker, free)) is not None:
        order.append(t.id)
        policy.complete(t)
    return order


def test_registry_has_every_policy_by_name():
    assert policy_names() == [
        "masa",
        "bulk",
        "deepeye",
        "fcfs",
        "linear-fcfs",
        "sjf",
        "snf",
        "round-robin",
        "masa-fair",
        "bulk-multi",
        "masa-fcfs",
    ]
    assert {POLICIES[n].scheme for n in POLICIES} == set(Scheme)
    assert make_policy("Linear_FCFS").name == "linear-fcfs"
    with pytest.raises(ScheduleError, match="unknown policy 'lifo'; choose one of: masa, bulk"):
        make_policy("lifo")


def test_masa_runs_execute_before_load_in_ascending_memory():
    p = make_policy("masa")
    for i, (name, kind, mem) in enumerate(
        [
            ("L9", K.LOAD, 9),
            ("E5", K.EXEC, 5),
            ("L2", K.LOAD, 2),
            ("U", K.UNLOAD, 0),
            ("E1", K.EXEC, 1),
            ("I", K.INIT, 2),
        ]
    ):
        p.add(task(name, kind, mem, seq=i))
    assert drain(p) == ["U", "E1", "E5", "L2", "I", "L9"]  # ties (L2, I) in ready order


def test_masa_memory_gate_and_progress_rule():
    p = make_policy("masa")
    p.add(task("E8", K.EXEC, 8, seq=0))
    p.add(task("L3", K.LOAD, 3, seq=1))
    p.add(task("L1", K.LOAD, 1, seq=2))
    r1 = p.next(0, 4)
    assert r1.id == "L1"  # no execute fits 4 bytes; the smallest load does
    r2 = p.next(1, 3)
    assert r2.id == "L3"  # another worker, 3 bytes free
    assert p.next(2, 0) is None  # nothing fits while tasks run: wait
    p.complete(r1)
    p.complete(r2)
    assert p.next(0, 0).id == "E8"  # nothing fits, nothing runs: the smallest execute alone


def test_masa_progress_rule_falls_back_to_the_smallest_load():
    p = make_policy("masa")
    p.add(task("L9", K.LOAD, 9, seq=0))
    p.add(task("L7", K.LOAD, 7, seq=1))
    assert p.next(0, 5).id == "L7"


def test_masa_fair_avoids_the_memory_deadlock_masa_breaks_with_the_progress_rule():
    # Two networks whose first layer is large: Algorithm 1 loads the small later layers
    # of both (ascending memory), then neither first layer fits and nothing can run.
    # masa-fair holds back the load that would leave no safe order of completion.
    nets = [net(f"n{i}", [60, 10, 10], load=[0.5, 0.1, 0.1]) for i in range(2)]
    jobs = [Job(f"j{i}", (n,), arrival=0.0, seq=i) for i, n in enumerate(nets)]
    masa = simulate(jobs, "masa", memory=90, workers=2, paging=None)
    fair = simulate(jobs, "masa-fair", memory=90, workers=2, paging=None)
    assert masa.progress_count > 0 and masa.peak_memory > 90
    assert fair.progress_count == 0 and fair.peak_memory <= 90
    assert all(j.status == "done" for j in fair.jobs)


def test_masa_fair_counts_a_held_layer_as_returned_before_the_later_layers_load():
    # EmotionNet's shape (bench/masa.py): fc6 (300) then fc7 (70) do not fit together, but
    # the network runs alone within the budget, fc6 being executed and unloaded before fc7
    # is needed. Claiming "the largest pending load on top of everything held" made both
    # loads unsafe and only the progress rule moved on, over the budget.
    jobs = [Job("j0", (net("e", [5, 300, 70, 1], load=[0.1, 1.0, 0.3, 0.1]),), arrival=0.0, seq=0)]
    fcfs = simulate(jobs, "masa-fcfs", memory=320, workers=2, paging=None)
    fair = simulate(jobs, "masa-fair", memory=320, workers=2, paging=None)
    assert fcfs.progress_count == 0 and fcfs.peak_memory <= 320
    assert fair.progress_count == 0 and fair.peak_memory <= 320
    assert all(j.status == "done" for j in fair.jobs)
    # and loading fc7 first, which would leave no room for fc6, is held back
    tasks = {t.id: t for t in network_tasks(jobs[0].networks[0], "e")}
    for name, expected in (("masa-fcfs", "e/L2"), ("masa-fair", None)):
        p = make_policy(name)
        p.add(tasks["e/I"])
        assert p.next(0, 320).id == "e/I"  # still running: no progress rule
        p.add(tasks["e/L2"])
        taken = p.next(1, 320)
        assert (taken and taken.id) == expected, name


@pytest.mark.parametrize("name", ["masa-fcfs", "masa-fair"])  # masa-fair: the same order
def test_masa_fcfs_takes_each_group_in_arrival_order(name):
    p = make_policy(name)
    for i, (name, kind, mem, job_seq, layer) in enumerate(
        [
            ("j1-L0", K.LOAD, 1, 1, 0),
            ("j0-L1", K.LOAD, 9, 0, 1),
            ("j1-E0", K.EXEC, 1, 1, 0),
            ("j0-I", K.INIT, 2, 0, -1),
            ("j0-E0", K.EXEC, 5, 0, 0),
            ("j0-L0", K.LOAD, 3, 0, 0),
        ]
    ):
        p.add(task(name, kind, mem, seq=i, job_seq=job_seq, layer=layer))
    # execute before load; within each group the older job, then the layer, not the memory
    assert drain(p) == ["j0-E0", "j1-E0", "j0-I", "j0-L0", "j0-L1", "j1-L0"]


def test_masa_fcfs_lets_a_later_task_that_fits_pass_one_that_does_not():
    p = make_policy("masa-fcfs")
    p.add(task("old", K.LOAD, 8, seq=0, job_seq=0))
    p.add(task("new", K.LOAD, 3, seq=1, job_seq=1))
    first = p.next(0, 4)
    assert first.id == "new"  # the oldest does not fit 4 bytes; memory does not sit idle
    assert p.next(1, 1) is None  # nothing fits while a task runs: wait
    p.complete(first)
    assert p.next(0, 1).id == "old"  # nothing fits, nothing runs: the oldest alone


def test_masa_fcfs_avoids_the_deadlock_of_masa_s_memory_order():
    # The case masa-fair's check was made for: in arrival order the first network's
    # large first layer goes before the small layers of the second, so nobody waits.
    nets = [net(f"n{i}", [60, 10, 10], load=[0.5, 0.1, 0.1]) for i in range(2)]
    jobs = [Job(f"j{i}", (n,), arrival=0.0, seq=i) for i, n in enumerate(nets)]
    fcfs = simulate(jobs, "masa-fcfs", memory=90, workers=2, paging=None)
    assert fcfs.progress_count == 0 and fcfs.peak_memory <= 90
    assert all(j.status == "done" for j in fcfs.jobs)


def test_masa_fcfs_is_not_deadlock_free_by_construction_where_masa_fair_is():
    # a's second layer (60) does not fit beside its first (50), so the small layers
    # behind it — a's third, b's second — take the room; after a's first layer runs, 50
    # bytes are free and neither a's second layer nor b's first (60) fits: only the
    # progress rule moves on. masa-fair sees that this leaves no safe order and waits.
    jobs = [
        Job("j0", (net("a", [50, 60, 30], load=[0.1] * 3),), arrival=0.0, seq=0),
        Job("j1", (net("b", [60, 20], load=[0.1] * 2),), arrival=0.0, seq=1),
    ]
    fcfs = simulate(jobs, "masa-fcfs", memory=100, workers=2, paging=None)
    fair = simulate(jobs, "masa-fair", memory=100, workers=2, paging=None)
    assert fcfs.progress_count > 0 and fcfs.peak_memory > 100
    assert fair.progress_count == 0 and fair.peak_memory <= 100
    assert all(j.status == "done" for j in fcfs.jobs + fair.jobs)


def test_zero_memory_tasks_run_even_over_budget():
    for name in policy_names():
        p = make_policy(name)
        p.add(task("U", K.UNLOAD, 0, seq=0))
        p.running = 1  # someone else is running
        assert p.next(0, -100).id == "U", name


def test_fcfs_is_head_of_line_behind_the_shared_gate():
    p = make_policy("fcfs")
    p.add(task("a", memory=8, seq=0))
    p.add(task("b", memory=2, seq=1))
    p.add(task("c", memory=1, seq=2))
    c = p.next(0, 5)
    assert c.id == "c"  # head "a" does not fit and nothing runs: the smallest instead
    assert p.next(1, 4) is None  # "a" still blocks the line while "c" runs, though "b" would fit
    p.complete(c)
    assert drain(p, free=5) == ["b", "a"]  # "a" at last by the progress rule


def test_ungated_policies_ignore_the_budget_but_masa_never_does():
    fcfs = make_policy("fcfs", gated=False)
    fcfs.add(task("a", memory=8, seq=0))
    fcfs.running = 3
    assert fcfs.next(0, 1).id == "a"
    masa = make_policy("masa", gated=False)
    masa.add(task("a", memory=8, seq=0))
    masa.running = 3
    assert masa.gated and masa.next(0, 1) is None


def test_sjf_takes_the_shortest_task_first():
    p = make_policy("sjf")
    for i, (name, d) in enumerate([("x", 3.0), ("y", 1.0), ("z", 2.0), ("w", 1.0)]):
        p.add(task(name, duration=d, seq=i))
    assert drain(p) == ["y", "w", "z", "x"]


def test_snf_takes_the_shortest_network_first():
    p = make_policy("snf")
    p.add(task("a1", network="A", cost=5.0, seq=0))
    p.add(task("b1", network="B", cost=2.0, seq=1))
    p.add(task("b2", network="B", cost=2.0, seq=2))
    p.add(task("a2", network="A", cost=5.0, seq=3))
    assert drain(p) == ["b1", "b2", "a1", "a2"]


def test_round_robin_alternates_between_networks():
    p = make_policy("round-robin")
    for i, (name, network) in enumerate(
        [("a1", "A"), ("a2", "A"), ("a3", "A"), ("b1", "B"), ("b2", "B")]
    ):
        p.add(task(name, network=network, seq=i))
    assert drain(p) == ["a1", "b1", "a2", "b2", "a3"]


def test_deepeye_serves_the_conv_pool_and_the_fc_pool_with_separate_workers():
    p = make_policy("deepeye")
    p.bind(2)
    p.add(task("c1", pool=Pool.CONV, seq=0))
    p.add(task("f1", pool=Pool.FC, seq=1))
    p.add(task("c2", pool=Pool.CONV, seq=2))
    assert drain(p, worker=1) == ["f1"]
    assert drain(p, worker=0) == ["c1", "c2"]
    single = make_policy("deepeye")
    single.bind(1)
    for i, (name, pool) in enumerate([("f1", Pool.FC), ("c1", Pool.CONV), ("c2", Pool.CONV)]):
        single.add(task(name, pool=pool, seq=i))
    assert drain(single) == ["c1", "c2", "f1"]


def test_bulk_and_linear_run_networks_one_at_a_time():
    assert POLICIES["bulk"].scheme is Scheme.BULK and POLICIES["bulk"].serial_networks
    assert (
        POLICIES["linear-fcfs"].scheme is Scheme.LINEAR and POLICIES["linear-fcfs"].serial_networks
    )
    job = Job("j", (net("a", [2, 2]), net("b", [2, 2])))
    for name in ("bulk", "linear-fcfs"):
        report = simulate([job], name, memory=100, workers=3, paging=None)
        first = [t for t in report.tasks if t.network.endswith("0.a")]
        second = [t for t in report.tasks if t.network.endswith("1.b")]
        assert min(t.start for t in second) >= max(t.end for t in first), name


def test_policies_use_the_workers_edgecaffe_gives_them():
    """EdgeCaffe's orchestrators run Bulk and Linear on one worker and DeepEye on two (one
    per pool) whatever the configuration says; MASA and bulk-multi use every worker."""
    kinds = ["conv", "conv", "fc", "fc"]
    jobs = [
        Job(f"j{i}", (net("a", [2, 2, 2, 2], kinds=kinds), net("b", [2, 2, 2, 2], kinds=kinds)))
        for i in range(2)
    ]
    used = {
        name: {t.worker for t in simulate(jobs, name, memory=100, workers=4, paging=None).tasks}
        for name in ("bulk", "linear-fcfs", "deepeye", "bulk-multi", "masa")
    }
    assert used["bulk"] == used["linear-fcfs"] == {0}
    assert used["deepeye"] == {0, 1}
    assert len(used["bulk-multi"]) > 1 and len(used["masa"]) > 1
    assert not make_policy("bulk").serves(1) and make_policy("bulk-multi").serves(3)
    # one worker on one network's loads: bulk-multi loads in parallel, so it finishes sooner
    one = [Job("j", (net("a", [2, 2, 2, 2]),))]
    span = {n: simulate(one, n, memory=100, workers=2, paging=None).makespan for n in ("bulk", "bulk-multi")}
    assert span["bulk"] == 2 * 4 + 4 and span["bulk-multi"] == 2 * 2 + 4


def test_discard_drops_a_jobs_ready_tasks():
    for name in policy_names():
        p = make_policy(name)
        p.bind(2)
        p.add(task("x1", job="x", seq=0))
        p.add(task("y1", job="y", seq=1))
        p.add(task("x2", job="x", seq=2))
        assert sorted(t.id for t in p.discard("x")) == ["x1", "x2"], name
        assert len(p) == 1 and not p.empty()
        assert drain(p) == ["y1"] and p.empty()


def test_masa_introduces_an_idle_period_rather_than_exceed_memory():
    """Thesis Fig. 6.6: a 3-layer network on 2 workers; a worker waits for memory."""
    job = Job("j", (net("n", [3, 3, 3], load=[1, 1, 1], execs=[2, 1, 1], exec_memory=[1, 1, 1]),))
    report = simulate([job], "masa", memory=7, workers=2, paging=None)
    starts = {t.task.split("/")[-1]: t.start for t in report.tasks}
    assert {k: starts[k] for k in ("I", "L0", "L1", "E0", "E1", "L2", "E2")} == {
        "I": 0,
        "L0": 0,
        "L1": 0,
        "E0": 1,
        "E1": 3,
        "L2": 3,
        "E2": 4,
    }
    busy_during_wait = [t for t in report.tasks if t.start < 3 and t.end > 1]
    assert [t.task.split("/")[-1] for t in busy_during_wait] == ["E0"]  # L2 waits: it does not fit
    assert report.makespan == 5 and report.progress_count == 0 and report.peak_memory == 7


def test_masa_fair_refuses_a_task_without_its_network_plan():
    # without the network's plan the safety check could not see what the network still
    # needs; a hand-made task must say so rather than pass the check unseen
    bare = task("L1", K.LOAD, 5)
    bare.plan = None
    with pytest.raises(ScheduleError, match="masa-fair needs each task's network plan; task L1"):
        make_policy("masa-fair").add(bare)
