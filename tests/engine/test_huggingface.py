"""A Hugging Face transformer goes through the hook fallback and streams exactly."""

from __future__ import annotations

from pathlib import Path

import pytest
import tinymodels
import torch

from layerfit.engine import load
from layerfit.store import example_input, prepare


@pytest.mark.parametrize("pipeline", ["preload", "sequential", "async"])
def test_gpt2_streams_bit_identically(tmp_path: Path, pipeline: str):
    out = tmp_path / "gpt2"
    m = prepare("tinymodels:tiny_gpt2", out, input_shape=(1, 8), input_dtype="int64")
    assert m.graph.method == "hooks"
    tied = {t.name: t for t in m.resident.tensors}
    assert set(tied["transformer.wte.weight"].places) == {"transformer.wte.weight", "lm_head.weight"}
    ids = example_input((1, 8), "int64")
    with torch.no_grad():
        expected = tinymodels.tiny_gpt2()(ids).logits
    budget = None if pipeline == "preload" else m.resident_bytes + 2 * m.largest_unit_bytes
    with load(out, pipeline=pipeline, budget=budget) as engine:
        got = engine(ids).logits
    assert torch.equal(got, expected)
