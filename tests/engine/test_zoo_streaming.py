"""Every zoo model, prepared and streamed, gives exactly ``model(x)`` (small inputs)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from layerfit import zoo
from layerfit.engine import flat_outputs, load
from layerfit.store import example_input, prepare


def prepared_with_reference(name: str, tmp_path: Path):
    """Zoo model ``name`` prepared at its small input, with that input and ``model(x)``."""
    entry = zoo.get(name)
    model = zoo.build(name)
    x = example_input(entry.small_input_shape)
    with torch.no_grad():
        expected = flat_outputs(model(x))
    return prepare(name, tmp_path / name, input_shape=entry.small_input_shape, module=model), x, expected


@pytest.mark.parametrize("name", zoo.names())
def test_zoo_model_streams_bit_identically(name: str, tmp_path: Path):
    m, x, expected = prepared_with_reference(name, tmp_path)
    budget = m.resident_bytes + 2 * m.largest_unit_bytes
    # The three-stage run is at its minimum: a read and a device buffer of the largest unit.
    for pipeline, b, stages in (("preload", None, 2), ("async", budget, 2), ("async", budget, 3)):
        with load(tmp_path / name, pipeline=pipeline, budget=b, stages=stages) as engine:
            got = flat_outputs(engine(x))
            if pipeline == "async":
                assert engine.last_weights_peak <= budget
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            assert torch.equal(g, e), f"{name} {pipeline} ({stages} stages): output differs from model(x)"


# A residual CNN, a depthwise CNN, a branched detector and a transformer: the pipelines'
# paths through the engine, on each installed wheel of the compatibility matrix.
MATRIX_MODELS = ["resnet50", "mobilenet_v2", "tiny_yolov3", "vit_s16"]


@pytest.mark.compat
@pytest.mark.core
@pytest.mark.parametrize("name", MATRIX_MODELS)
def test_every_pipeline_streams_bit_identically(name: str, tmp_path: Path):
    m, x, expected = prepared_with_reference(name, tmp_path)
    streamed = m.total_bytes - m.resident_bytes
    minimum = m.resident_bytes + 2 * m.largest_unit_bytes
    runs = [
        ("preload", None, 2),
        ("sequential", m.resident_bytes + m.largest_unit_bytes, 2),
        ("sync", minimum, 2),
        ("async", minimum, 2),
        ("async", minimum, 3),
        ("auto", minimum + streamed // 2, 2),
    ]
    for pipeline, budget, stages in runs:
        with load(tmp_path / name, pipeline=pipeline, budget=budget, stages=stages) as engine:
            got = flat_outputs(engine(x))
            if budget is not None:
                assert engine.last_weights_peak <= budget, f"{name} {pipeline}: over the budget"
        assert len(got) == len(expected)
        for g, e in zip(got, expected, strict=True):
            assert torch.equal(g, e), f"{name} {pipeline} ({stages} stages): output differs from model(x)"
