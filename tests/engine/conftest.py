"""The engine tests' shared models, prepared once per module: a tiny CNN and its output
from plain PyTorch (modules with other needs define their own ``tiny``), and two tiny
language models (``lm``; the CUDA tests define their own)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tinymodels
import torch

from layerfit.store import example_input, prepare


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("m") / "tiny"
    prepare("tinymodels:tiny_cnn", out, input_shape=(1, 3, 16, 16))
    return out


@pytest.fixture(scope="module")
def reference(tiny: Path):
    x = example_input((1, 3, 16, 16))
    with torch.no_grad():
        return x, tinymodels.tiny_cnn().eval()(x)


@pytest.fixture(scope="module", params=["tiny_gpt2", "tiny_llama"])
def lm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(folder, manifest, model, an 8-token prompt) of a tiny GPT-2 and a tiny Llama."""
    name = request.param
    directory = tmp_path_factory.mktemp("lm") / name
    manifest = prepare(f"tinymodels:{name}", directory, input_shape=(1, 8), input_dtype="int64")
    ids = example_input((1, 8), "int64", seed=4) % 100
    return directory, manifest, getattr(tinymodels, name)(), ids
