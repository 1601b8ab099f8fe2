"""The GGUF fixtures of ``tests/gguf_models.py`` against transformers itself (#54).

Each architecture is written once with a float type and once with a quantized one (the
pairs together cover every type), and llama with every type. transformers loads each file
(``from_pretrained(folder, gguf_file=name)``, its tokenizer too) and must rebuild exactly
``reference_model``: the seeded model with each weight passed through the file's type and
gguf's numpy dequantizer. That makes the fixtures' inverse transforms (llama's q/k
permutation, Gemma's ``w + 1`` norms, GPT-2's transposes, the split expert stacks) right to
the bit, and the greedy tokens must be the reference's. Float files are also checked against
the seeded model directly, quantized ones for logits close to it.

Then what layerfit's ``prepare gguf:`` must match: transformers' GGUF model is float32 for
every file type here (all go through its legacy loader), and transformers' own torch
dequantizer (used by its new path only) equals gguf's numpy one bit for bit in float32.

No download; no case is skipped. About 1-2 s a case on a 2-core machine.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import gguf_models as G
import numpy as np
import pytest
import torch

pytest.importorskip("gguf", reason="the gguf extra is not installed")
pytest.importorskip("accelerate", reason="transformers loads a GGUF file only with accelerate installed")

# one float type and one quantized type per architecture, every type used at least once;
# qwen2moe's K-quant also exercises llama.cpp's fallback (its 1408-wide expert rows). llama
# is in test_every_type_on_llama, with all of them.
ARCH_TYPES = {
    "mistral": ("BF16", "Q4_1"),
    "qwen2": ("F32", "Q5_0"),
    "qwen2moe": ("BF16", "Q4_K"),
    "qwen3moe": ("F16", "Q2_K"),
    "phi3": ("F32", "Q5_1"),
    "gemma2": ("BF16", "Q8_0"),
    "gemma3": ("F16", "Q3_K"),
    "gpt2": ("F32", "Q6_K"),
    "starcoder2": ("BF16", "Q5_K"),
}
MATRIX = [(arch, kind) for arch, kinds in ARCH_TYPES.items() for kind in kinds]

# least cosine of the logits of a quantized file's model to the seeded model's, per type
# (round-to-nearest quantizing of a random 2-layer model, so loose at 2-3 bits)
LEAST_COSINE = {
    "Q2_K": 0.5, "Q3_K": 0.8, "Q4_0": 0.95, "Q4_1": 0.95, "Q4_K": 0.95, "Q5_0": 0.98, "Q5_1": 0.98,
    "Q5_K": 0.98, "Q6_K": 0.99, "Q8_0": 0.999,
}

PROMPT = "hello world the layer"


@cache
def _seeded(arch: str):
    """The seeded model of ``arch`` (shared: the tests only read it)."""
    return G.tiny_hf_model(arch)


def _load(tmp_path: Path, arch: str, kind: str):
    path = G.write_gguf(arch, tmp_path / f"{arch}-{kind}.gguf", ggml_type=kind, model=_seeded(arch))
    model, tokenizer = G.load_gguf(path)
    return path, model, tokenizer, G.reference_model(arch, kind, model=_seeded(arch))


def _assert_rebuilt(model, reference) -> None:
    """Same names, shapes and values (bit for bit) as ``reference``; float32 throughout."""
    got, want = model.state_dict(), reference.state_dict()
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == torch.float32, name
        assert torch.equal(got[name], tensor), name


def _greedy(model, ids: torch.Tensor) -> list[int]:
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize(("arch", "kind"), MATRIX, ids=[f"{a}-{k}" for a, k in MATRIX])
def test_transformers_loads_each_architecture(tmp_path, arch, kind):
    _, model, tokenizer, reference = _load(tmp_path, arch, kind)
    assert type(model).__name__ == ("LlamaForCausalLM" if arch == "mistral" else type(reference).__name__)
    _assert_rebuilt(model, reference)

    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    assert tokenizer.decode(ids[0], skip_special_tokens=True).strip() == PROMPT
    assert ids.max() < model.config.vocab_size
    assert tokenizer.eos_token_id == model.config.eos_token_id == reference.config.eos_token_id
    tokens = _greedy(model, ids)
    assert len(tokens) == 4
    assert tokens == _greedy(reference, ids)
    # GPT-2's Conv1D weights come out of transformers' loader transposed in place (column
    # major), so its matmuls differ from a contiguous model's in the last bits
    logits = _logits(model, ids)
    torch.testing.assert_close(logits, _logits(reference, ids), rtol=0, atol=1e-4)
    if kind in LEAST_COSINE:
        cosine = torch.nn.functional.cosine_similarity(logits.flatten(), _logits(_seeded(arch), ids).flatten(), dim=0)
        assert cosine > 0.5, cosine


@pytest.mark.parametrize("kind", G.GGML_TYPES)
def test_every_type_on_llama(tmp_path, kind):
    path, model, tokenizer, reference = _load(tmp_path, "llama", kind)
    seeded = _seeded("llama")
    _assert_rebuilt(model, reference)
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    assert _greedy(model, ids) == _greedy(reference, ids)
    if kind in G.FLOAT_TYPES:
        # the seeded weights themselves, through the file's float type where the file stores them so
        half = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[kind]
        loaded = model.state_dict()
        for name, tensor in seeded.state_dict().items():
            want = tensor if tensor.dim() == 1 else tensor.to(half).to(torch.float32)
            assert torch.equal(loaded[name], want), name
    else:
        cosine = torch.nn.functional.cosine_similarity(
            _logits(model, ids).flatten(), _logits(seeded, ids).flatten(), dim=0
        )
        assert cosine > LEAST_COSINE[kind], cosine
    assert path.stat().st_size < 4 << 20


@pytest.mark.parametrize("kind", ["F16", "BF16", "Q8_0"])
def test_transformers_dtype_is_float32_unless_asked(tmp_path, kind):
    """Every architecture here takes transformers' legacy loader, which settles the dtype at
    the default (float32) whatever the file's type; ``dtype=`` casts after dequantizing."""
    from transformers.integrations.gguf import is_gguf_arch_supported

    assert not any(is_gguf_arch_supported(G._ARCHS[arch].gguf_arch) for arch in G.ARCHS)
    path = G.write_gguf("llama", tmp_path / f"llama-{kind}.gguf", ggml_type=kind)
    model, _ = G.load_gguf(path)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    auto, _ = G.load_gguf(path, dtype="auto")
    assert {p.dtype for p in auto.parameters()} == {torch.float32}
    asked, _ = G.load_gguf(path, dtype=torch.bfloat16)
    assert {p.dtype for p in asked.parameters()} == {torch.bfloat16}
    for name, tensor in asked.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name].to(torch.bfloat16)), name


@pytest.mark.parametrize("kind", G.QUANT_TYPES)
def test_transformers_torch_dequantizer_matches_gguf_numpy(kind):
    """transformers' own torch dequantizer (``integrations/gguf/dequant.py``, its new path's)
    against gguf's numpy one (its legacy path's): bit for bit in float32, on quantized and on
    random blocks; it has no Q5_0 / Q5_1 at all. In float16/bfloat16 it computes in that type,
    which is not the float32 values rounded."""
    from transformers.integrations.gguf import dequant

    type_id = int(G.ggml_type_id(kind))
    values = (np.random.default_rng(0).standard_normal((64, 512)) * 0.05).astype(np.float32)
    if kind in ("Q5_0", "Q5_1"):
        assert type_id not in dequant.GGML_BLOCK
        return
    for raw in (G.quantize(values, kind), G.random_blocks(kind, 64, 512, seed=1)):
        want = torch.from_numpy(G.dequantize(raw, kind))
        got = dequant.dequantize(torch.from_numpy(raw.copy()).reshape(-1), type_id, torch.float32)
        assert torch.equal(got.reshape(want.shape), want)


def test_k_quantizer_round_trips():
    """The fixtures' K-quantizer (gguf-py has none) lays its blocks out as gguf dequantizes them."""
    values = (np.random.default_rng(2).standard_normal((8, 512))).astype(np.float32)
    for kind, tolerance in {"Q2_K": 0.6, "Q3_K": 0.35, "Q4_K": 0.12, "Q5_K": 0.06, "Q6_K": 0.03}.items():
        back = G.dequantize(G.quantize(values, kind), kind)
        error = np.abs(back - values).mean() / np.abs(values).mean()
        assert error < tolerance, (kind, error)


def test_write_raw_gguf_writes_what_it_is_given(tmp_path):
    from gguf import GGUFReader

    blocks = G.random_blocks("Q4_K", 2, 256)
    path = G.write_raw_gguf(
        tmp_path / "raw.gguf",
        {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": (blocks, "Q4_K")},
        {"general.architecture": "llama", "llama.block_count": ("uint32", 7), "x.names": ["p", "q"]},
        alignment=64,
    )
    reader = GGUFReader(path)
    assert reader.fields["llama.block_count"].parts[-1][0] == 7
    assert reader.alignment == 64
    tensors = {t.name: t for t in reader.tensors}
    assert tensors["b"].tensor_type.name == "Q4_K"
    assert list(tensors["b"].shape) == [256, 2]  # ggml order
    assert np.array_equal(np.asarray(tensors["b"].data).reshape(blocks.shape), blocks)
    # no general.architecture unless given: a bad file stays bad
    bare = G.write_raw_gguf(tmp_path / "bare.gguf", {}, {"llama.block_count": 1})
    assert "general.architecture" not in GGUFReader(bare).fields


def test_what_transformers_does_not_load_as_written(tmp_path):
    """Three files transformers 5.24 (with gguf 0.19) does not turn into the model they hold."""
    from transformers import AutoModelForCausalLM

    # general.name exactly "mistral": MistralConfig, then gguf-py has no arch "mistral" to map names
    named = G.write_gguf("mistral", tmp_path / "mistral.gguf", ggml_type="Q8_0", name="mistral")
    with pytest.raises(NotImplementedError, match="mistral"):
        G.load_gguf(named)
    # Mixtral (llama + experts): a dense Llama, its MLP not the file's, and no error
    mixtral = G.write_llama_experts_gguf(tmp_path / "mixtral.gguf", ggml_type="F32")
    model, _ = G.load_gguf(mixtral)
    assert type(model).__name__ == "LlamaForCausalLM"
    expert0 = _seeded("llama").model.layers[0].mlp.gate_proj.weight  # expert 0 is the seeded MLP
    assert not torch.equal(model.model.layers[0].mlp.gate_proj.weight, expert0)
    assert model.model.layers[0].self_attn.o_proj.weight.equal(_seeded("llama").model.layers[0].self_attn.o_proj.weight)
    # qwen2moe whose expert widths are not Qwen2MoeConfig's defaults: the widths are not read
    config = G.tiny_config("qwen2moe")
    config.moe_intermediate_size, config.shared_expert_intermediate_size = 256, 512
    torch.manual_seed(0)
    narrow = AutoModelForCausalLM.from_config(config)
    path = G.write_gguf("qwen2moe", tmp_path / "qwen2moe.gguf", ggml_type="Q8_0", model=narrow)
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        G.load_gguf(path)
