"""Reading the next pass's first units after a pass ends (``layerfit.engine.read_ahead``)."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from engine_helpers import finish_read_ahead
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerfit.engine import load


def _budgets(manifest) -> dict[str, dict]:
    return {
        "async": {"pipeline": "async", "budget": manifest.resident_bytes + 2 * manifest.largest_unit_bytes},
        "auto": {"pipeline": "auto", "budget": manifest.total_bytes // 2},
    }


def _steps(engine, model, ids: torch.Tensor, steps: int):
    """A greedy decode, one call per token with the cache, each call's logits checked
    against the model's; yields after each call."""
    past = want_past = None
    x = ids
    for step in range(steps):
        with torch.no_grad():
            want = model(x, past_key_values=want_past, use_cache=True)
        finish_read_ahead(engine)  # the caller's work between calls outlasts the read-ahead
        out = engine(x, past_key_values=past, use_cache=True)
        assert torch.equal(out.logits, want.logits), step
        past, want_past = out.past_key_values, want.past_key_values
        x = out.logits[:, -1:].argmax(-1)
        yield step


def _streamed(engine) -> list[int]:
    skip = set(engine.kept_units) | set(engine.rows_units)
    return [i for i in range(len(engine.blocks)) if i not in skip]


@pytest.mark.parametrize("setting", ["async", "auto"])
def test_each_step_adopts_the_first_units_read_after_the_last_and_reads_each_unit_once(lm, setting):
    directory, manifest, model, ids = lm
    options = _budgets(manifest)[setting]
    with load(directory, **options, trace=True, read_ahead=True) as engine:
        streamed = _streamed(engine)
        assert streamed, "the budget streams units"
        for step in _steps(engine, model, ids, 6):
            assert engine.last_weights_peak <= options["budget"]
            reads = [e for e in engine.last_timeline.events if e.stage == "read" and e.unit in streamed]
            # every streamed unit read once for this step: before it began, or during it
            assert sorted(e.unit for e in reads) == streamed, step
            if step >= 2:  # the prompt's pass, then a step expected after it: adopted
                assert engine.last_read_ahead > 0
                assert any(e.start < 0 for e in reads)  # read before the pass began
                assert engine.last_skipped == (0, 0)  # nothing read for nothing


def test_it_starts_while_the_kept_units_after_the_last_streamed_one_run(lm, monkeypatch):
    # Under auto the head is kept: once the pass's last streamed unit gives its place
    # back, the next pass's reads need not wait for the head's kernel and the pass's end.
    directory, manifest, model, ids = lm
    options = _budgets(manifest)["auto"]
    with load(directory, **options, trace=True, read_ahead=True) as engine:
        stream = engine.stream
        last = max(i for i in range(len(engine.blocks)) if i not in engine.kept_units)
        assert last < len(engine.blocks) - 1, "a kept unit runs after the last streamed one"
        started_in_pass: list[bool] = []
        start = stream._start_read_ahead

        def recorded(run):
            started_in_pass.append(stream.run is run)
            start(run)

        monkeypatch.setattr(stream, "_start_read_ahead", recorded)
        for step in _steps(engine, model, ids, 5):
            assert engine.last_weights_peak <= options["budget"]
            if step >= 2:
                assert engine.last_read_ahead > 0
                assert engine.last_skipped == (0, 0)
        assert len(started_in_pass) == 5 and all(started_in_pass)  # once a pass, during it


def test_it_is_on_by_default(lm):
    directory, manifest, model, ids = lm
    options = _budgets(manifest)["async"]
    with load(directory, **options) as engine:
        adopted = [engine.last_read_ahead for _ in _steps(engine, model, ids, 3)]
        assert adopted[0] == 0 and all(a > 0 for a in adopted[1:])  # nothing before the first pass
        assert engine.last_weights_peak <= options["budget"]


def test_without_read_ahead_every_read_is_the_passs_own(lm):
    directory, manifest, model, ids = lm
    with load(directory, **_budgets(manifest)["async"], trace=True, read_ahead=False) as engine:
        for _ in _steps(engine, model, ids, 4):
            assert engine.last_read_ahead == 0
            assert all(e.start >= 0 for e in engine.last_timeline.events)


def test_a_prompt_after_decoding_gives_back_what_was_read_after_the_table(lm):
    """A new prompt looks up more rows than a decoding step reserved room for: what was
    read ahead after the table is given back and read again in its turn; the output is
    the model's, and the next such pass reserves as much."""
    directory, manifest, model, ids = lm
    options = _budgets(manifest)["async"]
    with load(directory, **options, read_ahead=True) as engine:
        for _ in _steps(engine, model, ids, 4):
            pass
        if directory.name == "tiny_llama":  # 64 ids spread over the table's 100 rows
            prompt = (torch.arange(64).view(1, -1) * 3 + 1) % 100
        else:  # GPT-2's table read by rows is its 16 positions: a prompt of all fits the room
            prompt = torch.arange(16).view(1, -1) % 100
        finish_read_ahead(engine)
        assert torch.equal(engine(prompt).logits, model(prompt).logits)
        assert engine.last_weights_peak <= options["budget"]
        assert engine.last_read_ahead > 0
        if directory.name == "tiny_llama":
            assert engine.last_skipped[1] > 0  # read ahead after the table, given back
        else:
            assert engine.last_skipped == (0, 0)
        finish_read_ahead(engine)
        assert torch.equal(engine(prompt).logits, model(prompt).logits)
        assert engine.last_skipped == (0, 0) and engine.last_read_ahead > 0


def test_reconfiguring_or_closing_while_it_reads_waits_for_its_read(lm, monkeypatch):
    directory, manifest, model, ids = lm
    options = _budgets(manifest)["async"]
    with load(directory, **options, read_ahead=True) as engine:
        read_units = engine.units.read_units

        def slow(first, stop, view):
            if threading.current_thread().name == "layerfit-read-ahead":
                time.sleep(0.05)
            return read_units(first, stop, view)

        monkeypatch.setattr(engine.units, "read_units", slow)
        assert torch.equal(engine(ids).logits, model(ids).logits)
        engine.reconfigure(budget=options["budget"] + 4096, pipeline="async")  # while it reads
        assert torch.equal(engine(ids).logits, model(ids).logits)
        assert torch.equal(engine(ids).logits, model(ids).logits)
    assert "layerfit-read-ahead" not in {t.name for t in threading.enumerate()}
    with pytest.raises(Exception, match="closed"):
        engine(ids)


def test_a_failed_read_ahead_is_read_again_by_the_pass(lm, monkeypatch):
    directory, manifest, model, ids = lm
    with load(directory, **_budgets(manifest)["async"], read_ahead=True) as engine:
        read_units = engine.units.read_units
        failed = []

        def flaky(first, stop, view):
            if threading.current_thread().name == "layerfit-read-ahead" and not failed:
                failed.append(first)
                raise OSError(5, "Input/output error")
            return read_units(first, stop, view)

        monkeypatch.setattr(engine.units, "read_units", flaky)
        for _ in range(3):
            assert torch.equal(engine(ids).logits, model(ids).logits)
        assert failed


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    setting=st.sampled_from(["async", "auto"]),
    coalesce=st.sampled_from([0, 1 << 20]),
    pause=st.booleans(),
)
def test_any_calls_give_the_models_output_within_the_budget(lm, lengths, setting, coalesce, pause):
    """Calls of any length, with or without a pause between them (the read-ahead ends, or
    is stopped under way): each output is the model's, within the budget."""
    directory, manifest, model, ids = lm
    options = _budgets(manifest)[setting]
    with load(directory, **options, coalesce=coalesce, read_ahead=True) as engine:
        for n in lengths:
            n = min(n, getattr(model.config, "n_positions", 64))
            x = (torch.arange(n).view(1, -1) * 7 + n) % 100
            assert torch.equal(engine(x).logits, model(x).logits)
            assert engine.last_weights_peak <= options["budget"]
            if pause:
                time.sleep(0.01)
