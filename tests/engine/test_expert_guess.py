"""The next MoE layer's experts guessed a layer early and read ahead by the reader into a
compact place: whatever the guess, the tokens are transformers' own, the budget holds,
and a read that fails is reported and recovered from."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from layerfit.engine import load
from layerfit.engine.experts import experts_segment
from layerfit.errors import ReadError
from layerfit.store.manifest import ALIGN
from layerfit.store.reader import SegmentReader

pytest.importorskip("transformers")

BUDGET = "60%"


@pytest.fixture
def reader_gets_there(monkeypatch):
    """On these tiny models a layer computes in microseconds, so whether the reader takes
    the next layer's place before that layer runs is a race the executing thread often
    wins (then the layer reads its experts itself: the same tokens). Tests that count
    reads made on a guess give the reader 20 ms after each MoE layer to get there."""
    from layerfit.engine.hooks import ExpertsHook

    call = ExpertsHook.__call__

    def slow(self, module, args, kwargs):
        out = call(self, module, args, kwargs)
        time.sleep(0.02)
        return out

    monkeypatch.setattr(ExpertsHook, "__call__", slow)


def _generate(engine, reference, ids, tokens=8):
    kwargs = {"max_new_tokens": tokens, "min_new_tokens": tokens, "do_sample": False}
    return engine.generate(ids, **kwargs), reference.generate(ids, **kwargs)


def _routed(engine) -> list[int]:
    return [i for i in engine.rows_units if experts_segment(engine.blocks[i].segments[0])]


@pytest.mark.parametrize("budget", ["60%", "35%"])
def test_guessed_experts_are_read_ahead_and_the_tokens_are_the_models(moe, budget, reader_gets_there):
    directory, manifest, reference = moe
    ids = torch.tensor([[3, 8, 13, 21]])
    share = float(budget.rstrip("%")) / 100
    with load(directory, budget=budget, trace=True) as engine:
        routed = _routed(engine)
        assert len(routed) >= 2 and set(routed) <= set(engine.stream.compact_units)
        got, expected = _generate(engine, reference, ids)
        assert torch.equal(got, expected)
        assert engine.last_weights_peak <= manifest.total_bytes * share
        guesses = engine.expert_guesses
        assert guesses["units"] == len(routed) - 1  # all but the first MoE layer
        assert guesses["read_ahead"] > 0 and 0 < guesses["chosen"] <= guesses["read_ahead"]
        # A decoded token reads, ahead or when its layer runs, a few experts of each routed
        # layer, never a whole unit of them.
        with torch.no_grad():
            engine(ids[:, -1:])
        units = {u.name: u for u in manifest.units if experts_segment(u)}
        for name in {engine.blocks[i].name for i in routed}:
            read = sum(e.nbytes for e in engine.last_timeline.events if e.stage == "read" and e.name == name)
            assert read <= 4 * units[name].nbytes // 8 + 8 * ALIGN < units[name].nbytes
    with load(directory, budget=budget, expert_prefetch=False) as engine:
        got, _ = _generate(engine, reference, ids)
        assert torch.equal(got, expected)
        assert engine.expert_guesses == {"units": 0, "read_ahead": 0, "chosen": 0}


def test_each_routed_layer_but_the_first_is_guessed_from_the_router_before_it(moe):
    directory, manifest, _ = moe
    with load(directory, budget=BUDGET) as engine:
        routed = _routed(engine)
        guesses = {guess.unit: (router, guess) for router, guess in engine._experts.guesses}
        layers = [u.name for u in manifest.units if experts_segment(u)]
        assert set(guesses) == set(routed) - {i for i in routed if engine.blocks[i].name == layers[0]}
        by_name = {engine.blocks[i].name: i for i in routed}
        for unit, (router, guess) in guesses.items():
            name = engine.blocks[unit].name
            before = layers[layers.index(name) - 1]
            assert router is engine.model.get_submodule(before.rpartition(".")[0]).gate  # the router before it
            assert guess.router is engine.model.get_submodule(name.rpartition(".")[0]).gate
            assert guess.top_k == 2 and guess.hold == by_name.get(before)
            assert not guess.router.weight.is_meta  # kept in memory, in the budget
        kept_routers = {i for i in engine.kept_units if engine.blocks[i].name.endswith(".gate")}
        assert {engine.blocks[u].name.rpartition(".")[0] + ".gate" for u in guesses} <= {
            engine.blocks[i].name for i in kept_routers}


def test_a_guessed_read_that_fails_is_reported_and_the_next_pass_runs(moe, monkeypatch, reader_gets_there):
    directory, _, reference = moe
    read_range = SegmentReader.read_range
    failures = [1]

    def failing(self, offset, nbytes, into, what):
        if "guessed" in what and failures:
            failures.pop()
            raise ReadError(f"reading {what} failed: injected")
        return read_range(self, offset, nbytes, into, what)

    ids = torch.tensor([[5, 9, 2, 7]])
    with load(directory, budget=BUDGET) as engine, torch.no_grad():
        out = engine(ids)  # verifies every unit: no guess yet
        past = out.past_key_values
        token = out.logits[:, -1:].argmax(-1)
        monkeypatch.setattr(SegmentReader, "read_range", failing)
        with pytest.raises(ReadError, match="guessed experts"):
            engine(token, past_key_values=past, use_cache=True)
        assert not failures
        got, expected = _generate(engine, reference, ids, tokens=4)  # the engine goes on
        assert torch.equal(got, expected)
    assert not [t for t in threading.enumerate() if t.name.startswith("layerfit-")]


def test_inspect_shows_the_cache_and_the_guessed_layers_the_engine_plans(moe):
    import json

    from typer.testing import CliRunner

    from layerfit.cli import app

    directory, _, _ = moe
    with load(directory, budget=BUDGET) as engine:
        cache, guesses = engine.expert_cache, engine.expert_guesses
        kept = engine.kept_units
    runner = CliRunner()
    shown = json.loads(runner.invoke(app, ["inspect", str(directory), "--budget", BUDGET, "--json"]).output)["auto_plan"]
    assert (shown["expert_slot_bytes"], shown["expert_slots"], shown["experts_guessed_units"]) == (
        cache["slot_bytes"], cache["slots"], guesses["units"])
    assert tuple(shown["kept_units"]) == kept  # the routers that guess are kept in the plan too
    text = runner.invoke(app, ["inspect", str(directory), "--budget", BUDGET]).output
    assert f"the experts of {guesses['units']} MoE layers guessed a layer early" in text


def test_a_rank_of_guesses_is_read_ahead_while_three_in_four_of_them_are_right():
    from layerfit.engine.expert_guess import RIGHT_ENOUGH, SCORED_FIRST, Guess, GuessCount, guess

    router = torch.nn.Linear(4, 6, bias=False)
    with torch.no_grad():
        router.weight.copy_(torch.eye(6, 4))
    hidden = torch.tensor([[0.0, 3.0, 2.0, 0.0], [0.0, 0.0, 1.0, 5.0]])  # token 0: 1 then 2; token 1: 3 then 2
    guessed = guess(Guess(0, router, 2, None), hidden)
    assert guessed.experts == (1, 3, 2) and guessed.ranks == (0, 0, 1) and guessed.tokens == 2
    count = GuessCount()
    assert count.worth_reading(0) and count.worth_reading(5)  # nothing scored yet: read
    for _ in range(SCORED_FIRST):
        count.score(guessed, [1, 3, 4])  # the first choices right, the second wrong
    assert count.worth_reading(0) and not count.worth_reading(1)
    right = int(RIGHT_ENOUGH * 4)
    for k in range(4 * SCORED_FIRST):  # the second rank right three times in four from now on
        count.score(guessed, [1, 3, 2] if k % 4 < right else [1, 3])
    assert count.right[1] / count.scored[1] < RIGHT_ENOUGH and not count.worth_reading(1)
    for _ in range(8 * SCORED_FIRST):
        count.score(guessed, [1, 3, 2])
    assert count.worth_reading(1)
