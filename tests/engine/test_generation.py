"""``Engine.generate``: Hugging Face's own ``generate``, every forward pass streamed."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import tinymodels
import torch

from layerfit.engine import load
from layerfit.errors import LayerfitError
from layerfit.store import example_input, prepare

MODES = {  # generate's own decoding strategies, each from the same seed on both sides
    "greedy": {"do_sample": False},
    "sampling": {"do_sample": True, "top_k": 20, "temperature": 0.8},
    "beams": {"do_sample": False, "num_beams": 3},
}


@pytest.mark.parametrize("pipeline", ["sequential", "async", "auto"])
@pytest.mark.parametrize("mode", list(MODES))
def test_generate_gives_the_models_tokens_and_scores(lm, pipeline: str, mode: str):
    directory, manifest, model, ids = lm
    options = {**MODES[mode], "max_new_tokens": 6, "output_scores": True, "return_dict_in_generate": True}
    torch.manual_seed(11)
    expected = model.generate(ids, **options)
    budget = manifest.resident_bytes + 2 * manifest.largest_unit_bytes
    if pipeline == "auto":
        budget += (manifest.total_bytes - manifest.resident_bytes) // 2
    elif pipeline == "sequential":
        budget -= manifest.largest_unit_bytes
    with load(directory, pipeline=pipeline, budget=budget) as engine:
        torch.manual_seed(11)
        got = engine.generate(ids, **options)
        assert engine.last_weights_peak <= budget
        assert "forward" not in vars(engine.model)  # the skeleton's own forward is back
        assert torch.equal(engine(ids).logits, model(ids).logits)
    assert torch.equal(got.sequences, expected.sequences)
    assert len(got.scores) == len(expected.scores) == 6
    for g, e in zip(got.scores, expected.scores, strict=True):
        assert torch.equal(g, e)


def test_a_plain_call_from_another_thread_during_generate_is_streamed_once(lm):
    directory, manifest, model, ids = lm
    expected_tokens = model.generate(ids, max_new_tokens=8, do_sample=False)
    expected_logits = model(ids).logits
    generated: list[torch.Tensor] = []
    plain: list[torch.Tensor] = []
    engine = load(directory, pipeline="async", budget=manifest.resident_bytes + 2 * manifest.largest_unit_bytes)

    def generate_repeatedly() -> None:
        for _ in range(5):
            generated.append(engine.generate(ids, max_new_tokens=8, do_sample=False))

    def call_repeatedly() -> None:  # interleaved with generate's passes
        for _ in range(20):
            plain.append(engine(ids).logits)

    threads = [threading.Thread(target=f, daemon=True) for f in (generate_repeatedly, call_repeatedly)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    # On a deadlock the engine is left to the daemon threads (closing it would hang too).
    assert not any(thread.is_alive() for thread in threads), "generate and a plain call deadlocked"
    engine.close()
    assert len(generated) == 5 and len(plain) == 20
    assert all(torch.equal(tokens, expected_tokens) for tokens in generated)
    assert all(torch.equal(p, expected_logits) for p in plain)


def test_planned_activations_and_models_without_generate_are_refused(tmp_path: Path):
    prepare("tinymodels:tiny_cnn", tmp_path / "cnn", input_shape=(1, 3, 8, 8))
    with load(tmp_path / "cnn", pipeline="async") as engine, pytest.raises(LayerfitError, match="has no generate method"):
        engine.generate(torch.zeros(1, 3, 8, 8))
    prepare("tinymodels:iterates", tmp_path / "it", input_shape=(2, 8))
    with load(tmp_path / "it", pipeline="async", activations="planned") as engine:
        with pytest.raises(LayerfitError, match="activations='default'"):
            engine.generate(torch.zeros(2, 8))
        assert "forward" not in vars(engine.model)


def test_any_models_own_generate_runs_each_of_its_calls_through_the_engine(tmp_path: Path):
    manifest = prepare("tinymodels:iterates", tmp_path / "it", input_shape=(2, 8))
    x = example_input((2, 8))
    with torch.no_grad():
        expected = tinymodels.iterates().generate(x, steps=4)
    # The skeleton holds no weights outside the engine's passes, so a call that did not
    # go through the engine would fail or give other numbers.
    with load(tmp_path / "it", pipeline="sequential", budget=manifest.largest_unit_bytes) as engine:
        got = engine.generate(x, steps=4)
    assert len(got) == 5
    assert all(torch.equal(g, e) for g, e in zip(got, expected, strict=True))


def test_a_generate_that_runs_a_layer_outside_forward_is_refused_and_the_engine_still_runs(tmp_path: Path):
    prepare("tinymodels:encodes_outside_forward", tmp_path / "ed", input_shape=(2, 8))
    x = example_input((2, 8))
    with load(tmp_path / "ed", pipeline="async") as engine:
        with pytest.raises(LayerfitError, match="outside its forward pass"):
            engine.generate(x)
        assert "forward" not in vars(engine.model)
        assert torch.equal(engine(x), tinymodels.encodes_outside_forward()(x))


def _counting_passes(engine) -> list[int]:
    """Count the engine's passes (each reads the streamed weights once)."""
    passes: list[int] = []
    run_pass = engine.run_pass

    def counted(*args, **kwargs):
        passes.append(1)
        return run_pass(*args, **kwargs)

    engine.run_pass = counted
    return passes


def _draft(like: torch.nn.Module) -> torch.nn.Module:
    """A one-layer model of ``like``'s family and vocabulary, kept whole in memory."""
    config = like.config.__class__(**{**like.config.to_dict(), "num_hidden_layers": 1, "n_layer": 1})
    torch.manual_seed(2)
    return type(like)(config).eval()


def test_prompt_lookup_verifies_several_tokens_per_weight_stream(lm):
    directory, manifest, model, ids = lm
    prompt = torch.cat([ids[:, :3], ids[:, :3]], dim=1)  # repetitive, like an editing prompt
    options = {"max_new_tokens": 8, "min_new_tokens": 8, "do_sample": False, "use_cache": True}
    expected = model.generate(prompt, prompt_lookup_num_tokens=3, **options)
    with load(directory, pipeline="async", budget=manifest.resident_bytes + 2 * manifest.largest_unit_bytes) as engine:
        passes = _counting_passes(engine)
        got = engine.generate(prompt, prompt_lookup_num_tokens=3, **options)
    assert torch.equal(got, expected)
    assert torch.equal(got, model.generate(prompt, **options))  # greedy's tokens, whatever was proposed
    # One pass per token would be 8: a verification pass streams the weights once for all
    # the tokens it accepts (measured: 4 passes for tiny_gpt2, 7 for tiny_llama).
    assert len(passes) < 8


def test_a_resident_draft_model_proposes_and_the_streamed_model_verifies(lm):
    directory, manifest, model, ids = lm
    draft = _draft(model)
    options = {"max_new_tokens": 8, "min_new_tokens": 8, "do_sample": False, "use_cache": True, "assistant_model": draft}
    expected = model.generate(ids, **options)
    with load(directory, pipeline="async", budget=manifest.resident_bytes + 2 * manifest.largest_unit_bytes) as engine:
        got = engine.generate(ids, **options)
    assert torch.equal(got, expected)


def test_a_batch_of_prompts_reads_each_unit_once_per_step(lm):
    directory, manifest, model, ids = lm
    batch = torch.cat([ids, (ids * 3 + 1) % 100, (ids * 7 + 2) % 100])
    mask = torch.ones_like(batch)
    mask[1, :2] = 0  # a shorter prompt, left-padded
    options = {"attention_mask": mask, "max_new_tokens": 5, "min_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    expected = model.generate(batch, **options)
    with load(directory, pipeline="async", budget=manifest.resident_bytes + 2 * manifest.largest_unit_bytes) as engine:
        passes = _counting_passes(engine)
        got = engine.generate(batch, **options)
    assert torch.equal(got, expected)
    assert len(passes) == 5  # one pass per step for the whole batch
