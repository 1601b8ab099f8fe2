"""Experts read ahead: the next MoE layer's experts are guessed from the input of the
router before it and read on a thread of their own into the expert cache; whatever the
guess, the tokens are transformers' own, the budget holds and no thread is left."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layerfit.engine import load
from layerfit.engine.expert_cache import ExpertCache
from layerfit.engine.expert_prefetch import ExpertPrefetch, Guess
from layerfit.engine.experts import experts_segment
from layerfit.errors import ReadError
from layerfit.store.manifest import ALIGN
from layerfit.store.reader import SegmentReader

pytest.importorskip("transformers")

BUDGET = "60%"  # room for the experts a token reads ahead beside the ones kept


def _generate(engine, reference, ids, tokens=8):
    kwargs = {"max_new_tokens": tokens, "min_new_tokens": tokens, "do_sample": False}
    return engine.generate(ids, **kwargs), reference.generate(ids, **kwargs)


def test_the_next_layers_guessed_experts_are_read_ahead_and_the_tokens_are_the_models(moe):
    directory, manifest, reference = moe
    ids = torch.tensor([[3, 8, 13, 21]])
    with load(directory, budget=BUDGET, trace=True) as engine:
        stats = engine.expert_cache
        assert stats["ahead_slots"] == 2 and stats["slots"] > 2  # a token's two choices, and room to keep
        got, expected = _generate(engine, reference, ids)
        assert torch.equal(got, expected)
        assert engine.last_weights_peak <= manifest.total_bytes * 0.6
        stats = engine.expert_cache
        assert stats["read_ahead"] > 0 and 0 < stats["read_ahead_hits"] <= stats["read_ahead"]
        # A decoded token's reads, read ahead or not, are in its timeline: never more than
        # every routed layer's two experts beside what the cache held.
        with torch.no_grad():
            engine(ids[:, -1:])
        per_expert = {u.name: u.nbytes // 8 for u in manifest.units if experts_segment(u)}
        reads = [e for e in engine.last_timeline.events if e.stage == "read" and e.name in per_expert]
        assert sum(e.nbytes for e in reads) <= sum(4 * n + 8 * ALIGN for n in per_expert.values())
    with load(directory, budget=BUDGET, expert_prefetch=False) as engine:
        got, _ = _generate(engine, reference, ids)
        assert torch.equal(got, expected)
        assert engine.expert_cache["ahead_slots"] == 0 and engine.expert_cache["read_ahead"] == 0


def test_each_routed_layer_but_the_first_is_guessed_from_the_router_before_it(moe):
    directory, manifest, _ = moe
    with load(directory, budget=BUDGET) as engine:
        routed = [i for i in engine.rows_units if experts_segment(engine.blocks[i].segments[0])]
        guesses = {guess.unit: (router, guess) for router, guess in engine._experts.guesses}
        layers = [u.name for u in manifest.units if experts_segment(u)]
        first = min(i for i in routed if engine.blocks[i].name == layers[0]) if any(
            engine.blocks[i].name == layers[0] for i in routed) else None
        assert set(guesses) == set(routed) - {first}
        for unit, (router, guess) in guesses.items():
            name = engine.blocks[unit].name
            before = layers[layers.index(name) - 1]
            assert router is engine.model.get_submodule(before.rpartition(".")[0]).gate  # the router before it
            assert guess.router is engine.model.get_submodule(name.rpartition(".")[0]).gate
            assert guess.top_k == 2
            assert guess.hold == any(engine.blocks[i].name == before for i in routed)


def test_a_read_ahead_that_fails_is_read_by_its_layer(moe, monkeypatch):
    directory, _, reference = moe
    read_range = SegmentReader.read_range

    def failing(self, offset, nbytes, into, what):
        if "read ahead" in what:
            raise ReadError(f"reading {what} failed: injected")
        return read_range(self, offset, nbytes, into, what)

    monkeypatch.setattr(SegmentReader, "read_range", failing)
    ids = torch.tensor([[5, 9, 2, 7]])
    with load(directory, budget=BUDGET) as engine:
        got, expected = _generate(engine, reference, ids)
        assert torch.equal(got, expected)
        assert engine.expert_cache["read_ahead"] == 0 and engine._experts.prefetch.guesses > 0


def test_no_thread_is_left_after_close_or_reconfigure(moe):
    directory, _, reference = moe
    ids = torch.tensor([[4, 1, 6]])

    def ahead_threads():
        return [t for t in threading.enumerate() if t.name == "layerfit-experts-ahead"]

    before = len(ahead_threads())
    with load(directory, budget=BUDGET) as engine:
        got, expected = _generate(engine, reference, ids, tokens=4)
        assert torch.equal(got, expected) and len(ahead_threads()) == before + 1
        engine.reconfigure(budget="65%")
        assert len(ahead_threads()) == before  # the old configuration's stopped; the new one starts on use
        got, _ = _generate(engine, reference, ids, tokens=4)
        assert torch.equal(got, expected) and engine.last_weights_peak <= engine.memory.weight_bytes
    assert len(ahead_threads()) == before


class _GatedReader:
    """A reader whose reads wait for ``gate``: a read ahead held under way."""

    def __init__(self, data: bytes) -> None:
        self.data, self.gate, self.started = data, threading.Event(), threading.Event()

    def read_range(self, offset: int, nbytes: int, into: memoryview, what: str) -> None:
        self.started.set()
        assert self.gate.wait(10)
        into[:nbytes] = self.data[offset : offset + nbytes]


class _Table:
    """A unit of 4 experts, one page each, as :class:`ExpertTable` lays them out."""

    class segment:  # noqa: N801 - stands for a manifest segment
        index, offset = 0, 0

    name = "m.experts"

    def ranges(self, expert: int):
        return ((expert * ALIGN, (expert + 1) * ALIGN, 0),)

    def slices(self, expert: int):
        return ((expert * ALIGN, ALIGN, 0),)


def test_a_layer_waits_for_its_expert_read_ahead_then_copies_it():
    data = bytes((e * 37 + k) % 251 for e in range(4) for k in range(ALIGN))
    reader, table = _GatedReader(data), _Table()
    cache = ExpertCache(3 * ALIGN, ALIGN, ahead_slots=2)
    records = []
    prefetch = ExpertPrefetch(cache, reader, {0: table}, lambda *r: records.append(r))
    router = torch.nn.Linear(8, 4, bias=False)
    with torch.no_grad():
        router.weight.copy_(torch.eye(4, 8))
    hidden = torch.zeros(1, 8)
    hidden[0, 2], hidden[0, 1] = 3.0, 2.0  # guesses expert 2, then 1
    router.top_k = 2
    prefetch.guess(Guess(0, router, 2, hold=False), hidden)
    assert reader.started.wait(10)
    out = bytearray(4 * ALIGN)
    loaded = []
    waiter = threading.Thread(target=lambda: loaded.append(cache.load(0, 2, memoryview(out), table.slices(2))))
    waiter.start()
    time.sleep(0.05)
    assert waiter.is_alive()  # it waits for the read under way, not spinning past it
    reader.gate.set()
    waiter.join(10)
    assert loaded == [True] and out[2 * ALIGN : 3 * ALIGN] == data[2 * ALIGN : 3 * ALIGN]
    cache.settle(0)  # 2 was chosen: kept; 1 was not: its slot is freed, counted as wasted
    prefetch.end_pass()
    assert cache.cached(0) == {2} and cache.stats["read_ahead_hits"] == 1
    assert cache.stats["read_ahead"] == 2 and cache.stats["read_ahead_wasted_bytes"] == ALIGN
    assert [r[0] for r in records] == [0, 0] and all(r[3] == ALIGN for r in records)
    prefetch.close()
    cache.close()


ops = st.lists(
    st.tuples(st.sampled_from(["guess", "run", "end"]), st.integers(0, 2), st.lists(st.integers(0, 5), max_size=3),
              st.booleans()),
    max_size=40,
)


@settings(max_examples=80, deadline=None)
@given(slots=st.integers(1, 5), ahead=st.integers(0, 3), steps=ops)
def test_the_cache_never_shares_a_slot_and_hands_back_each_experts_own_bytes(slots, ahead, steps):
    """Any sequence of guesses read ahead (some failing), layers running (their lookups,
    a store on each miss, then settling) and passes ending: kept and read-ahead experts
    never share a slot, stay within their numbers, and every hit copies that expert's bytes."""
    def expert_bytes(unit: int, expert: int) -> bytes:
        return bytes([unit * 16 + expert + 1]) * 64

    cache = ExpertCache(slots * ALIGN, ALIGN, ahead)
    slices = ((0, 64, 100),)
    for op, unit, experts, flag in steps:
        if op == "guess":  # what the read-ahead thread does, one expert at a time
            cache.expect(unit)
            for e in experts:
                at = cache.reserve(unit, e)
                if at is not None:
                    if flag:
                        cache.view[at + 100 : at + 164] = expert_bytes(unit, e)
                    cache.finish(unit, e, ALIGN if flag else None)
        elif op == "run":  # a routed layer: look each chosen expert up, read and store a miss
            cache.begin(unit)
            for e in dict.fromkeys(experts):
                out = bytearray(64)
                if cache.load(unit, e, memoryview(out), slices):
                    assert bytes(out) == expert_bytes(unit, e)
                else:
                    cache.store(unit, e, memoryview(bytearray(expert_bytes(unit, e))), slices)
            cache.settle(unit)
        else:
            cache.settle_all()
        held = list(cache._entries.values()) + [a.slot for a in cache._ahead.values()]
        assert len(held) == len(set(held)) and not set(held) & set(cache._free)
        assert len(held) + len(cache._free) == cache.slots
        assert len(cache._entries) <= cache.slots - cache.ahead_slots and len(cache._ahead) <= cache.ahead_slots
    cache.settle_all()
    assert not cache._ahead
    cache.close()


def test_inspect_shows_how_the_engine_cuts_the_expert_cache(moe):
    import json

    from typer.testing import CliRunner

    from layerfit.cli import app

    directory, _, _ = moe
    with load(directory, budget=BUDGET) as engine:
        stats = engine.expert_cache
    runner = CliRunner()
    shown = json.loads(runner.invoke(app, ["inspect", str(directory), "--budget", BUDGET, "--json"]).output)["auto_plan"]
    assert (shown["expert_slot_bytes"], shown["expert_slots"], shown["expert_read_ahead_slots"]) == (
        stats["slot_bytes"], stats["slots"], stats["ahead_slots"])
    text = runner.invoke(app, ["inspect", str(directory), "--budget", BUDGET]).output
    assert f"{stats['slots']} experts of" in text and f"{stats['ahead_slots']} read ahead for the next MoE layer" in text
