"""Hugging Face folders the store's tests share."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")


def tiny_llama_folders(root: Path) -> dict[str, Path]:
    """A tiny Llama saved as published under ``root``: as one file (``single``) and as
    shards of 40 KB (``sharded``)."""
    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(root / "single")
    model.save_pretrained(root / "sharded", max_shard_size="40KB")
    return {"single": root / "single", "sharded": root / "sharded"}
