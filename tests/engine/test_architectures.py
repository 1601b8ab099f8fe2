"""Common architectures beyond the CNN zoo give exactly ``model(x)`` through every pipeline.

Recurrent kernels (flat LSTM/GRU weights), PyTorch's fused Transformer fast path,
attention that reads weights from its own forward, root-level parameters, weights
computed by parametrizations, embeddings, grouped and transposed convolutions, bfloat16
and mixed dtypes, and layers applied several times per pass: each is captured, packed and
streamed, then compared bit for bit with plain PyTorch, in the engine and in the
memory-aware runtime.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tinymodels
import torch

from layerfit.engine import load
from layerfit.errors import LayerfitError
from layerfit.schedule.runtime.executor import Job, Runtime
from layerfit.store import example_input, prepare, read_manifest

# factory in tinymodels -> (input shape, input dtype)
ARCHITECTURES = {
    "recurrent": ((1, 5, 8), "float32"),
    "transformer_encoder": ((1, 5, 8), "float32"),
    "attention": ((1, 5, 8), "float32"),
    "patch_tokens": ((1, 3, 8, 8), "float32"),
    "weight_normed": ((1, 3, 8, 8), "float32"),
    "conv_zoo": ((1, 3, 8, 8), "float32"),
    "embeddings": ((2, 6), "int64"),
    "bfloat16_mlp": ((2, 16), "bfloat16"),
    "mixed_dtypes": ((2, 16), "float32"),
    "unrolled": ((2, 16), "float32"),
}
# Planned activations need each unit to be one module call or one unbroken run of traced
# nodes (not inside a module fx keeps whole, as nn.TransformerEncoder), and an out= overload
# for every op.
PLANNED_REFUSED = {"transformer_encoder", "weight_normed", "conv_zoo", "mixed_dtypes"}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every architecture prepared once, one sub-folder each (a runtime repository)."""
    root = tmp_path_factory.mktemp("architectures")
    for name, (shape, dtype) in ARCHITECTURES.items():
        prepare(f"tinymodels:{name}", root / name, input_shape=shape, input_dtype=dtype)
    return root


def _input(name: str) -> torch.Tensor:
    shape, dtype = ARCHITECTURES[name]
    return example_input(shape, dtype, seed=3)


def _reference(name: str, x: torch.Tensor) -> torch.Tensor:
    model = getattr(tinymodels, name)().eval()
    with torch.no_grad():
        return model(x)


def _same(y: torch.Tensor, expected: torch.Tensor) -> bool:
    return y.dtype == expected.dtype and torch.equal(y, expected)


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_every_pipeline_gives_exactly_model_outputs(repository: Path, name: str):
    x = _input(name)
    expected = _reference(name, x)
    m = read_manifest(repository / name)
    minimum = m.resident_bytes + m.largest_unit_bytes
    configs = [
        {"pipeline": "preload"},
        {"pipeline": "sequential"},
        {"pipeline": "sync"},
        {"pipeline": "async", "budget": minimum},  # one unit at a time: every read waits
        {"pipeline": "async", "units": "blocks:2", "budget": m.resident_bytes + m.total_bytes},
        {"pipeline": "sync", "units": "merge:16kB"},
    ]
    for config in configs:
        with load(repository / name, **config) as engine:
            for _ in range(2):  # the second call reuses every buffer the first one filled
                assert _same(engine(x), expected), config


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_planned_activations_give_exactly_model_outputs_or_refuse(repository: Path, name: str):
    x = _input(name)
    if name in PLANNED_REFUSED:
        with pytest.raises(LayerfitError, match="planned activations need"):
            load(repository / name, pipeline="sync", activations="planned")
        return
    with load(repository / name, pipeline="sync", activations="planned") as engine:
        assert _same(engine(x), _reference(name, x))
        assert _same(engine(x), _reference(name, x))


def test_a_layer_applied_several_times_stays_resident_and_says_why(repository: Path):
    m = read_manifest(repository / "unrolled")
    assert m.units == () and m.resident_bytes == m.total_bytes
    assert {r.reason for r in m.graph.resident} == {"module runs 3 times per forward pass"}


@pytest.mark.parametrize("units", ["layers", "merge:16kB"])
def test_the_runtime_runs_them_all_in_one_job_exactly(repository: Path, units: str):
    inputs = {name: _input(name) for name in ARCHITECTURES}
    with Runtime(repository, "4MB", workers=2, policy="masa-fair", units=units) as runtime:
        outputs = runtime.submit(Job(tuple(ARCHITECTURES), inputs)).result(timeout=120)
        stats = runtime.stats()
    for name, x in inputs.items():
        assert _same(outputs[name], _reference(name, x)), name
    assert stats["progress_rule_fired"] == 0
