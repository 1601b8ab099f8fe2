"""The engine tests' shared models, prepared once per module: a tiny CNN and its output
from plain PyTorch (modules with other needs define their own ``tiny``), two tiny
language models (``lm``; the CUDA tests define their own) and three tiny mixtures of
experts in transformers' layouts (``moe``)."""

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


MOE_SMALL = {"vocab_size": 96, "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
             "num_key_value_heads": 2, "max_position_embeddings": 64}


def _moe_archs() -> dict:
    import transformers as T

    return {
        "mixtral": lambda: (T.MixtralConfig(**MOE_SMALL, intermediate_size=96, num_local_experts=8,
                                            num_experts_per_tok=2), T.MixtralForCausalLM),
        "qwen2_moe": lambda: (T.Qwen2MoeConfig(**MOE_SMALL, moe_intermediate_size=96, shared_expert_intermediate_size=64,
                                               num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1),
                              T.Qwen2MoeForCausalLM),
        "olmoe": lambda: (T.OlmoeConfig(**MOE_SMALL, intermediate_size=96, num_experts=8, num_experts_per_tok=2),
                          T.OlmoeForCausalLM),
    }


@pytest.fixture(scope="module", params=["mixtral", "qwen2_moe", "olmoe"])
def moe(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """(prepared folder, manifest, transformers' own model) of a tiny Mixtral, Qwen2-MoE
    and OLMoE: 3 layers of 8 experts, 2 per token."""
    pytest.importorskip("transformers")
    config, cls = _moe_archs()[request.param]()
    folder = tmp_path_factory.mktemp("moe") / request.param
    torch.manual_seed(0)
    cls(config).save_pretrained(folder, max_shard_size="200KB")
    manifest = prepare("hf:" + str(folder), folder.parent / f"{request.param}-prepared")
    return folder.parent / f"{request.param}-prepared", manifest, aligned(cls.from_pretrained(folder).eval())


def aligned(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with every tensor copied to memory of its own: ``from_pretrained`` leaves
    them as views of the mapped file at any alignment, and a one-token product takes
    another kernel path at an odd one (its last bit differs: measured here on a decoded
    token, as for the MiniLM pooler in tests/store/test_hf_matrix.py)."""
    with torch.no_grad():
        for module in model.modules():
            for t in [*module._parameters.values(), *module._buffers.values()]:
                if t is not None:
                    t.data = t.data.clone()
    return model
