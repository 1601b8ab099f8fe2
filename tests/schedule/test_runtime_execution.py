"""The real executor: outputs equal model(x) under every policy, the budget holds except by
the progress rule, precedence holds, at most ``workers`` tasks run at once."""

from __future__ import annotations

import gc
import json
import shutil
import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runtime_helpers import (
    NAMES,
    largest_task,
    model_input,
    prepare_models,
    reference,
    runtime_threads,
)

import layerfit
from layerfit.engine.engine import Engine
from layerfit.engine.osmem import is_glibc
from layerfit.errors import LayerfitError, ScheduleError
from layerfit.schedule.graph import build_graph
from layerfit.schedule.policies import POLICIES, policy_names
from layerfit.schedule.runtime import workers as workers_module
from layerfit.schedule.runtime.executor import Job, Runtime
from layerfit.schedule.runtime.profiler import (
    StatmSampler,
    activation_peak_bytes,
    estimate_profile,
    measure_profile,
)
from layerfit.store import read_manifest


def check_trace(rt: Runtime, workers: int) -> None:
    """Ledger within budget except the progress rule; at most ``workers`` tasks at once,
    only on workers the policy serves; every job's precedence constraints respected."""
    report = rt.run_report()
    limit = POLICIES[rt.policy].max_workers
    if limit is not None:
        assert {t.worker for t in report.tasks} <= set(range(limit)), rt.policy
    assert report.budget_violations == 0
    for sample in report.ledger_history:
        assert sample.used - sample.progress_held <= report.budget
    if report.progress_count == 0:
        assert report.peak_memory <= report.budget
    events = sorted([(t.start, 1) for t in report.tasks] + [(t.end, -1) for t in report.tasks])
    running = 0
    for _, delta in sorted(events, key=lambda e: (e[0], e[1])):
        running += delta
        assert running <= workers
    by_task = {t.task: t for t in report.tasks}
    profiles = rt.profile_set(ready_only=False)
    scheme = POLICIES[rt.policy].scheme
    for job in report.jobs:
        if job.status != "done":
            continue
        graph = build_graph([profiles[n] for n in job.networks], scheme, job=job.id)
        for a, b in graph.edges:
            assert by_task[a].end <= by_task[b].start, (rt.policy, a, b)


@pytest.mark.parametrize("policy", policy_names())
def test_every_policy_gives_exactly_model_outputs(repo, refs, policy):
    inputs, expected = refs
    rt = Runtime(repo, "128KB", workers=2, policy=policy, trace=True)
    try:
        jobs = [rt.submit(Job(("tiny", "chain"), inputs)) for _ in range(4)]
        single = rt.infer("chain", inputs["chain"])
        for future in jobs:
            out = future.result(timeout=60)
            assert set(out) == {"tiny", "chain"}
            assert torch.equal(out["tiny"], expected["tiny"])
            assert torch.equal(out["chain"], expected["chain"])
        assert torch.equal(single.result(timeout=60), expected["chain"])
    finally:
        rt.shutdown()
    check_trace(rt, 2)
    stats = rt.stats()
    assert stats["jobs"]["done"] == 5 and stats["queue_length"] == 0
    units = {name: len(rt.models[name].profile.layers) for name in ("tiny", "chain")}
    assert stats["tasks_started"]["exec"] == 4 * (units["tiny"] + units["chain"]) + units["chain"]
    assert stats["tasks_started"]["init"] == 4 * 2 + 1
    assert stats["in_use_bytes"] == 0 and stats["unit_buffer_bytes"] == 0
    assert runtime_threads() == []


@pytest.mark.parametrize("policy", ["masa-fair", "masa", "bulk", "deepeye"])
def test_merged_units_give_exactly_model_outputs_with_one_task_per_block(repo, refs, policy):
    from layerfit.engine.units import make_blocks

    inputs, expected = refs
    with Runtime(repo, "128KB", workers=2, policy=policy, trace=True, units="merge:12kB") as rt:
        jobs = [rt.submit(Job(("tiny", "chain"), inputs)) for _ in range(3)]
        for future in jobs:
            out = future.result(timeout=60)
            assert torch.equal(out["tiny"], expected["tiny"]) and torch.equal(out["chain"], expected["chain"])
        blocks = {n: make_blocks(rt.models[n].manifest.units, "merge:12kB") for n in ("tiny", "chain")}
        per_layer = {n: len(rt.models[n].manifest.units) for n in ("tiny", "chain")}
        assert any(len(blocks[n]) < per_layer[n] for n in blocks)  # something was merged
        for n in blocks:
            profile = rt.models[n].profile
            assert len(profile.layers) == len(blocks[n])
            assert [layer.memory for layer in profile.layers] == [b.nbytes for b in blocks[n]]
        stats = rt.stats()
    check_trace(rt, 2)
    assert stats["tasks_started"]["exec"] == 3 * (len(blocks["tiny"]) + len(blocks["chain"]))
    assert stats["in_use_bytes"] == 0 and stats["unit_buffer_bytes"] == 0


def test_merge_auto_joins_layers_and_keeps_each_models_minimum_budget(repo, refs):
    inputs, expected = refs
    with Runtime(repo, "128KB", workers=2, load=True) as by_layers:
        layered = {n: by_layers.models[n].profile for n in NAMES}
    with Runtime(repo, "128KB", workers=2, policy="masa-fair", trace=True, units="merge:auto") as rt:
        for future in [rt.submit(Job(("tiny", "chain"), inputs)) for _ in range(3)]:
            out = future.result(timeout=60)
            assert torch.equal(out["tiny"], expected["tiny"]) and torch.equal(out["chain"], expected["chain"])
        merged = {n: rt.models[n].profile for n in NAMES}
        stats = rt.stats()
    check_trace(rt, 2)
    for n in NAMES:
        assert merged[n].min_budget == layered[n].min_budget
        assert len(merged[n].layers) == len(layered[n].blocks_within_min_budget())
    assert len(merged["tiny"].layers) < len(layered["tiny"].layers)  # its small norms joined a conv
    assert stats["tasks_started"]["exec"] == 3 * (len(merged["tiny"].layers) + len(merged["chain"].layers))


def test_a_bad_units_spec_is_refused_before_any_model_loads(repo):
    with pytest.raises(LayerfitError, match="granularity"):
        Runtime(repo, "1MB", units="merge:lots")
    with pytest.raises(LayerfitError, match="units must be"):
        Runtime(repo, "1MB", units=3)  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["bulk", "deepeye"])
def test_ungated_baselines_overcommit_and_memory_aware_ones_do_not(repo, refs, policy):
    """``gated=False`` runs the thesis's memory-oblivious baselines: they go over the budget
    (counted as over-commits, never as the progress rule) and still give model(x); MASA
    keeps the budget whatever ``gated`` says."""
    inputs, expected = refs
    budget = largest_task(repo, ["tiny", "chain"])  # tiny's init; its bulk peak is more than twice that
    for name, gated in ((policy, False), ("masa", False), (policy, True)):
        rt = Runtime(repo, budget, workers=2, policy=name, gated=gated, trace=True)
        try:
            futures = [rt.submit(Job(("tiny", "chain"), inputs)) for _ in range(3)]
            for future in futures:
                out = future.result(timeout=60)
                assert torch.equal(out["tiny"], expected["tiny"])
                assert torch.equal(out["chain"], expected["chain"])
        finally:
            rt.shutdown()
        stats, report = rt.stats(), rt.run_report()
        assert stats["gated"] is (gated or name == "masa")
        if stats["gated"]:
            assert stats["overcommits"] == 0
            check_trace(rt, 2)
        else:
            assert stats["overcommits"] > 0 and report.peak_memory > budget
        assert stats["in_use_bytes"] == 0 and runtime_threads() == []


jobs_strategy = st.lists(
    st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True), min_size=1, max_size=4
)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    jobs=jobs_strategy,
    budget_kb=st.integers(8, 200),
    workers=st.integers(1, 3),
    policy=st.sampled_from(policy_names()),
)
def test_random_jobs_complete_within_budget(repo, refs, jobs, budget_kb, workers, policy):
    inputs, expected = refs
    rt = Runtime(repo, budget_kb * 1024, workers=workers, policy=policy, trace=True)
    try:
        futures = [rt.submit(Job(tuple(names), inputs)) for names in jobs]
        for names, future in zip(jobs, futures, strict=True):
            largest = max(rt.models[n].profile.largest_task_memory for n in names)
            if largest > budget_kb * 1024:
                error = future.exception(timeout=60)
                assert isinstance(error, layerfit.errors.JobRejectedError)
                assert error.min_budget >= largest
                continue
            out = future.result(timeout=60)
            for name in names:
                assert torch.equal(out[name], expected[name])
    finally:
        rt.shutdown()
    check_trace(rt, workers)
    assert rt.stats()["in_use_bytes"] == 0
    assert runtime_threads() == []


def test_the_runtime_fixes_the_mmap_threshold_unless_told_not_to(repo):
    # what the settings do to RSS is tested in tests/engine/test_osmem.py
    for asked, mode in ((False, "never"), ("never", "never"), ("eagerly", "eagerly"), (True, "after-pass")):
        with Runtime(repo, "1MB", load=False, return_freed_memory=asked) as rt:
            expected = mode if is_glibc() else "never"
            assert rt.stats()["freed_memory"] == expected
            assert rt.stats()["returns_freed_memory"] is (expected != "never")
    with Runtime(repo, "1MB", load=False) as rt:
        assert rt.stats()["freed_memory"] == ("after-pass" if is_glibc() else "never")
    for bad in ("sometimes", 1, None):
        with pytest.raises(ScheduleError, match="return_freed_memory must be one of after-pass, eagerly, never, got"):
            Runtime(repo, "1MB", load=False, return_freed_memory=bad)


@pytest.mark.skipif(not is_glibc(), reason="the heap trim is glibc's")
@pytest.mark.parametrize("mode", ["after-pass", "eagerly"])
def test_after_pass_the_heap_is_trimmed_once_per_forward_pass(repo, monkeypatch, mode):
    trims = []
    monkeypatch.setattr(workers_module, "trim_heap", lambda: trims.append(threading.current_thread().name))
    names = NAMES
    inputs = {n: model_input(n) for n in names}
    with Runtime(repo, "64MB", workers=2, return_freed_memory=mode) as rt:
        for _ in range(3):
            out = rt.submit(Job(tuple(names), inputs)).result(60)
            for n in names:
                assert torch.equal(out[n], reference(n, inputs[n]))
    if mode == "eagerly":
        assert trims == []  # glibc trims as it frees
    else:
        assert len(trims) == 3 * len(names)
        assert all(t.startswith("layerfit-forward-") for t in trims)  # never a worker's time


def test_weights_used_outside_their_module_and_outputs_viewing_them(tmp_path):
    # Capture keeps such weights resident, so the outputs that are views of them stay
    # the model's bytes after every unit is unloaded and the runtime is gone.
    repo = prepare_models(tmp_path, ["outside"])
    x = model_input("outside")
    expected = reference("outside", x)
    with Runtime(repo, "1MB", workers=2) as rt:
        got = rt.infer("outside", x).result(timeout=60)
    del rt
    gc.collect()
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


@pytest.mark.parametrize("estimates", ["capture", "profile"])
def test_models_with_nothing_to_stream_run_as_one_execution(tmp_path, estimates):
    # No parameters, or every weight resident: the forward pass is one execute task
    # (after a load and before an unload of nothing), inside a worker slot like any other.
    repo = prepare_models(tmp_path, ["noweights", "resident", "chain"])
    x = {name: model_input(name) for name in ("noweights", "resident", "chain")}
    expected = {name: reference(name, x[name]) for name in x}
    for policy in ("masa", "bulk", "linear-fcfs"):
        with Runtime(repo, "1MB", workers=2, policy=policy, estimates=estimates, trace=True) as rt:
            assert {m["name"]: m["state"] for m in rt.index()} == dict.fromkeys(x, "READY")
            assert [layer.name for layer in rt.models["noweights"].profile.layers] == ["forward"]
            futures = [rt.submit(Job(tuple(x), x)) for _ in range(3)]
            futures += [rt.infer("resident", x["resident"])]
            for future in futures[:3]:
                got = future.result(timeout=60)
                assert all(torch.equal(got[name], expected[name]) for name in x)
            assert torch.equal(futures[3].result(timeout=60), expected["resident"])
            rt.check_ledger()
            tasks = [(r.kind, r.layer) for r in rt.run_report().tasks if r.network.endswith(".noweights")]
        assert sorted(set(tasks)) == [("EXEC", 0), ("INIT", -1), ("LOAD", 0), ("UNLOAD", 0)]
        assert len(tasks) == 4 * 3
        assert rt.stats()["in_use_bytes"] == 0
    assert runtime_threads() == []


def test_a_model_with_nothing_to_stream_runs_inside_its_execute_task(tmp_path):
    # FCFS on one worker starts both networks before either executes: a forward pass
    # that did not wait for its execute task would run beside the other one.
    repo = prepare_models(tmp_path, ["pause"])
    shutil.copytree(repo / "pause", repo / "pause2")
    with Runtime(repo, "1MB", workers=1, policy="fcfs", trace=True) as rt:
        x = model_input("pause")
        out = rt.submit(Job(("pause", "pause2"), x)).result(timeout=60)
        assert torch.equal(out["pause"], x * 2) and torch.equal(out["pause2"], x * 2)
        first, second = sorted((r for r in rt.run_report().tasks if r.kind == "EXEC"), key=lambda r: r.start)
    assert first.end - first.start >= 0.2 and second.end - second.start >= 0.2
    assert first.end <= second.start


def test_per_network_inputs_batches_and_repeated_models(repo, refs):
    inputs, expected = refs
    batch = torch.cat([inputs["chain"], model_input("chain", seed=5)])
    # the reference first: the test factory reseeds torch's global RNG, and the runtime
    # calls it (on the meta device) whenever a busy model's engine pool grows
    ref = reference("chain", batch)
    with Runtime(repo, "1MB", workers=3) as rt:
        futures = [rt.infer("chain", batch) for _ in range(6)]
        assert all(torch.equal(f.result(timeout=60), ref) for f in futures)
        assert rt.stats()["tasks_started"]["init"] == 6
        # the time each job waited for its first task, for the server's queue metric
        assert all(0 <= f.queue_seconds < 60 for f in futures)


def test_index_stats_and_profiles(repo):
    with Runtime(repo, "1MB", workers=1, estimates="profile") as rt:
        index = rt.index()
        assert [m["name"] for m in index] == sorted(NAMES) and {m["state"] for m in index} == {"READY"}
        assert set(rt.models) == set(NAMES)
        info = rt.models["tiny"]
        assert info.loaded and info.manifest is not None and info.directory == repo / "tiny"
        profile = info.profile
        assert profile.source == "profiled" and len(profile.layers) == len(info.manifest.units)
        for layer, segment in zip(profile.layers, info.manifest.units, strict=True):
            assert layer.memory == segment.nbytes and layer.load_peak >= segment.nbytes
            assert layer.load_time > 0 and layer.exec_time > 0
        stats = rt.stats()
        for key in (
            "budget_bytes", "in_use_bytes", "tasks_started", "progress_rule_fired",
            "queue_length", "jobs",
        ):
            assert key in stats
        assert stats["budget_bytes"] == 1_000_000


def test_capture_estimates_reserve_unit_bytes_and_activations(repo):
    manifest = Engine(repo / "tiny", pipeline="external").manifest
    profile = estimate_profile(manifest, "tiny")
    assert [layer.memory for layer in profile.layers] == [u.nbytes for u in manifest.units]
    assert profile.init_memory > 0  # the activations of one forward pass
    measured = measure_profile(repo / "chain", repeats=1, warmup=0)
    assert measured.name == "chain" and measured.notes["estimates"] == "statm"


def test_init_counts_the_captured_pass_and_an_older_manifest_warns(repo, tmp_path, caplog):
    manifest = read_manifest(repo / "tiny")
    graph = manifest.graph
    assert graph.pass_peak_bytes > activation_peak_bytes(graph)  # eager batch norm: its own output
    with caplog.at_level("WARNING", logger="layerfit.schedule.runtime.profiler"):
        profile = estimate_profile(manifest, "tiny")
    assert profile.init_memory == manifest.resident_bytes + graph.pass_peak_bytes
    assert not caplog.records
    # prepared before the pass was measured: the records alone, and a warning saying so
    older = tmp_path / "tiny"
    shutil.copytree(repo / "tiny", older)
    data = json.loads((older / "manifest.json").read_text())
    del data["graph"]["pass_peak_bytes"]
    (older / "manifest.json").write_text(json.dumps(data))
    with caplog.at_level("WARNING", logger="layerfit.schedule.runtime.profiler"):
        profile = estimate_profile(read_manifest(older), "tiny")
    assert profile.init_memory == manifest.resident_bytes + activation_peak_bytes(graph)
    assert "prepare it again" in caplog.text


def test_measured_executions_include_the_ops_between_units(tmp_path):
    """The runtime's execute task of unit i spans the ops after unit i-1 (and the last,
    the ops after it): the profile must count them, or the simulator runs too fast."""
    from layerfit.store import ModelSpec, prepare

    pause = 0.05  # far above an 8-wide kernel, so scheduling jitter cannot blur the bounds
    directory = tmp_path / "paused"
    spec = ModelSpec("factory", "tinymodels:chain_with_pauses", {"widths": [8, 8, 8, 8], "pause": pause})
    prepare(spec, directory, input_shape=(1, 8))
    profile = measure_profile(directory, repeats=1, warmup=0)
    first, *rest = profile.layers
    assert first.exec_time < pause  # nothing runs before the first unit
    for layer in rest[:-1]:
        assert pause <= layer.exec_time < 3 * pause  # the pause after the previous unit
    assert rest[-1].exec_time >= 2 * pause  # the pause before it and the one after it
    assert profile.unload_time > 0


def test_statm_sampler_sees_an_allocation():
    import mmap

    import numpy as np

    sampler = StatmSampler(interval=1e-4).start()
    # A fresh anonymous mapping, every page touched: unlike a tensor, it cannot be
    # served from memory the allocator already holds from earlier tests.
    block = mmap.mmap(-1, 4 * 1024 * 1024)
    np.frombuffer(block, dtype=np.uint8)[:] = 1
    grown = sampler.stop()
    sampler.close()
    block.close()
    assert grown >= 3 * 1024 * 1024


def test_external_engine_runs_only_with_a_source(repo, refs):
    inputs, _ = refs
    with (
        Engine(repo / "tiny", pipeline="external") as engine,
        pytest.raises(LayerfitError, match="unit source"),
    ):
        engine(inputs["tiny"])


def test_a_larger_batch_is_admitted_by_its_grown_activations_or_refused_413(repo, refs):
    from layerfit.errors import RequestTooLargeError

    inputs, _ = refs
    x = inputs["chain"]
    with Runtime(repo, "1MB", workers=1) as rt:
        rt.infer("chain", x).result(timeout=60)
        one = rt.stats()["peak_bytes"]
        batch = torch.cat([x] * 64)
        out = rt.infer("chain", batch).result(timeout=60)
        assert torch.equal(out, reference("chain", batch))
        assert rt.stats()["peak_bytes"] > one  # the ledger held the batch's activations, not batch 1's
        with pytest.raises(RequestTooLargeError, match="a batch of 100000 needs a memory budget"):
            rt.infer("chain", torch.cat([x] * 100000))
        assert rt.stats()["peak_bytes"] <= rt.stats()["budget_bytes"]
