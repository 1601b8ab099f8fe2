"""The real executor under bad input and faults: rejected, failing, cancelled, timed-out
and shut-down jobs resolve their futures, return their memory and leave no thread."""

from __future__ import annotations

import gc
import shutil
import threading
import time
from concurrent.futures import CancelledError

import pytest
import tinymodels
import torch
from runtime_helpers import model_input, prepare_models, reference, runtime_threads

from layerfit.errors import (
    CorruptStoreError,
    InputError,
    JobRejectedError,
    JobTimeoutError,
    LayerfitError,
    ManifestError,
    ModelNotReadyError,
    ModelOverBudgetError,
    QueueFullError,
    ScheduleError,
    UnknownModelError,
)
from layerfit.schedule.runtime import repository as repository_module
from layerfit.schedule.runtime.executor import Job, Runtime
from layerfit.schedule.runtime.network_run import NetworkRun
from layerfit.schedule.runtime.profiler import estimate_profile
from layerfit.store import read_manifest
from layerfit.store.reader import aligned_buffer


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    directory = prepare_models(tmp_path_factory.mktemp("repo"))
    shutil.copytree(directory / "tiny", directory / "tinybad")
    unit = read_manifest(directory / "tinybad").units[2]
    with open(directory / "tinybad" / "weights.safetensors", "r+b") as fh:
        fh.seek(unit.offset + 8)
        byte = fh.read(1)
        fh.seek(unit.offset + 8)
        fh.write(bytes([byte[0] ^ 0xFF]))
    (directory / "garbage").mkdir()
    (directory / "garbage" / "manifest.json").write_text("{not json")
    return directory


@pytest.fixture
def x():
    return {name: model_input(name) for name in ("tiny", "chain", "slow", "big")}


@pytest.fixture(scope="module")
def refs():
    """model(x) of each model, computed before any runtime runs: the test factories reseed
    torch's global RNG, and a runtime calls them (on the meta device) as its pools grow."""
    return {name: reference(name, model_input(name)) for name in ("tiny", "chain", "slow")}


def settle(rt: Runtime) -> dict:
    """Shut down (waiting), check nothing is left, return the final stats."""
    rt.shutdown(wait=True)
    stats = rt.stats()
    assert stats["in_use_bytes"] == 0, stats
    assert stats["unit_buffer_bytes"] == 0 and stats["networks_in_flight"] == 0
    assert stats["queue_length"] == 0
    assert runtime_threads() == []
    return stats


def test_job_too_large_for_the_budget_is_rejected_with_the_minimum(repo, x, refs):
    rt = Runtime(repo, "32KB", workers=2, trace=True)
    largest = rt.models["big"].profile.largest_task_memory
    assert largest > 32_000 >= rt.models["chain"].profile.largest_task_memory
    big = rt.submit(Job(("chain", "big"), x))
    small = [rt.infer("chain", x["chain"]) for _ in range(3)]
    with pytest.raises(JobRejectedError, match="needs a budget of at least") as info:
        big.result(timeout=60)
    assert info.value.min_budget == largest == rt.required_budget("big")
    assert all(torch.equal(f.result(timeout=60), refs["chain"]) for f in small)
    stats = settle(rt)
    assert stats["jobs"]["rejected"] == 1 and stats["jobs"]["done"] == 3


def test_a_model_too_large_loaded_within_budget_is_never_ready(repo, x, refs, monkeypatch):
    rt = Runtime(repo, "32KB", workers=1, load=False)
    opened = _counting_engines(rt, monkeypatch, delay=0)
    pools, pool_class = [], repository_module.EnginePool  # a model gets a pool when it becomes READY
    monkeypatch.setattr(repository_module, "EnginePool", lambda *a: pools.append(pool_class(*a)) or pools[-1])
    with pytest.raises(ModelOverBudgetError, match=r"needs a memory budget of at least .* more than the runtime") as info:
        rt.load_model("big", within_budget=True)
    assert info.value.min_budget > 32_000
    assert pools == [] and all(engine.reader._fd == -1 for engine in opened)  # never READY, nothing open
    big = next(row for row in rt.index() if row["name"] == "big")
    assert big["state"] == "UNAVAILABLE" and str(info.value.min_budget) in big["reason"]
    with pytest.raises(ModelNotReadyError, match="needs a memory budget of at least"):
        rt.infer("big", x["big"])
    # what fits loads as before; by default a model too large loads and its jobs are rejected
    rt.load_model("chain", within_budget=True)
    assert torch.equal(rt.infer("chain", x["chain"]).result(timeout=60), refs["chain"])
    rt.load_model("big")
    assert info.value.min_budget == rt.models["big"].profile.min_budget > rt.required_budget("big")
    with pytest.raises(JobRejectedError):
        rt.infer("big", x["big"]).result(timeout=60)
    settle(rt)


def test_a_model_whose_tasks_fit_but_whose_run_does_not_is_never_ready_within_budget(repo, x, refs):
    # Each of chain's tasks fits a budget just below what it needs to run (its resident
    # part beside its largest unit), so its jobs pass the job check and then run only
    # through the progress rule, over the budget: a server must not call it READY.
    profile = estimate_profile(read_manifest(repo / "chain"), "chain")
    budget = profile.min_budget - 1
    assert profile.largest_task_memory <= budget
    rt = Runtime(repo, budget, workers=1, load=False)
    with pytest.raises(ModelOverBudgetError, match="to run within it") as info:
        rt.load_model("chain", within_budget=True)
    assert info.value.min_budget == profile.min_budget
    rt.load_model("chain")  # by default it loads, and runs only over the budget
    assert torch.equal(rt.infer("chain", x["chain"]).result(timeout=60), refs["chain"])
    assert settle(rt)["progress_rule_fired"] > 0


def test_failing_load_fails_its_job_returns_memory_others_complete(repo, x, refs):
    rt = Runtime(repo, "200KB", workers=2)
    bad = rt.infer("tinybad", x["tiny"])
    good = [rt.submit(Job(("tiny", "chain"), x)) for _ in range(3)]
    with pytest.raises(CorruptStoreError, match="checksum mismatch in unit 2"):
        bad.result(timeout=60)
    for future in good:
        assert torch.equal(future.result(timeout=60)["chain"], refs["chain"])
    stats = settle(rt)
    assert stats["jobs"]["failed"] == 1 and stats["jobs"]["done"] == 3


def test_failing_execution_fails_its_job_with_the_error(repo, x, refs, monkeypatch):
    original = tinymodels.SlowLinear.forward

    def forward(self, inp):
        if inp.abs().max() > 1000:
            raise RuntimeError("poisoned input")
        return original(self, inp)

    monkeypatch.setattr(tinymodels.SlowLinear, "forward", forward)
    rt = Runtime(repo, "200KB", workers=2)
    poisoned = rt.infer("chain", x["chain"] * 1e6)
    good = [rt.infer("chain", x["chain"]) for _ in range(3)]
    with pytest.raises(RuntimeError, match="poisoned input"):
        poisoned.result(timeout=60)
    assert all(torch.equal(f.result(timeout=60), refs["chain"]) for f in good)
    stats = settle(rt)
    assert stats["jobs"]["failed"] == 1 and stats["jobs"]["done"] == 3


@pytest.mark.parametrize("cancel_pending", [False, True])
def test_shutdown_with_jobs_in_flight_resolves_every_future(repo, x, refs, cancel_pending):
    rt = Runtime(repo, "200KB", workers=2)
    futures = [rt.submit(Job(("slow", "tiny"), x)) for _ in range(4)]
    rt.shutdown(wait=True, cancel_pending=cancel_pending)
    assert all(f.done() for f in futures)
    if not cancel_pending:
        assert all(torch.equal(f.result()["slow"], refs["slow"]) for f in futures)
    else:
        assert any(f.cancelled() for f in futures)
    settle(rt)
    with pytest.raises(ScheduleError, match="shut down"):
        rt.infer("tiny", x["tiny"])


def test_cancel_queued_and_running_jobs_frees_their_memory(repo, x, refs):
    rt = Runtime(repo, "200KB", workers=1)
    running = rt.infer("slow", x["slow"])
    queued = [rt.infer("slow", x["slow"]) for _ in range(3)]
    assert queued[-1].cancel() and queued[-1].cancelled()
    assert running.cancel()
    with pytest.raises(CancelledError):
        running.result(timeout=60)
    for future in queued[:-1]:
        assert torch.equal(future.result(timeout=60), refs["slow"])
    stats = settle(rt)
    assert stats["jobs"]["cancelled"] == 2 and stats["jobs"]["done"] == 2


def test_timeout_cancels_the_job_and_frees_its_memory(repo, x, refs):
    rt = Runtime(repo, "200KB", workers=2, trace=True)
    late = rt.infer("slow", x["slow"], timeout=0.05)
    on_time = rt.infer("tiny", x["tiny"], timeout=60)
    with pytest.raises(JobTimeoutError, match="timeout of 0.05 s") as info:
        late.result(timeout=60)
    assert isinstance(info.value, TimeoutError)
    assert torch.equal(on_time.result(timeout=60), refs["tiny"])
    stats = settle(rt)
    assert stats["jobs"]["timed_out"] == 1 and stats["jobs"]["done"] == 1
    assert sorted(j.status for j in rt.run_report().jobs) == ["done", "timed_out"]  # as stats say


def test_queue_full_is_refused_then_accepted_again(repo, x, refs):
    rt = Runtime(repo, "200KB", workers=1, queue_limit=2)
    first = [rt.infer("slow", x["slow"]) for _ in range(2)]
    with pytest.raises(QueueFullError, match="limit 2"):
        rt.infer("slow", x["slow"])
    first[0].result(timeout=60)
    first[1].result(timeout=60)
    assert torch.equal(rt.infer("tiny", x["tiny"]).result(timeout=60), refs["tiny"])
    assert settle(rt)["jobs"]["done"] == 3


def test_repository_index_names_and_model_states(repo, x, refs):
    rt = Runtime(repo, "200KB", workers=1)
    try:
        states = {m["name"]: m for m in rt.index()}
        assert states["garbage"]["state"] == "UNAVAILABLE"
        assert "not valid JSON" in states["garbage"]["reason"]
        assert states["tiny"]["state"] == "READY" and states["tiny"]["reason"] == ""
        with pytest.raises(ManifestError, match="not valid JSON"):
            rt.load_model("garbage")
        for bad in ("../tiny", "a/b", "", ".hidden", "tiny/../chain", 3):
            with pytest.raises(UnknownModelError, match="invalid model name"):
                rt.infer(bad, x["tiny"])
            with pytest.raises(UnknownModelError):
                rt.load_model(bad)
        with pytest.raises(UnknownModelError, match="no model 'nothere'"):
            rt.infer("nothere", x["tiny"])
        with pytest.raises(ModelNotReadyError, match="not ready"):
            rt.infer("garbage", x["tiny"])
        rt.unload_model("tiny")
        assert {m["name"]: m["state"] for m in rt.index()}["tiny"] == "UNAVAILABLE"
        with pytest.raises(ModelNotReadyError, match="unloaded"):
            rt.infer("tiny", x["tiny"])
        assert torch.equal(rt.infer("chain", x["chain"]).result(timeout=60), refs["chain"])
        rt.load_model("tiny")
        assert torch.equal(rt.infer("tiny", x["tiny"]).result(timeout=60), refs["tiny"])
    finally:
        settle(rt)


def refs_tiny(x) -> torch.Tensor:
    return reference("tiny", x["tiny"])


def test_bad_requests_raise_at_submit(repo, x):
    rt = Runtime(repo, "200KB", workers=1)
    try:
        with pytest.raises(InputError, match=r"expects input of shape \(N, 3, 16, 16\)"):
            rt.infer("tiny", torch.zeros(1, 3, 8, 8))
        with pytest.raises(InputError, match="dtype float32"):
            rt.infer("tiny", torch.zeros(1, 3, 16, 16, dtype=torch.float64))
        with pytest.raises(InputError, match="no input for model 'chain'"):
            rt.submit(Job(("tiny", "chain"), {"tiny": x["tiny"]}))
        with pytest.raises(ScheduleError, match="each network once"):
            rt.submit(Job(("tiny", "tiny"), x["tiny"]))
        with pytest.raises(ScheduleError, match="at least one network"):
            rt.submit(Job((), x["tiny"]))
        for bad in (-1, float("inf"), float("nan")):  # inf once crashed the timer thread
            with pytest.raises(ScheduleError, match="timeout must be a finite"):
                rt.infer("tiny", x["tiny"], timeout=bad)
        assert rt.stats()["jobs"]["submitted"] == 0
        # beyond what a condition can wait for: waits anyway, the job is unaffected
        assert torch.equal(rt.infer("tiny", x["tiny"], timeout=1e12).result(timeout=60), refs_tiny(x))
    finally:
        settle(rt)


def test_constructor_rejects_bad_settings(repo, tmp_path):
    with pytest.raises(LayerfitError, match="is not a folder"):
        Runtime(tmp_path / "missing", "1MB")
    with pytest.raises(ScheduleError, match="unknown policy"):
        Runtime(repo, "1MB", policy="lifo", load=False)
    with pytest.raises(LayerfitError, match="cannot read"):
        Runtime(repo, "lots", load=False)
    with pytest.raises(ScheduleError, match="at least one worker"):
        Runtime(repo, "1MB", workers=0, load=False)
    with pytest.raises(ScheduleError, match="policy must be"):
        Runtime(repo, "1MB", policy=None, load=False)
    for factor in (0, -1, float("nan"), float("inf"), "2"):
        with pytest.raises(ScheduleError, match="estimate_factor must be"):
            Runtime(repo, "1MB", estimate_factor=factor, load=False)
    assert runtime_threads() == []


def test_unloading_a_model_lets_the_jobs_already_accepted_finish(repo, x, refs):
    rt = Runtime(repo, "200KB", workers=1)
    running = rt.infer("slow", x["slow"])
    queued = [rt.infer("slow", x["slow"]) for _ in range(2)]
    rt.unload_model("slow")
    with pytest.raises(ModelNotReadyError, match="unloaded"):
        rt.infer("slow", x["slow"])
    for future in (running, *queued):
        assert torch.equal(future.result(timeout=60), refs["slow"])
    rt.load_model("slow")  # and a reload while jobs of the old engines are queued
    queued = [rt.infer("slow", x["slow"]) for _ in range(2)]
    rt.load_model("slow")
    assert all(torch.equal(f.result(timeout=60), refs["slow"]) for f in queued)
    assert settle(rt)["jobs"]["done"] == 5


def test_shutdown_from_a_futures_callback_does_not_deadlock(repo, x, refs):
    # The callback runs on the only worker; waiting there for the queued job would wait
    # for itself, so shutdown returns and the runtime finishes the job on its own.
    rt = Runtime(repo, "200KB", workers=1, policy="linear-fcfs")
    first = rt.infer("slow", x["slow"])
    second = rt.infer("slow", x["slow"])
    returned = threading.Event()
    first.add_done_callback(lambda f: (rt.shutdown(wait=True), returned.set()))
    assert returned.wait(60)
    assert torch.equal(second.result(timeout=60), refs["slow"])
    settle(rt)


def test_shutdown_without_waiting_closes_the_engines_after_the_last_job(repo, x, refs):
    rt = Runtime(repo, "200KB", workers=2)
    future = rt.infer("slow", x["slow"])
    rt.shutdown(wait=False)
    assert torch.equal(future.result(timeout=60), refs["slow"])
    deadline = time.monotonic() + 60
    while runtime_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runtime_threads() == []
    assert {m["state"] for m in rt.index() if m["name"] in ("slow", "tiny")} == {"UNAVAILABLE"}
    assert all(info.pool is None for info in rt.models.values())


def test_ledger_check_and_report_need_a_trace(repo):
    with Runtime(repo, "200KB", load=False) as rt:
        with pytest.raises(ScheduleError, match="trace=True"):
            rt.check_ledger()
        with pytest.raises(ScheduleError, match="trace=True"):
            rt.run_report()


def test_a_crash_of_the_scheduling_core_fails_jobs_and_says_why(repo, x, monkeypatch):
    rt = Runtime(repo, "200KB", workers=1)

    def broken(*args, **kwargs):
        raise RuntimeError("scheduler bug")

    monkeypatch.setattr(rt._core.dispatcher, "assign", broken)
    future = rt.infer("tiny", x["tiny"])
    with pytest.raises(ScheduleError, match="internal error: RuntimeError: scheduler bug"):
        future.result(timeout=60)
    with pytest.raises(ScheduleError, match="shut down: .*scheduler bug"):
        rt.infer("tiny", x["tiny"])
    rt.shutdown(wait=True)
    assert runtime_threads() == []


def test_unloading_a_unit_leaves_bytes_a_view_still_points_to_mapped():
    # Defence in depth beside capture's resident rule: a view of a unit's bytes that
    # outlives its unload keeps the mapping (freed with the view) instead of a crash.
    class OneUnit:
        blocks = [None]

        def read_unit_buffer(self, i: int):
            buffer = aligned_buffer(4096)
            buffer[:4] = bytes([1, 2, 3, 4])
            return buffer

    run = NetworkRun("n0", "j0", "m", OneUnit(), (), threading.RLock(), on_exit=lambda run: None)
    assert run.load(0) == 4096
    view = run._units[0].tensor[:4]
    assert run.unload(0) == 4096
    gc.collect()
    assert view.tolist() == [1, 2, 3, 4]


def _counting_engines(rt: Runtime, monkeypatch, delay: float) -> list:
    """Record every engine the runtime opens; each takes ``delay`` s to open (a large model)."""
    opened = []
    new_engine = rt._repo._new_engine  # the model repository opens the engines

    def slow_new_engine(directory, units):
        time.sleep(delay)
        engine = new_engine(directory, units)
        opened.append(engine)
        return engine

    monkeypatch.setattr(rt._repo, "_new_engine", slow_new_engine)
    return opened


def test_concurrent_loads_and_unloads_of_one_model_leave_no_engine_open(repo, x, refs, monkeypatch):
    rt = Runtime(repo, "200KB", workers=1, load=False)
    opened = _counting_engines(rt, monkeypatch, delay=0.2)
    # Two loads at once: one pool wins, and the other's engine is not left open beside it.
    errors: list[BaseException] = []

    def load():
        try:
            rt.load_model("tiny")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert torch.equal(rt.infer("tiny", x["tiny"]).result(timeout=60), refs["tiny"])
    # An unload called while a load runs takes effect after it: the model ends unloaded.
    loading = threading.Thread(target=rt.load_model, args=("tiny",))
    loading.start()
    time.sleep(0.05)
    rt.unload_model("tiny")
    loading.join()
    with pytest.raises(ModelNotReadyError, match="unloaded"):
        rt.infer("tiny", x["tiny"])
    settle(rt)
    assert len(opened) == 3  # one per load: the job ran on the first load's engine
    assert all(engine.reader._fd == -1 for engine in opened)  # every engine closed


def test_a_load_that_ends_after_shutdown_closes_its_engine(repo, monkeypatch):
    rt = Runtime(repo, "200KB", workers=1, load=False)
    opened = _counting_engines(rt, monkeypatch, delay=0.3)
    errors: list[BaseException] = []
    loading = threading.Thread(target=lambda: errors.extend(_raised(rt.load_model, "tiny")))
    loading.start()
    time.sleep(0.05)
    settle(rt)
    loading.join()
    assert len(opened) == 1 and opened[0].reader._fd == -1
    assert len(errors) == 1 and "shut down" in str(errors[0])
    assert rt.index()[[m["name"] for m in rt.index()].index("tiny")]["state"] == "UNAVAILABLE"


def _raised(call, *args) -> list[BaseException]:
    try:
        call(*args)
    except BaseException as exc:  # noqa: BLE001 - the caller checks it
        return [exc]
    return []


def test_a_forward_thread_that_cannot_start_fails_its_job_and_returns_the_engine(repo, x, refs, monkeypatch):
    rt = Runtime(repo, "200KB", workers=1)
    real_start = NetworkRun.start
    calls = {"n": 0}

    def start_once_fails(net):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("can't start new thread")
        real_start(net)

    monkeypatch.setattr(NetworkRun, "start", start_once_fails)
    failed = rt.infer("tiny", x["tiny"])
    with pytest.raises(LayerfitError, match="cannot start the forward thread of network .*can't start new thread"):
        failed.result(timeout=60)
    assert torch.equal(rt.infer("tiny", x["tiny"]).result(timeout=60), refs["tiny"])
    assert rt.models["tiny"].pool.created == 1  # the failed job's engine went back to the pool
    settle(rt)  # shutdown joins no thread that never started
