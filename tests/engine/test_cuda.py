"""The three-stage CUDA path (pinned read ring, copy stream, device ring; kept units in
device memory under ``auto``) against the model itself on the same GPU.

Every test here needs a CUDA device and skips without one (CI has none). Outputs are
compared bit for bit with the model run on CUDA under deterministic settings: the engine
runs the model's own kernels on the same device, so only the weights' home differs.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import tinymodels
import torch

from layerfit import zoo
from layerfit.engine import load
from layerfit.errors import LayerfitError
from layerfit.store import example_input, prepare

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

PIPELINES = ["preload", "sequential", "sync", "async", "auto"]


@pytest.fixture(autouse=True)
def deterministic():
    """cuDNN's fixed algorithms, so that the model and the engine pick the same kernels."""
    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved


@pytest.fixture(scope="module")
def resnet(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("cuda") / "resnet50"
    manifest = prepare("resnet50", directory, input_shape=(1, 3, 64, 64))
    x = example_input((1, 3, 64, 64), "float32", manifest.seed).cuda()
    with torch.no_grad():
        y = zoo.build("resnet50", seed=manifest.seed).cuda()(x)
    return directory, manifest, x, y


def _budget(manifest, pipeline: str) -> int | None:
    """Half the streamed weights for ``auto``, two of the largest unit for ``async``, and
    the pipeline's own size otherwise (sync's group needs more than two units)."""
    if pipeline in ("preload", "sequential", "sync"):
        return None
    if pipeline == "auto":
        return manifest.resident_bytes + (manifest.total_bytes - manifest.resident_bytes) // 2
    return manifest.resident_bytes + 2 * manifest.largest_unit_bytes


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_every_pipeline_on_cuda_gives_the_models_output_within_budget(resnet, pipeline: str):
    directory, manifest, x, y = resnet
    budget = _budget(manifest, pipeline)
    threads = threading.active_count()
    with load(directory, pipeline=pipeline, budget=budget, device="cuda", trace=True) as engine:
        for _ in range(2):
            with torch.no_grad():
                out = engine(x)
            assert out.is_cuda and torch.equal(out, y)
        if pipeline != "preload":
            assert engine.last_weights_peak <= (budget or engine.memory.weight_bytes)
            assert engine.memory.device_buffer_bytes > 0 and engine.memory.buffer_bytes > 0
            assert {e.stage for e in engine.last_timeline.events} >= {"read", "copy", "kernel"}
        if pipeline == "auto":
            assert engine.kept_units  # half the weights stay in device memory
            copied = {e.unit for e in engine.last_timeline.events if e.stage == "copy"}
            assert not copied & set(engine.kept_units)
    assert threading.active_count() == threads  # no reader or copy thread left behind


def test_reconfigured_on_cuda_still_gives_the_models_output(resnet):
    directory, manifest, x, y = resnet
    with load(directory, pipeline="async", device="cuda") as engine:
        for pipeline in ("auto", "sequential", "async"):
            budget = _budget(manifest, pipeline)
            engine.reconfigure(pipeline=pipeline, budget=budget)
            with torch.no_grad():
                assert torch.equal(engine(x), y)
            assert engine.last_weights_peak <= (budget or engine.memory.weight_bytes)


def test_a_failed_copy_names_the_unit_and_the_engine_recovers(resnet, monkeypatch):
    from layerfit.engine.device import CudaDevice

    directory, manifest, x, y = resnet
    real, armed = CudaDevice.copy, {"on": True}

    def copy(self, dst, src):
        if armed["on"]:
            armed["on"] = False
            raise RuntimeError("injected copy failure")
        return real(self, dst, src)

    monkeypatch.setattr(CudaDevice, "copy", copy)
    with load(directory, pipeline="async", device="cuda") as engine:
        with pytest.raises(LayerfitError, match="copying unit"), torch.no_grad():
            engine(x)
        with torch.no_grad():
            assert torch.equal(engine(x), y)


@pytest.fixture(scope="module", params=["tiny_gpt2", "tiny_llama"])
def lm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    name = request.param
    directory = tmp_path_factory.mktemp("cuda-lm") / name
    manifest = prepare(f"tinymodels:{name}", directory, input_shape=(1, 8), input_dtype="int64")
    ids = (example_input((1, 8), "int64", seed=4) % 100).cuda()
    return directory, manifest, getattr(tinymodels, name)().cuda(), ids


@pytest.mark.parametrize("pipeline", ["async", "auto"])
def test_generate_on_cuda_gives_the_models_tokens_and_scores(lm, pipeline: str):
    directory, manifest, model, ids = lm
    options = {"do_sample": False, "max_new_tokens": 6, "output_scores": True, "return_dict_in_generate": True}
    expected = model.generate(ids, **options)
    budget = _budget(manifest, pipeline)
    with load(directory, pipeline=pipeline, budget=budget, device="cuda") as engine:
        if directory.name == "tiny_llama":  # its untied embedding is read by rows, looked up on the host
            assert engine.rows_units
        got = engine.generate(ids, **options)
        assert engine.last_weights_peak <= budget
        with torch.no_grad():
            assert torch.equal(engine(ids).logits, model(ids).logits)
    assert torch.equal(got.sequences, expected.sequences)
    for g, e in zip(got.scores, expected.scores, strict=True):
        assert torch.equal(g, e)


def test_a_mixture_of_experts_on_cuda_gives_transformers_tokens(tmp_path: Path):
    transformers = pytest.importorskip("transformers")
    config = transformers.MixtralConfig(
        vocab_size=96, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64, intermediate_size=96, num_local_experts=8, num_experts_per_tok=2,
    )
    torch.manual_seed(0)
    transformers.MixtralForCausalLM(config).save_pretrained(tmp_path / "hf")
    manifest = prepare("hf:" + str(tmp_path / "hf"), tmp_path / "prepared")
    model = transformers.MixtralForCausalLM.from_pretrained(tmp_path / "hf").eval().cuda()
    ids = torch.tensor([[3, 8, 13, 21, 34, 55]], device="cuda")
    expected = model.generate(ids, do_sample=False, max_new_tokens=8)
    budget = manifest.resident_bytes + 2 * manifest.largest_unit_bytes
    with load(tmp_path / "prepared", budget=budget, device="cuda", trace=True) as engine:
        got = engine.generate(ids, do_sample=False, max_new_tokens=8)
        assert engine.last_weights_peak <= budget
    assert torch.equal(got, expected)
