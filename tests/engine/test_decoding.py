"""Token-by-token decoding with a KV cache streams exactly, whatever the pipeline.

A language model prepared at one prompt length is called again and again: the prompt,
then one token at a time with the cache the previous call returned. Every call is a
whole forward pass through the engine (each streamed unit read again), at a shape the
capture never saw; the logits of every step must equal the model's own, bit for bit.
"""

from __future__ import annotations

from typing import Any

import pytest
import tinymodels
import torch

from layerfit.engine import load
from layerfit.store import example_input, prepare

pytestmark = pytest.mark.compat  # every pipeline, a cached decode: run on each leg of the matrix

PROMPT = 8
STEPS = 6


def greedy(model: Any, ids: torch.Tensor) -> list[torch.Tensor]:
    """Logits of the prompt and of each of ``STEPS`` greedily chosen tokens."""
    out = model(ids, use_cache=True)
    logits = [out.logits]
    for _ in range(STEPS):
        token = out.logits[:, -1:].argmax(-1)
        out = model(token, past_key_values=out.past_key_values, use_cache=True)
        logits.append(out.logits)
    return logits


@pytest.fixture(scope="module", params=["tiny_gpt2", "tiny_llama"])
def prepared(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    name = request.param
    directory = tmp_path_factory.mktemp("decoding") / name
    manifest = prepare(f"tinymodels:{name}", directory, input_shape=(2, PROMPT), input_dtype="int64")
    ids = example_input((2, PROMPT), "int64")
    with torch.no_grad():
        expected = greedy(getattr(tinymodels, name)(), ids)
    return directory, manifest, ids, expected


@pytest.mark.parametrize("pipeline", ["preload", "sequential", "sync", "async", "auto"])
def test_every_step_of_greedy_decoding_gives_the_models_logits(prepared, pipeline: str):
    directory, manifest, ids, expected = prepared
    streamed = manifest.total_bytes - manifest.resident_bytes
    budget = {
        "preload": None,
        "sequential": manifest.resident_bytes + manifest.largest_unit_bytes,
        "auto": manifest.resident_bytes + 2 * manifest.largest_unit_bytes + streamed // 2,
    }.get(pipeline, manifest.resident_bytes + 2 * manifest.largest_unit_bytes)
    with load(directory, pipeline=pipeline, budget=budget) as engine:
        got = greedy(engine, ids)
        if budget is not None:
            assert engine.last_weights_peak <= budget
        if pipeline == "auto":
            assert 0 < len(engine.kept_units) < len(manifest.units)  # some kept, some streamed
    assert [tuple(g.shape) for g in got] == [(2, PROMPT, 100)] + [(2, 1, 100)] * STEPS
    for step, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert torch.equal(g, e), f"{pipeline}: step {step} differs from the model's logits"
