"""A tiny language model for the generation tests: a seeded Llama with a word-level
tokenizer (built here, nothing downloaded) and a chat template, prepared into a
repository beside a model that cannot generate."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from serve_helpers import CHAIN

from layerfit.serve.server import ServerThread
from layerfit.store import ModelSpec, prepare

WORDS = [f"w{i}" for i in range(56)] + ["system", "user", "assistant", ":"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)
CONFIG = {
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
    "eos_token_id": 1, "pad_token_id": 1,
}
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 8 * 4  # layers × (keys, values) × KV heads × head size × float32


def word_tokenizer() -> transformers.PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<eos>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_repository(root: Path) -> Path:
    """``lm`` (the language model) and ``chain`` (a model that does not generate)."""
    folder = root / "hf-llama"
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    repo = root / "repo"
    prepare("hf:" + str(folder), repo / "lm")
    prepare(ModelSpec("factory", "tinymodels:chain", CHAIN), repo / "chain", input_shape=(1, 8))
    return folder


def reference_tokens(folder: Path, prompt: list[int], n: int) -> list[int]:
    """transformers' own greedy tokens for ``prompt`` alone (ending at the end token)."""
    model = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False)
    tokens = out[0, len(prompt):].tolist()
    return tokens[: tokens.index(1)] if 1 in tokens else tokens


def decoding_stats(server: ServerThread, name: str = "lm") -> dict[str, int]:
    """Model ``name``'s decode loop's counters (passes, proposed, accepted ...) in ``server``."""
    assert server.built is not None
    return server.built.runtime.decoding_stats(name)


def words(ids: list[int]) -> str:
    """``ids`` as the word tokenizer's text."""
    return word_tokenizer().decode(ids, skip_special_tokens=True)
