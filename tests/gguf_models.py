"""Tiny GGUF files written in the test, for each architecture and tensor type (no download).

``write_gguf(arch, path, ggml_type=...)`` writes the seeded Hugging Face model of
``tiny_hf_model(arch)`` the way llama.cpp's converter and quantizer would: its state dict
renamed with gguf's own tensor name map, each tensor given the *inverse* of what
transformers' GGUF loader does to it (llama's q/k row permutation, Gemma's norms stored as
``w + 1``, GPT-2's Conv1D weights transposed, MoE experts split into gate/up/down stacks),
the big 2-D (and 3-D expert) weights quantized to ``ggml_type`` (norms, biases and router
gates stay F32), the config as the metadata keys transformers' ``GGUF_CONFIG_MAPPING``
reads, and a small tokenizer (sentencepiece ``llama`` or byte-level ``gpt2``) in the
metadata. ``AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)`` and
``AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)`` load it.

``reference_model(arch, ggml_type)`` is the seeded model with every weight passed through
what the file holds (quantized, then dequantized by gguf's numpy dequantizer, then the
loader's transform): the model transformers' legacy GGUF loader should rebuild *exactly*.
``write_raw_gguf(path, tensors, metadata)`` writes whatever it is given, for bad-input tests.

Every architecture here goes through transformers' legacy loader (``load_gguf_checkpoint``,
gguf's numpy ``dequantize``); its new path (``integrations/gguf``) takes only qwen35,
qwen35moe and lfm2.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

ARCHS = (
    "llama", "mistral", "qwen2", "qwen2moe", "qwen3moe", "phi3", "gemma2", "gemma3", "gpt2", "starcoder2",
)
"""The architectures ``write_gguf`` writes. qwen3moe is the Mixtral-style one (routed experts
only, no shared expert): transformers' GGUF loader has no Mixtral (llama.cpp writes Mixtral as
``llama`` with ``ffn_*_exps`` tensors, which transformers reads as a dense Llama and drops)."""

FLOAT_TYPES = ("F32", "F16", "BF16")
QUANT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
GGML_TYPES = FLOAT_TYPES + QUANT_TYPES

# llama.cpp's fallback when a row is not a whole number of 256-wide K-blocks
# (llama-quant.cpp: Q2_K/Q3_K -> IQ4_NL, which gguf-py cannot quantize, so Q4_0 here).
_K_FALLBACK = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}

HIDDEN = 256  # one K-block per row: every 2-D weight's row length is a multiple of 256

# ---------------------------------------------------------------------------------------------
# the seeded Hugging Face models


@dataclass(frozen=True)
class _Arch:
    gguf_arch: str  # general.architecture
    tokenizer: str  # "llama" (sentencepiece) or "gpt2" (byte-level BPE)
    name: str = "tiny"  # general.name ("mistral" is how transformers tells Mistral from Llama)
    config_key_prefix: str = ""  # defaults to gguf_arch
    extra: dict = field(default_factory=dict)


_ARCHS = {
    "llama": _Arch("llama", "llama"),
    # llama.cpp writes Mistral as `llama`; transformers turns it into MistralConfig only when
    # general.name is exactly "mistral", and that then fails in 5.24 with gguf 0.19 (gguf-py has no
    # arch named "mistral" for get_gguf_hf_weights_map). A published file's name is longer, and
    # transformers loads it as a LlamaForCausalLM: this fixture is such a file.
    "mistral": _Arch("llama", "llama", name="Mistral 7B Instruct v0.2 (tiny)"),
    "qwen2": _Arch("qwen2", "gpt2"),
    "qwen2moe": _Arch("qwen2moe", "gpt2"),
    "qwen3moe": _Arch("qwen3moe", "gpt2"),
    "phi3": _Arch("phi3", "llama"),
    "gemma2": _Arch("gemma2", "llama"),
    "gemma3": _Arch("gemma3", "llama"),
    "gpt2": _Arch("gpt2", "gpt2"),
    "starcoder2": _Arch("starcoder2", "gpt2"),
}


def _special_ids(arch: str) -> dict[str, int]:
    vocab = _vocab(_ARCHS[arch].tokenizer)
    return {k: v for k, v in vocab.special.items()}


def tiny_config(arch: str):
    """The transformers config of ``arch``'s tiny model: what transformers reads back from the
    file's metadata (fields the metadata does not carry keep the config class's defaults)."""
    import transformers as T

    ids = _special_ids(arch)
    vocab_size = len(_vocab(_ARCHS[arch].tokenizer).tokens)
    common = dict(
        vocab_size=vocab_size, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=256, rms_norm_eps=2.0**-20, **ids,
    )
    if arch == "llama":
        return T.LlamaConfig(**common, max_position_embeddings=256, tie_word_embeddings=False)
    if arch == "mistral":
        return T.MistralConfig(**common, head_dim=HIDDEN // 4, max_position_embeddings=256, tie_word_embeddings=False)
    if arch == "qwen2":
        return T.Qwen2Config(**common, max_position_embeddings=256, tie_word_embeddings=False)
    if arch == "qwen2moe":
        # transformers does not read qwen2moe.expert_feed_forward_length nor
        # expert_shared_feed_forward_length: moe_intermediate_size and
        # shared_expert_intermediate_size stay Qwen2MoeConfig's defaults (1408, 5632)
        common.update(num_hidden_layers=1)
        return T.Qwen2MoeConfig(
            **common, num_experts=2, num_experts_per_tok=1, max_position_embeddings=256, tie_word_embeddings=False,
        )
    if arch == "qwen3moe":
        # moe_intermediate_size is not read either: Qwen3MoeConfig's default, 768
        return T.Qwen3MoeConfig(
            **common, head_dim=64, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
            max_position_embeddings=256, tie_word_embeddings=False,
        )
    if arch == "phi3":
        return T.Phi3Config(**common, tie_word_embeddings=False)
    if arch == "gemma2":
        return T.Gemma2Config(**common, head_dim=64, sliding_window=128, max_position_embeddings=256)
    if arch == "gemma3":
        return T.Gemma3TextConfig(**common, head_dim=64, sliding_window=128, max_position_embeddings=256)
    if arch == "gpt2":
        # feed_forward_length is read into an unused key, so n_inner stays None (4 * n_embd)
        return T.GPT2Config(
            vocab_size=vocab_size, n_embd=HIDDEN, n_layer=2, n_head=4, n_positions=1024, layer_norm_epsilon=2.0**-17,
            **ids,
        )
    if arch == "starcoder2":
        return T.Starcoder2Config(
            vocab_size=vocab_size, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=256, max_position_embeddings=4096, norm_epsilon=2.0**-17,
            **ids,
        )
    raise ValueError(f"no tiny GGUF model for {arch!r}; one of {ARCHS}")


def tiny_hf_model(arch: str, seed: int = 0):
    """``arch``'s tiny transformers model, its weights drawn from ``seed`` (no download).

    Weights are drawn at a scale that keeps the logits varied (std 1/sqrt(row length)); norm
    weights are near 1 (near 0 for Gemma, whose norms scale by ``1 + w``) and multiples of 2**-10,
    so the ``w + 1`` the file stores for Gemma converts back exactly in float32.
    """
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch), dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(seed)
    gemma = arch.startswith("gemma")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name.split(".")[-2] or name.split(".")[-2].startswith("ln_"):
                if name.endswith(".bias"):
                    values = 0.1 * torch.randn(param.shape, generator=generator)
                else:
                    values = (0.0 if gemma else 1.0) + 0.1 * torch.randn(param.shape, generator=generator)
                param.copy_(torch.round(values * 1024) / 1024)
            elif param.dim() == 1:
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))
            else:
                rows = param.shape[0] if arch == "gpt2" and "wte" not in name and "wpe" not in name else param.shape[-1]
                param.copy_(torch.randn(param.shape, generator=generator) / rows**0.5)
    return model


# ---------------------------------------------------------------------------------------------
# quantizing (gguf.quants where it can, a plain round-to-nearest K-quantizer where it cannot)


def ggml_type_id(ggml_type: str):
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType[ggml_type]


def _f16(values: np.ndarray) -> np.ndarray:
    return values.astype(np.float16)


def _bytes(*parts: np.ndarray) -> np.ndarray:
    return np.concatenate([np.ascontiguousarray(p).view(np.uint8).reshape(p.shape[0], -1) for p in parts], axis=1)


def _affine(x: np.ndarray, levels: int, scale_levels: int):
    """Sub-blocks ``x (n, S, L)`` as ``d * sc * q - dmin * m``: 6- or 4-bit sc/m, q in 0..levels."""
    low = np.minimum(x.min(axis=-1), 0.0)
    scale = (x.max(axis=-1) - low) / levels
    d = _f16(scale.max(axis=-1) / scale_levels)
    dmin = _f16(-low.min(axis=-1) / scale_levels)
    df, dminf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.round(np.divide(scale, df, out=np.zeros_like(scale), where=df > 0)), 0, scale_levels)
    m = np.clip(np.round(np.divide(-low, dminf, out=np.zeros_like(low), where=dminf > 0)), 0, scale_levels)
    step = (df * sc)[..., None]
    q = np.divide(x + (dminf * m)[..., None], step, out=np.zeros_like(x), where=step > 0)
    q = np.clip(np.round(q), 0, levels).astype(np.uint8)
    return d, dmin, sc.astype(np.uint8), m.astype(np.uint8), q


def _symmetric(x: np.ndarray, qmax: int, scale_max: int):
    """Sub-blocks ``x (n, S, L)`` as ``d * sc * q``, sc in 0..scale_max, q in -qmax..qmax-1."""
    scale = np.abs(x).max(axis=-1) / qmax
    d = _f16(scale.max(axis=-1) / scale_max)
    df = d.astype(np.float32)[:, None]
    sc = np.clip(np.round(np.divide(scale, df, out=np.zeros_like(scale), where=df > 0)), 0, scale_max)
    step = (df * sc)[..., None]
    q = np.divide(x, step, out=np.zeros_like(x), where=step > 0)
    q = np.clip(np.round(q), -qmax, qmax - 1).astype(np.int16)
    return d, sc.astype(np.int16), q


def _pack_scales_k4(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Q4_K/Q5_K's 12 bytes of eight 6-bit scales and mins (gguf-py's ``get_scale_min`` inverted)."""
    lo_d = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    lo_m = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    mixed = (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)
    return np.concatenate([lo_d, lo_m, mixed], axis=1).astype(np.uint8)


def _quantize_k(x: np.ndarray, ggml_type: str) -> np.ndarray:
    """``x (n, 256)`` as K-quant blocks ``(n, bytes)``, laid out as gguf-py dequantizes them."""
    n = x.shape[0]
    if ggml_type == "Q2_K":
        d, dmin, sc, m, q = _affine(x.reshape(n, 16, 16), 3, 15)
        q = q.reshape(n, 2, 4, 32)
        qs = (q << (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)).sum(axis=2, dtype=np.uint8)
        return _bytes(sc | (m << 4), qs.reshape(n, 64), d[:, None], dmin[:, None])
    if ggml_type == "Q3_K":
        d, sc, q = _symmetric(x.reshape(n, 16, 16), 4, 31)
        u = (q + 4).astype(np.uint8).reshape(n, 256)  # 0..7: two low bits, one high bit
        low = (u & 3).reshape(n, 2, 4, 32)
        qs = (low << (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)).sum(axis=2, dtype=np.uint8)
        high = (u >> 2).reshape(n, 8, 32)
        hmask = (high << np.arange(8, dtype=np.uint8).reshape(1, 8, 1)).sum(axis=1, dtype=np.uint8)
        s = (sc + 32).astype(np.uint8)  # 6 bits, stored biased by 32
        lscales = (s[:, :8] & 0x0F) | ((s[:, 8:] & 0x0F) << 4)
        h = (s >> 4).reshape(n, 4, 4)
        hscales = (h << (2 * np.arange(4, dtype=np.uint8)).reshape(1, 4, 1)).sum(axis=1, dtype=np.uint8)
        return _bytes(hmask, qs.reshape(n, 64), lscales, hscales, d[:, None])
    if ggml_type in ("Q4_K", "Q5_K"):
        levels = 15 if ggml_type == "Q4_K" else 31
        d, dmin, sc, m, q = _affine(x.reshape(n, 8, 32), levels, 63)
        q = q.reshape(n, 4, 2, 32)
        qs = (q[:, :, 0] & 0x0F) | ((q[:, :, 1] & 0x0F) << 4)
        parts = [d[:, None], dmin[:, None], _pack_scales_k4(sc, m)]
        if ggml_type == "Q5_K":
            high = (q.reshape(n, 8, 32) >> 4) & 1
            parts.append((high << np.arange(8, dtype=np.uint8).reshape(1, 8, 1)).sum(axis=1, dtype=np.uint8))
        return _bytes(*parts, qs.reshape(n, 128))
    if ggml_type == "Q6_K":
        d, sc, q = _symmetric(x.reshape(n, 16, 16), 32, 127)
        u = (q + 32).astype(np.uint8).reshape(n, 2, 2, 64)  # (half, nibble, 64)
        ql = (u[:, :, 0] & 0x0F) | ((u[:, :, 1] & 0x0F) << 4)
        high = (u.reshape(n, 2, 4, 32) >> 4) & 3
        qh = (high << (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)).sum(axis=2, dtype=np.uint8)
        return _bytes(ql.reshape(n, 128), qh.reshape(n, 64), sc.astype(np.int8), d[:, None])
    raise ValueError(ggml_type)


def quantize(values: np.ndarray, ggml_type: str) -> np.ndarray:
    """``values`` (float32, last axis the row) as the file stores them in ``ggml_type``: float16
    for F16, the raw bytes (uint8, last axis in bytes) for BF16 and the block types."""
    from gguf import quants

    values = np.ascontiguousarray(values, dtype=np.float32)
    if ggml_type == "F32":
        return values
    if ggml_type in _K_FALLBACK:
        rows = values.reshape(-1, values.shape[-1]).reshape(-1, 256)
        blocks = _quantize_k(rows, ggml_type)
        return blocks.reshape(*values.shape[:-1], -1)
    return quants.quantize(values, ggml_type_id(ggml_type))


def dequantize(data: np.ndarray, ggml_type: str) -> np.ndarray:
    """What gguf's numpy dequantizer (the one transformers' legacy GGUF loader runs) makes of
    ``quantize(values, ggml_type)``, as float32."""
    from gguf import quants

    return np.asarray(quants.dequantize(data, ggml_type_id(ggml_type)), dtype=np.float32)


# where each block type keeps its f16 scales: byte offsets inside one block
_F16_FIELDS = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
}


def random_blocks(ggml_type: str, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """``rows`` rows of ``cols`` values of ``ggml_type`` as random but valid blocks (uint8,
    ``(rows, bytes per row)``): every quant and sub-scale bit random, the f16 scales random in
    [-0.1, 0.1] (never inf or NaN). Exercises bit patterns a quantizer never writes."""
    from gguf import GGML_QUANT_SIZES

    block, size = GGML_QUANT_SIZES[ggml_type_id(ggml_type)]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(rows * cols // block, size), dtype=np.uint8)
    for offset in _F16_FIELDS[ggml_type]:
        scale = rng.uniform(-0.1, 0.1, size=blocks.shape[0]).astype(np.float16)
        blocks[:, offset : offset + 2] = scale.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def storage_type(ggml_type: str, row_length: int) -> str:
    """The type llama.cpp would store a row of ``row_length`` in when asked for ``ggml_type``."""
    from gguf import GGML_QUANT_SIZES

    block = GGML_QUANT_SIZES[ggml_type_id(ggml_type)][0]
    if row_length % block == 0:
        return ggml_type
    if ggml_type in _K_FALLBACK:
        return storage_type(_K_FALLBACK[ggml_type], row_length)
    return "F16"


# ---------------------------------------------------------------------------------------------
# tokenizers in the metadata


@dataclass(frozen=True)
class _Vocab:
    model: str
    tokens: list[str]
    token_type: list[int]
    scores: list[float] | None
    merges: list[str] | None
    special: dict[str, int]  # config key -> id
    pre: str | None = None


_WORDS = ["the", "he", "in", "er", "an", "on", "re", "at", "en", "is", "it", "or", "hello", "world", "layer"]


def _pieces(alphabet: set[str], space: str) -> list[tuple[str, str]]:
    """Merges building a few words (and their ``space``-prefixed forms) from ``alphabet``."""
    merges, have = [], set(alphabet)
    for word in _WORDS:
        for form in (word, space + word):
            left = form[0]
            for ch in form[1:]:
                if left + ch not in have:
                    merges.append((left, ch))
                    have.add(left + ch)
                left += ch
    return merges


def _vocab(kind: str) -> _Vocab:
    if kind == "llama":  # sentencepiece: specials, 256 byte pieces, characters, merged pieces
        tokens = ["<unk>", "<s>", "</s>", "<pad>"] + [f"<0x{b:02X}>" for b in range(256)]
        types = [2, 3, 3, 3] + [6] * 256
        chars = ["\u2581"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'")
        pieces = chars + ["".join(pair) for pair in _pieces(set(chars), "\u2581")]
        scores = [0.0] * len(tokens) + [-float(i) for i in range(len(pieces))]
        tokens += pieces
        types += [1] * len(pieces)
        special = {"unk_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}
        return _Vocab("llama", tokens, types, scores, None, special)
    # byte-level BPE: the 256 byte symbols, merged pieces, then the control tokens
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = list(bytes_to_unicode().values())
    merges = _pieces(set(alphabet), "\u0120")
    tokens = alphabet + ["".join(pair) for pair in merges] + ["<|endoftext|>", "<|pad|>"]
    types = [1] * (len(tokens) - 2) + [3, 3]
    eot = len(tokens) - 2
    special = {"bos_token_id": eot, "eos_token_id": eot, "pad_token_id": eot + 1}
    return _Vocab("gpt2", tokens, types, None, [" ".join(pair) for pair in merges], special, pre="gpt-2")


def tokenizer_metadata(kind: str) -> dict[str, Any]:
    """The ``tokenizer.ggml.*`` keys of the ``llama`` (sentencepiece) or ``gpt2`` (BPE) vocabulary."""
    vocab = _vocab(kind)
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": vocab.model,
        "tokenizer.ggml.tokens": vocab.tokens,
        "tokenizer.ggml.token_type": ("int32", vocab.token_type),
    }
    if vocab.pre:
        meta["tokenizer.ggml.pre"] = vocab.pre
    if vocab.scores is not None:
        meta["tokenizer.ggml.scores"] = ("float32", vocab.scores)
    if vocab.merges is not None:
        meta["tokenizer.ggml.merges"] = vocab.merges
    names = {"bos_token_id": "bos", "eos_token_id": "eos", "unk_token_id": "unknown", "pad_token_id": "padding"}
    for key, token_id in vocab.special.items():
        meta[f"tokenizer.ggml.{names[key]}_token_id"] = ("uint32", token_id)
    if kind == "llama":
        meta["tokenizer.ggml.add_bos_token"] = True
        meta["tokenizer.ggml.add_eos_token"] = False
    return meta


# ---------------------------------------------------------------------------------------------
# config metadata


def config_metadata(arch: str, config) -> dict[str, Any]:
    """The ``<arch>.*`` keys llama.cpp writes for ``config``, as transformers reads them."""
    spec = _ARCHS[arch]
    p = spec.gguf_arch
    u32 = lambda v: ("uint32", int(v))  # noqa: E731
    f32 = lambda v: ("float32", float(v))  # noqa: E731
    meta: dict[str, Any] = {"general.name": spec.name}
    if arch == "gpt2":
        meta.update({
            f"{p}.block_count": u32(config.n_layer), f"{p}.context_length": u32(config.n_positions),
            f"{p}.embedding_length": u32(config.n_embd), f"{p}.feed_forward_length": u32(4 * config.n_embd),
            f"{p}.attention.head_count": u32(config.n_head),
            f"{p}.attention.layer_norm_epsilon": f32(config.layer_norm_epsilon),
        })
        return meta
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    meta.update({
        f"{p}.block_count": u32(config.num_hidden_layers),
        f"{p}.context_length": u32(config.max_position_embeddings),
        f"{p}.embedding_length": u32(config.hidden_size),
        f"{p}.feed_forward_length": u32(config.intermediate_size),
        f"{p}.attention.head_count": u32(config.num_attention_heads),
        f"{p}.attention.head_count_kv": u32(config.num_key_value_heads),
    })
    if arch == "starcoder2":
        meta[f"{p}.attention.layer_norm_epsilon"] = f32(config.norm_epsilon)
        return meta
    meta[f"{p}.attention.layer_norm_rms_epsilon"] = f32(config.rms_norm_eps)
    rope = getattr(config, "rope_parameters", None)  # transformers 5; 4.x states rope_theta itself
    theta = rope.get("full_attention", rope).get("rope_theta") if rope else config.rope_theta
    meta[f"{p}.rope.freq_base"] = f32(theta)
    meta[f"{p}.rope.dimension_count"] = u32(head_dim)
    if arch in ("llama", "mistral"):
        meta[f"{p}.vocab_size"] = u32(config.vocab_size)
    if arch in ("qwen3moe", "gemma2", "gemma3"):
        meta[f"{p}.attention.key_length"] = u32(head_dim)
        meta[f"{p}.attention.value_length"] = u32(head_dim)
    if arch in ("gemma2", "gemma3"):
        meta[f"{p}.attention.sliding_window"] = u32(config.sliding_window)
    if arch in ("qwen2moe", "qwen3moe"):
        meta[f"{p}.expert_count"] = u32(config.num_experts)
        meta[f"{p}.expert_used_count"] = u32(config.num_experts_per_tok)
        meta[f"{p}.expert_feed_forward_length"] = u32(config.moe_intermediate_size)
    if arch == "qwen2moe":
        meta[f"{p}.expert_shared_feed_forward_length"] = u32(config.shared_expert_intermediate_size)
    return meta


# ---------------------------------------------------------------------------------------------
# the state dict as GGUF tensors, and back


def _llama_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row permutation (the inverse of LlamaTensorProcessor's)."""
    return weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(
        weights.shape
    )


def _llama_unpermute(weights: np.ndarray, n_head: int) -> np.ndarray:
    return weights.reshape(n_head, weights.shape[0] // n_head // 2, 2, *weights.shape[1:]).swapaxes(2, 1).reshape(
        weights.shape
    )


_GPT2_TRANSPOSED = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


@dataclass
class _Tensor:
    gguf_name: str
    values: np.ndarray  # float32, in GGUF's (torch-ordered) layout, inverse transforms applied
    quantized: bool  # a big weight (quantized to the file's type) or kept F32


def _gguf_tensors(arch: str, model) -> list[_Tensor]:
    """``model``'s state dict as llama.cpp would name and lay it out (before quantizing)."""
    import gguf

    spec = _ARCHS[arch]
    config = model.config
    n_layers = config.n_layer if arch == "gpt2" else config.num_hidden_layers
    gguf_arch = next(key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == spec.gguf_arch)
    name_map = gguf.get_tensor_name_map(gguf_arch, n_layers)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    out = []
    for hf_name, tensor in model.state_dict().items():
        if tied and hf_name == "lm_head.weight":
            continue
        values = tensor.detach().to(torch.float32).numpy().copy()
        if hf_name.endswith(".mlp.experts.gate_up_proj"):  # (E, 2I, H) -> ffn_gate_exps, ffn_up_exps
            block = hf_name.split(".")[2]
            gate, up = np.split(values, 2, axis=1)
            out.append(_Tensor(f"blk.{block}.ffn_gate_exps.weight", gate, True))
            out.append(_Tensor(f"blk.{block}.ffn_up_exps.weight", up, True))
            continue
        stem, suffix = hf_name, ""
        if hf_name.endswith((".weight", ".bias")):
            stem, suffix = hf_name.rsplit(".", 1)
            suffix = "." + suffix
        gguf_name = name_map.get_name(stem)
        if gguf_name is None:
            raise ValueError(f"gguf has no name for {arch} tensor {hf_name}")
        gguf_name += suffix
        if spec.gguf_arch == "llama" and suffix == ".weight":
            if ".attn_q." in gguf_name:
                values = _llama_permute(values, config.num_attention_heads)
            elif ".attn_k." in gguf_name:
                values = _llama_permute(values, config.num_key_value_heads)
        if arch.startswith("gemma") and gguf_name.endswith("norm.weight"):
            values = values + np.float32(1)
        if arch == "gpt2" and hf_name.endswith(_GPT2_TRANSPOSED):
            values = np.ascontiguousarray(values.T)
        if "ffn_gate_inp_shexp" in gguf_name:  # llama.cpp squeezes (1, H) to (H,)
            values = values.reshape(-1)
        quantized = values.ndim >= 2 and suffix != ".bias" and "ffn_gate_inp" not in gguf_name
        out.append(_Tensor(gguf_name, values, quantized))
    return out


def _tensor_type(tensor: _Tensor, ggml_type: str) -> str:
    return storage_type(ggml_type, tensor.values.shape[-1]) if tensor.quantized else "F32"


def reference_model(arch: str, ggml_type: str = "Q8_0", seed: int = 0, *, model=None):
    """``tiny_hf_model(arch, seed)`` with each weight replaced by what the file of
    ``write_gguf(arch, ..., ggml_type=ggml_type, seed=seed)`` holds for it, read back through
    gguf's numpy dequantizer and the loader's transform: the model transformers should load.
    ``model``: the seeded model the file was written from (copied, not changed)."""
    import copy

    model = tiny_hf_model(arch, seed) if model is None else copy.deepcopy(model)
    config = model.config
    by_name = {t.gguf_name: t for t in _gguf_tensors(arch, model)}
    state = model.state_dict()
    spec = _ARCHS[arch]

    def back(name: str) -> np.ndarray:
        tensor = by_name[name]
        kind = _tensor_type(tensor, ggml_type)
        return dequantize(quantize(tensor.values, kind), kind)

    import gguf

    n_layers = config.n_layer if arch == "gpt2" else config.num_hidden_layers
    gguf_arch = next(key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == spec.gguf_arch)
    name_map = gguf.get_tensor_name_map(gguf_arch, n_layers)
    new_state = {}
    for hf_name, tensor in state.items():
        if getattr(config, "tie_word_embeddings", False) and hf_name == "lm_head.weight":
            continue
        if hf_name.endswith(".mlp.experts.gate_up_proj"):
            block = hf_name.split(".")[2]
            values = np.concatenate(
                [back(f"blk.{block}.ffn_gate_exps.weight"), back(f"blk.{block}.ffn_up_exps.weight")], axis=1
            )
        else:
            stem, suffix = hf_name, ""
            if hf_name.endswith((".weight", ".bias")):
                stem, suffix = hf_name.rsplit(".", 1)
                suffix = "." + suffix
            gguf_name = name_map.get_name(stem) + suffix
            values = back(gguf_name)
            if spec.gguf_arch == "llama" and suffix == ".weight":
                if ".attn_q." in gguf_name:
                    values = _llama_unpermute(values, config.num_attention_heads)
                elif ".attn_k." in gguf_name:
                    values = _llama_unpermute(values, config.num_key_value_heads)
            if arch.startswith("gemma") and gguf_name.endswith("norm.weight"):
                values = values - np.float32(1)
            if arch == "gpt2" and hf_name.endswith(_GPT2_TRANSPOSED):
                values = values.T
            values = values.reshape(tensor.shape)
        new_state[hf_name] = torch.from_numpy(np.ascontiguousarray(values))
    model.load_state_dict(new_state, strict=False)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    return model


# ---------------------------------------------------------------------------------------------
# writing


def write_gguf(
    arch: str, path: Path, *, ggml_type: str = "Q8_0", seed: int = 0, model=None, name: str | None = None,
) -> Path:
    """``tiny_hf_model(arch, seed)`` (or ``model``, a model of ``tiny_config(arch)``) written to
    ``path`` as a GGUF file of ``ggml_type`` big weights; returns ``path``.

    A weight whose rows do not split into ``ggml_type``'s blocks is stored in llama.cpp's
    fallback type instead (only qwen2moe's expert down projections, 1408 wide, under K-quants).
    ``name`` overrides general.name (``name="mistral"`` makes transformers pick MistralConfig).
    """
    if ggml_type not in GGML_TYPES:
        raise ValueError(f"ggml_type {ggml_type!r} is not one of {GGML_TYPES}")
    model = tiny_hf_model(arch, seed) if model is None else model
    spec = _ARCHS[arch]
    tensors = {}
    for tensor in _gguf_tensors(arch, model):
        kind = _tensor_type(tensor, ggml_type)
        tensors[tensor.gguf_name] = (quantize(tensor.values, kind), kind)
    metadata = {"general.architecture": spec.gguf_arch, "general.file_type": ("uint32", _FILE_TYPE[ggml_type])}
    metadata.update(config_metadata(arch, model.config))
    if name is not None:
        metadata["general.name"] = name
    metadata.update(tokenizer_metadata(spec.tokenizer))
    return write_raw_gguf(path, tensors, metadata)


def write_llama_experts_gguf(path: Path, *, ggml_type: str = "Q8_0", seed: int = 0, n_experts: int = 2) -> Path:
    """A Mixtral-style file as llama.cpp writes one: ``llama`` with ``llama.expert_count`` and
    ``blk.N.ffn_{gate,up,down}_exps`` stacks plus an F32 router ``ffn_gate_inp``; the experts are
    ``tiny_hf_model("llama")``'s MLP scaled by 1, 1/2, 1/3... transformers 5.24 has no GGUF Mixtral:
    it loads this as a dense LlamaForCausalLM whose MLP weights are *not* the file's (freshly
    initialized, no error) -- a file layerfit should refuse rather than copy that."""
    model = tiny_hf_model("llama", seed)
    tensors: dict[str, Any] = {}
    for tensor in _gguf_tensors("llama", model):
        kind = _tensor_type(tensor, ggml_type)
        if ".ffn_" not in tensor.gguf_name or not tensor.gguf_name.endswith(".weight"):
            tensors[tensor.gguf_name] = (quantize(tensor.values, kind), kind)
            continue
        block, proj = tensor.gguf_name.split(".")[1:3]
        stack = np.stack([tensor.values / (i + 1) for i in range(n_experts)])
        tensors[f"blk.{block}.{proj}_exps.weight"] = (quantize(stack, kind), kind)
        router = np.random.default_rng(seed).standard_normal((n_experts, HIDDEN)).astype(np.float32) / 16
        tensors[f"blk.{block}.ffn_gate_inp.weight"] = (router, "F32")
    metadata = {"general.architecture": "llama", "general.file_type": ("uint32", _FILE_TYPE[ggml_type])}
    metadata.update(config_metadata("llama", model.config))
    metadata["general.name"] = "Mixtral 8x7B (tiny)"
    metadata["llama.expert_count"] = ("uint32", n_experts)
    metadata["llama.expert_used_count"] = ("uint32", min(2, n_experts))
    metadata.update(tokenizer_metadata("llama"))
    return write_raw_gguf(path, tensors, metadata)


# llama_ftype values (general.file_type), as llama.cpp's quantize writes them
_FILE_TYPE = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K": 12,
    "Q4_K": 15, "Q5_K": 17, "Q6_K": 18, "BF16": 32,
}


def _value(value: Any):
    """``(value, GGUFValueType, sub_type)`` for a metadata value: a plain Python value, or
    ``(type name, value)`` such as ``("uint32", 3)`` / ``("int32", [1, 2])``."""
    from gguf import GGUFValueType as V

    names = {
        "uint8": V.UINT8, "int8": V.INT8, "uint16": V.UINT16, "int16": V.INT16, "uint32": V.UINT32,
        "int32": V.INT32, "float32": V.FLOAT32, "bool": V.BOOL, "string": V.STRING, "uint64": V.UINT64,
        "int64": V.INT64, "float64": V.FLOAT64,
    }
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) and value[0] in names:
        kind, value = names[value[0]], value[1]
        if isinstance(value, (list, np.ndarray)):
            return list(value), V.ARRAY, kind
        return value, kind, None
    if isinstance(value, bool):
        return value, V.BOOL, None
    if isinstance(value, int):
        return value, V.UINT32 if 0 <= value < 2**32 else V.INT64, None
    if isinstance(value, float):
        return value, V.FLOAT32, None
    if isinstance(value, str):
        return value, V.STRING, None
    if isinstance(value, (list, tuple)):
        first = value[0] if len(value) else ""
        sub = V.STRING if isinstance(first, str) else V.FLOAT32 if isinstance(first, float) else V.INT32
        return list(value), V.ARRAY, sub
    raise TypeError(f"cannot write metadata value {value!r}")


def write_raw_gguf(
    path: Path, tensors: dict[str, Any], metadata: dict[str, Any], *, alignment: int | None = None
) -> Path:
    """Write exactly ``tensors`` and ``metadata`` to ``path`` as a GGUF file; returns ``path``.

    ``tensors``: name -> a float32/float16 array (stored as F32/F16), or ``(array, ggml type
    name)`` where the array is what ``quantize(values, type)`` returns (float values for
    F32/F16, raw bytes with the last axis in bytes for BF16 and block types). ``metadata``: key ->
    a plain value (int -> uint32, float -> float32, str, bool, list of str/int/float) or
    ``(type name, value)``. ``general.architecture`` is written only if given (a file without
    it is a bad file), and in the order given. ``alignment`` writes ``general.alignment``.
    """
    from gguf import GGUFWriter

    path = Path(path)
    writer = GGUFWriter(str(path), arch=str(metadata.get("general.architecture", "")))
    writer.kv_data[0].clear()  # the writer's own general.architecture: written below if asked for
    if alignment is not None:
        metadata = {**metadata, "general.alignment": ("uint32", alignment)}
        writer.data_alignment = alignment
    for key, raw in metadata.items():
        value, kind, sub = _value(raw)
        writer.add_key_value(key, value, kind, sub_type=sub)
    for name, entry in tensors.items():
        array, kind = entry if isinstance(entry, tuple) else (entry, None)
        array = np.ascontiguousarray(array)
        raw_dtype = ggml_type_id(kind) if kind is not None and array.dtype == np.uint8 else None
        writer.add_tensor(name, array, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def load_gguf(path: Path, **kwargs):
    """transformers' model and tokenizer of the GGUF file at ``path``, as a user loads them."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.logging.set_verbosity_error()
    path = Path(path)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, **kwargs).eval()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model, tokenizer
