"""The weight cache: units loaded by earlier jobs are reused instead of read again, the
outputs stay exactly model(x), and the budget holds however tight it is."""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runtime_helpers import NAMES, model_input, prepare_models, reference, runtime_threads
from schedule_helpers import task as make_task
from test_runtime_execution import check_trace

from layerfit.engine.engine import Engine
from layerfit.errors import ScheduleError
from layerfit.schedule.ledger import MemoryLedger
from layerfit.schedule.policies import policy_names
from layerfit.schedule.runtime.executor import Job, Runtime
from layerfit.schedule.runtime.weight_cache import WeightCache
from layerfit.schedule.tasks import TaskKind


@pytest.fixture
def reads(monkeypatch):
    """Units read from storage, by model folder name (every engine's reads)."""
    counts: dict[str, int] = {}
    lock = threading.Lock()
    read = Engine.read_unit_buffer

    def counting(self, i):
        with lock:
            counts[self.directory.name] = counts.get(self.directory.name, 0) + 1
        return read(self, i)

    monkeypatch.setattr(Engine, "read_unit_buffer", counting)
    return counts


def units_of(rt: Runtime, name: str) -> int:
    return len(rt.models[name].profile.layers)


def weight_bytes(rt: Runtime, names: list[str]) -> int:
    return sum(u.nbytes for n in names for u in rt.models[n].manifest.units)


@pytest.mark.parametrize("policy", ["masa-fair", "masa", "masa-fcfs", "bulk", "deepeye", "fcfs"])
def test_a_loose_budget_reads_each_unit_once_and_outputs_stay_exact(repo, refs, reads, policy):
    inputs, expected = refs
    with Runtime(repo, "1MB", workers=2, policy=policy, trace=True, cache_weights=True) as rt:
        total_units = sum(units_of(rt, n) for n in NAMES)
        for round_ in range(3):
            out = rt.submit(Job(tuple(NAMES), inputs)).result(timeout=60)
            for name in NAMES:
                assert torch.equal(out[name], expected[name]), (policy, round_, name)
            assert sum(reads.values()) == total_units  # the first job's reads only
            assert rt.stats()["unit_bytes_read"] == weight_bytes(rt, NAMES)
        stats = rt.stats()
        cache = stats["weight_cache"]
        assert cache["hits"] == 2 * total_units and cache["misses"] == total_units
        assert cache["evictions"] == 0 and cache["entries"] == total_units
        assert cache["hit_bytes"] == 2 * weight_bytes(rt, NAMES)
        # every unit stays mapped once, and the ledger holds exactly what the loads retained
        assert stats["unit_buffer_bytes"] == cache["bytes"] == weight_bytes(rt, NAMES)
        assert stats["in_use_bytes"] == cache["reserved_bytes"]
        rt.clear_trace()  # after a warm-up: counters start afresh, the cache stays
        out = rt.submit(Job(tuple(NAMES), inputs)).result(timeout=60)
        assert all(torch.equal(out[n], expected[n]) for n in NAMES)
        stats = rt.stats()
        assert stats["weight_cache"]["hits"] == total_units and stats["weight_cache"]["misses"] == 0
        assert stats["unit_bytes_read"] == 0 and stats["weight_cache"]["entries"] == total_units
    check_trace(rt, 2)
    stats = rt.stats()
    assert stats["in_use_bytes"] == 0 and stats["unit_buffer_bytes"] == 0
    assert stats["weight_cache"]["entries"] == 0 and stats["weight_cache"]["bytes"] == 0
    assert runtime_threads() == []


def test_without_the_cache_every_job_reads_every_unit(repo, refs, reads):
    inputs, _ = refs
    with Runtime(repo, "1MB", workers=2) as rt:
        for _ in range(3):
            rt.submit(Job(tuple(NAMES), inputs)).result(timeout=60)
        assert sum(reads.values()) == 3 * sum(units_of(rt, n) for n in NAMES)
        assert rt.stats()["unit_bytes_read"] == 3 * weight_bytes(rt, NAMES)
        assert rt.stats()["weight_cache"] is None and rt.stats()["in_use_bytes"] == 0


jobs_strategy = st.lists(
    st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True), min_size=1, max_size=5
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    jobs=jobs_strategy,
    budget_kb=st.integers(48, 320),
    workers=st.integers(1, 3),
    policy=st.sampled_from(policy_names()),
    sequential=st.booleans(),
)
def test_any_budget_any_policy_the_ledger_holds_and_outputs_stay_exact(
    repo, refs, jobs, budget_kb, workers, policy, sequential
):
    """Tight budgets evict; loose ones hit; either way the budget holds (except by the
    progress rule), every load is a hit or a read, and all memory comes back."""
    inputs, expected = refs
    counts: dict[str, int] = {}
    lock = threading.Lock()
    read = Engine.read_unit_buffer

    def counting(self, i):
        with lock:  # worker threads read at once
            counts[self.directory.name] = counts.get(self.directory.name, 0) + 1
        return read(self, i)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Engine, "read_unit_buffer", counting)
        rt = Runtime(repo, budget_kb * 1024, workers=workers, policy=policy, trace=True, cache_weights=True)
        try:
            futures = []
            for names in jobs:
                futures.append((names, rt.submit(Job(tuple(names), inputs))))
                if sequential:
                    futures[-1][1].exception(timeout=60)
            for names, future in futures:
                if future.exception(timeout=60) is not None:  # a job too large for the budget
                    largest = max(rt.models[n].profile.largest_task_memory for n in names)
                    assert largest > budget_kb * 1024
                    continue
                out = future.result()
                for name in names:
                    assert torch.equal(out[name], expected[name])
            stats = rt.stats()
        finally:
            rt.shutdown()
    check_trace(rt, workers)
    cache = stats["weight_cache"]
    assert stats["tasks_started"]["load"] == cache["hits"] + cache["misses"]
    assert sum(counts.values()) == cache["misses"]
    assert cache["reserved_bytes"] <= budget_kb * 1024
    final = rt.stats()
    assert final["in_use_bytes"] == 0 and final["unit_buffer_bytes"] == 0
    assert runtime_threads() == []


def test_jobs_of_one_model_at_once_each_get_a_unit_and_one_copy_stays(repo, refs, reads):
    inputs, expected = refs
    with Runtime(repo, "1MB", workers=3, policy="masa-fair", cache_weights=True) as rt:
        futures = [rt.infer("chain", inputs["chain"]) for _ in range(6)]
        for future in futures:
            assert torch.equal(future.result(timeout=60), expected["chain"])
        cache = rt.stats()["weight_cache"]
        assert cache["entries"] == units_of(rt, "chain")
        assert cache["bytes"] == weight_bytes(rt, ["chain"]) == rt.stats()["unit_buffer_bytes"]
        assert reads["chain"] == cache["misses"] and cache["hits"] + cache["misses"] == 6 * units_of(rt, "chain")
    assert rt.stats()["in_use_bytes"] == 0


def test_reloading_a_model_drops_its_cached_units(repo, refs, reads):
    inputs, expected = refs
    with Runtime(repo, "1MB", workers=2, cache_weights=True) as rt:
        rt.submit(Job(("tiny", "chain"), inputs)).result(timeout=60)
        before = rt.stats()["weight_cache"]
        rt.load_model("chain")  # a new engine pool: the old units must not be served
        after = rt.stats()["weight_cache"]
        assert after["entries"] == before["entries"] - units_of(rt, "chain")
        assert rt.stats()["in_use_bytes"] == after["reserved_bytes"]
        reads.clear()
        out = rt.submit(Job(("tiny", "chain"), inputs)).result(timeout=60)
        assert torch.equal(out["chain"], expected["chain"]) and torch.equal(out["tiny"], expected["tiny"])
        assert reads == {"chain": units_of(rt, "chain")}
        rt.unload_model("tiny")
        assert rt.stats()["weight_cache"]["entries"] == units_of(rt, "chain")
    assert rt.stats()["in_use_bytes"] == 0


@pytest.mark.parametrize("cancel_pending", [True, False])
def test_shutdown_with_jobs_in_flight_returns_every_cached_byte(repo, refs, cancel_pending):
    inputs, expected = refs
    rt = Runtime(repo, "160KB", workers=2, policy="masa-fair", cache_weights=True)
    futures = [rt.submit(Job(tuple(NAMES), inputs)) for _ in range(5)]
    rt.shutdown(wait=True, cancel_pending=cancel_pending)
    for future in futures:
        assert future.done()
        if not cancel_pending:
            out = future.result()
            assert all(torch.equal(out[n], expected[n]) for n in NAMES)
    stats = rt.stats()
    assert stats["in_use_bytes"] == 0 and stats["unit_buffer_bytes"] == 0
    assert stats["weight_cache"]["entries"] == 0
    assert runtime_threads() == []


def test_cancelled_jobs_leave_the_cache_consistent(repo, refs):
    inputs, expected = refs
    with Runtime(repo, "192KB", workers=2, policy="masa-fair", cache_weights=True, trace=True) as rt:
        for i in range(6):
            future = rt.submit(Job(tuple(NAMES), inputs))
            if i % 2:
                future.cancel()
            else:
                out = future.result(timeout=60)
                assert all(torch.equal(out[n], expected[n]) for n in NAMES)
        out = rt.submit(Job(tuple(NAMES), inputs)).result(timeout=60)
        assert all(torch.equal(out[n], expected[n]) for n in NAMES)
        rt.shutdown()
    check_trace(rt, 2)
    assert rt.stats()["in_use_bytes"] == 0 and rt.stats()["unit_buffer_bytes"] == 0


def test_cache_weights_must_be_a_bool(repo):
    with pytest.raises(ScheduleError, match="cache_weights must be True or False"):
        Runtime(repo, "1MB", cache_weights="yes")  # type: ignore[arg-type]


# --- the cache alone, over a real ledger -------------------------------------------------


class Buffer:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.freed = False

    def free(self) -> None:
        assert not self.freed, "freed twice"
        self.freed = True


def cached(cache: WeightCache, ledger: MemoryLedger, model: str, unit: int, nbytes: int) -> Buffer:
    """Load (reserve and retain ``nbytes``) then unload unit ``unit`` of ``model`` into ``cache``."""
    key = f"{model}/L{unit}"
    ledger.acquire(key, nbytes, owner=model)
    ledger.finish(key, keep=nbytes)
    buffer = Buffer(nbytes)
    assert cache.put(model, unit, buffer, key)
    return buffer


def load_task(model: str, unit: int, nbytes: int, network: str | None = None):
    return make_task(f"{network or model}/L{unit}", TaskKind.LOAD, nbytes, network=network or model, layer=unit)


def test_eviction_takes_the_least_requested_model_first_and_the_units_cached_last_first():
    ledger = MemoryLedger(1000)
    cache = WeightCache(ledger, locate=lambda task: task.network.split("#")[0])
    cache.requested("a#0", "a")
    cache.finished("a#0")
    cache.requested("b#0", "b")
    cache.finished("b#0")
    cache.requested("b#1", "b")
    cache.finished("b#1")  # b asked for twice lately, a once
    buffers = {(m, u): cached(cache, ledger, m, u, 100) for m in "ab" for u in range(3)}
    assert ledger.used == 600 and cache.reclaimable() == 600
    order = []
    for _ in range(6):
        cache.make_room(make_task(f"e{len(order)}", TaskKind.EXEC, ledger.free + 100), ledger.free + 100)
        order += [key for key, buffer in buffers.items() if buffer.freed and key not in order]
    assert order == [("a", 2), ("a", 1), ("a", 0), ("b", 2), ("b", 1), ("b", 0)]
    assert ledger.used == 0 and cache.evictions == 6 and cache.reclaimable() == 0


def serve_in_turn(cache: WeightCache, ledger: MemoryLedger, models: dict[str, int], requests: list[str]) -> list[int]:
    """Requests of one model each, one at a time, 100 bytes per unit; hits per request."""
    hits = []
    for i, model in enumerate(requests):
        network = f"{model}#{i}"
        cache.requested(network, model)
        before = cache.hits
        for unit in range(models[model]):
            task = load_task(model, unit, 100, network=network)
            cache.make_room(task, 100)
            buffer = cache.take(task.id) or Buffer(100)
            ledger.acquire(task.id, 100, owner=network)
            ledger.finish(task.id, keep=100)
            if not cache.put(model, unit, buffer, task.id):
                ledger.release(task.id)
                buffer.free()
        cache.finished(network)
        hits.append(cache.hits - before)
    assert ledger.used <= ledger.budget
    return hits


def test_models_requested_in_turn_keep_finding_a_fixed_set_of_units():
    # Least-recently-used eviction would evict each time the unit the next request
    # needs first, and nothing would ever hit.
    ledger = MemoryLedger(500)  # 5 units fit, of 6: at least one is read again each round
    cache = WeightCache(ledger, locate=lambda task: task.network.split("#")[0])
    hits = serve_in_turn(cache, ledger, {"a": 2, "b": 2, "c": 2}, list("abc" * 10))
    assert hits[:3] == [0, 0, 0]
    assert min(hits[3:]) >= 1 and sum(hits[3:]) >= 40  # of 54 loads; at most 45 can hit


def test_request_counts_age_so_that_eviction_follows_the_traffic():
    ledger = MemoryLedger(10_000)
    cache = WeightCache(ledger, locate=lambda task: task.network.split("#")[0])
    serve_in_turn(cache, ledger, {"a": 2, "b": 2}, ["a"] * 60 + ["b"] * 40)
    assert cache.hits == 59 * 2 + 39 * 2
    cache.make_room(make_task("e", TaskKind.EXEC, ledger.budget - 200), ledger.budget - 200)
    assert cache.stats()["entries"] == 2 and cache.evictions == 2
    assert cache.make_room(load_task("b", 0, 100, network="b#x"), 100) is None and cache.hits == 59 * 2 + 39 * 2 + 1


def test_units_a_network_in_flight_will_load_are_evicted_last():
    ledger = MemoryLedger(1000)
    cache = WeightCache(ledger, locate=lambda task: task.network.split("#")[0])
    buffers = {(m, u): cached(cache, ledger, m, u, 100) for m in "ab" for u in range(2)}
    cache.requested("a#0", "a")  # a is requested more, but a network of b is in flight:
    cache.requested("a#1", "a")
    cache.finished("a#0")
    cache.finished("a#1")
    cache.requested("b#0", "b")
    cache.make_room(load_task("b", 0, 100, network="b#0"), 100)  # it takes its unit 0 ...
    assert cache.take("b#0/L0") is buffers[("b", 0)] and cache.hits == 1
    ledger.acquire("b#0/L0", 100)
    cache.make_room(make_task("e", TaskKind.EXEC, 800), 800)  # ... so b's unit 1 goes last
    assert [k for k, b in buffers.items() if b.freed] == [("a", 0), ("a", 1)]
    cache.make_room(make_task("e2", TaskKind.EXEC, 900), 900)
    assert buffers[("b", 1)].freed and ledger.used == 100


def test_a_hit_gives_its_bytes_back_to_the_ledger_before_the_load_reserves_them():
    ledger = MemoryLedger(300)
    cache = WeightCache(ledger, locate=lambda task: task.network)
    buffer = cached(cache, ledger, "a", 0, 200)
    cached(cache, ledger, "b", 0, 100)
    assert ledger.free == 0
    cache.make_room(load_task("a", 0, 250), 250)  # needs its own 200 back and 50 more: b goes
    assert cache.take("a/L0") is buffer and cache.take("a/L0") is None
    assert not buffer.freed and ledger.used == 0 and ledger.fits(250)
    assert cache.hits == 1 and cache.evictions == 1


def test_what_the_cache_keeps_and_refuses():
    ledger = MemoryLedger(100)
    cache = WeightCache(ledger, locate=lambda task: task.network)
    cached(cache, ledger, "a", 0, 40)
    ledger.acquire("a/L0 again", 40, owner="a")
    ledger.finish("a/L0 again", keep=40)
    assert not cache.put("a", 0, Buffer(40), "a/L0 again")  # a copy is cached already
    assert ledger.held("a/L0 again") == 40  # still the caller's, freed with its unload
    ledger.release("a/L0 again")
    assert not cache.put("a", 1, Buffer(40), "never reserved")  # its job's memory went back
    cache.clear()
    assert ledger.used == 0
    ledger.acquire("big", 150)  # nothing runs, so the progress rule admits it
    ledger.finish("big", keep=150)
    assert ledger.progress_count == 1
    assert not cache.put("b", 0, Buffer(150), "big")  # over the budget: given back at once
    assert ledger.used == 0 and cache.stats()["entries"] == 0
    ledger.check()


def test_dropping_a_model_and_clearing_free_every_buffer_once():
    ledger = MemoryLedger(1000)
    cache = WeightCache(ledger, locate=lambda task: task.network)
    a = [cached(cache, ledger, "a", u, 100) for u in range(2)]
    b = cached(cache, ledger, "b", 0, 100)
    cache.make_room(load_task("b", 0, 100), 100)  # claimed, never taken
    cache.drop_model("a")
    assert all(x.freed for x in a) and not b.freed and ledger.used == 0
    cache.clear()
    assert b.freed and cache.stats()["entries"] == 0 and cache.evictions == 0


def test_of_the_units_a_network_in_flight_still_needs_the_one_it_reaches_last_goes_first():
    from schedule_helpers import net

    from layerfit.schedule.dispatch import Dispatcher
    from layerfit.schedule.policies import make_policy
    from layerfit.schedule.tasks import Job as ScheduledJob

    ledger = MemoryLedger(100)
    cache = WeightCache(ledger, locate=lambda task: task.network_name)
    dispatcher = Dispatcher(make_policy("masa-fcfs"), ledger, 3, reclaimer=cache)
    dispatcher.submit(ScheduledJob("j", (net("m", [40, 40, 40]),)))
    units = {u: cached(cache, ledger, "m", u, 40) for u in (2, 1)}  # 80 of the 100 bytes
    init = dispatcher.assign(0).task
    cache.requested(init.network, "m")  # as the runtime does when the job is submitted
    dispatcher.complete(init)
    first = dispatcher.assign(0).task  # unit 0 needs 20 bytes more than are free
    assert first.layer == 0 and units[2].freed and not units[1].freed
    second = dispatcher.assign(1).task
    assert (second.layer, cache.hits, cache.evictions) == (1, 1, 1)
    assert dispatcher.assign(2) is None and ledger.used <= ledger.budget


def test_reloading_a_model_while_its_jobs_run_caches_none_of_the_old_units(tmp_path, reads):
    repo = prepare_models(tmp_path / "repo", ["slow", "tiny"])
    x = {n: model_input(n) for n in ("slow", "tiny")}
    expected = {n: reference(n, x[n]) for n in x}
    with Runtime(repo, "1MB", workers=2, cache_weights=True) as rt:
        assert torch.equal(rt.infer("slow", x["slow"]).result(timeout=60), expected["slow"])
        running = [rt.infer("slow", x["slow"]) for _ in range(5)]  # 0.3 s each, two at a time
        rt.load_model("slow")  # a new engine pool while they run on the old one
        assert not running[-1].done()
        for future in running:
            assert torch.equal(future.result(timeout=60), expected["slow"])
        stats = rt.stats()
        assert stats["weight_cache"]["entries"] == 0  # the old pool's units were all freed
        assert stats["in_use_bytes"] == 0 and stats["unit_buffer_bytes"] == 0
        reads.clear()
        for _ in range(2):
            assert torch.equal(rt.infer("slow", x["slow"]).result(timeout=60), expected["slow"])
        assert reads == {"slow": units_of(rt, "slow")}  # read once for the new pool, then hit


def test_release_cached_weights_frees_them_at_once_and_later_jobs_read_again(repo, refs, reads):
    inputs, expected = refs
    with Runtime(repo, "1MB", workers=2) as plain:
        assert plain.release_cached_weights() == 0
    with Runtime(repo, "1MB", workers=2, cache_weights=True) as rt:
        rt.submit(Job(tuple(NAMES), inputs)).result(timeout=60)
        held = rt.stats()["weight_cache"]["bytes"]
        assert held == weight_bytes(rt, NAMES)
        assert rt.release_cached_weights() == held
        stats = rt.stats()
        assert stats["in_use_bytes"] == 0 and stats["unit_buffer_bytes"] == 0 and stats["weight_cache"]["entries"] == 0
        reads.clear()
        out = rt.submit(Job(tuple(NAMES), inputs)).result(timeout=60)
        assert all(torch.equal(out[n], expected[n]) for n in NAMES)
        assert sum(reads.values()) == sum(units_of(rt, n) for n in NAMES)  # read again, cached again
        assert rt.stats()["weight_cache"]["bytes"] == held
