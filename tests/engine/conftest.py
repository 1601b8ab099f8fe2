"""The engine tests' shared model: a tiny CNN prepared once per module, and its output
from plain PyTorch (modules with other needs define their own ``tiny``)."""

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
