"""What a model must be to generate text and what a prompt must be: the one home of the
rules shared by the command line (``layerfit generate``: transformers' own ``generate``
through the engine), the runtime's decode loop and the server's generation routes.

**Which models generate** (:func:`refusal`). Every caller asks the same questions in the
same order, of the manifest and, once it is built, of the skeleton:

1. Is it a Hugging Face model? The zoo's networks never are. The batched loop asks more:
   a model prepared from a Hugging Face folder, whose manifest records its class and
   config, so the server judges a model before any engine of it is built.
2. Does its class generate from token ids? The skeleton must be a ``GenerationMixin``
   whose ``main_input_name`` is ``input_ids``; before it is built, the batched loop reads
   the class name the manifest records (a ``…ForCausalLM``).
3. The batched loop only: is it decoder-only? It keeps one growing cache per sequence and
   layer (:mod:`.batch_step`); an encoder-decoder's is two, and transformers' ``generate``
   (the command line) runs those.

Why transformers' ``generate`` stays for the command line, beside the loop: it is what
``layerfit generate`` promises bit for bit — the folder's ``generation_config.json`` with
every logits processor it may name (repetition penalties, forced tokens, beams), sampling
from the global seed as ``model.generate`` does, and encoder-decoders (T5, BART, Whisper).
The loop serves many sequences at once with the four settings the HTTP APIs take
(:mod:`.sampling`). Both refuse the same models and the same prompts, with these rules.

**Which prompts** (:func:`check_prompt_ids`, :func:`check_generation_length`): not empty, every
id in the vocabulary, the prompt and the new tokens within the model's positions (an
encoder-decoder's prompt and new tokens each within its own).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layerfit.backports import StrEnum
from layerfit.errors import InputError, LayerfitError

if TYPE_CHECKING:
    from torch import nn

    from layerfit.store.manifest import Manifest

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
"""Files that make a folder one ``AutoTokenizer.from_pretrained`` reads."""


class Refusal(StrEnum):
    """Why a model cannot generate (the answer of :func:`refusal`; callers word it)."""

    NOT_HUGGING_FACE = "not a Hugging Face model"  # the zoo's; for the loop, any not prepared from a folder
    NO_GENERATE = "no generate from token ids"  # its class has no generate, or the loop's class is no …ForCausalLM
    NOT_TOKEN_IDS = "generates from another input"  # main_input_name is not input_ids
    NOT_DECODER_ONLY = "not decoder-only"  # the loop's: an encoder-decoder


def config_of(manifest: Manifest) -> dict[str, Any]:
    """The Hugging Face config a manifest recorded (empty when it recorded none)."""
    kwargs = manifest.model.get("kwargs")
    if isinstance(kwargs, dict) and isinstance(kwargs.get("config"), dict):
        return kwargs["config"]
    return {}


def refusal(manifest: Manifest, skeleton: nn.Module | None = None, *, batched: bool) -> Refusal | None:
    """Why the prepared model of ``manifest`` cannot generate, or None when it can: for
    transformers' ``generate`` (``batched`` false) or the runtime's decode loop (true);
    ``skeleton``, the model once built, answers what the manifest cannot."""
    model = manifest.model
    source, name = model.get("source"), str(model.get("name", ""))
    if source == "zoo" or (batched and source != "hf"):
        return Refusal.NOT_HUGGING_FACE
    if batched and (config_of(manifest).get("is_encoder_decoder") or not name.endswith("ForCausalLM")):
        return Refusal.NOT_DECODER_ONLY
    if skeleton is None:
        return None
    from transformers import GenerationMixin

    if not isinstance(skeleton, GenerationMixin):
        return Refusal.NO_GENERATE
    if getattr(skeleton, "main_input_name", "input_ids") != "input_ids":
        return Refusal.NOT_TOKEN_IDS
    if batched and getattr(skeleton.config, "is_encoder_decoder", False):
        return Refusal.NOT_DECODER_ONLY
    return None


def has_tokenizer(folder: Path) -> bool:
    """Whether ``folder`` holds tokenizer files."""
    return any((folder / name).is_file() for name in TOKENIZER_FILES)


def read_tokenizer(folder: Path) -> Any:
    """The tokenizer saved in ``folder``, from local files only and running no code the
    folder names (``trust_remote_code`` stays off); raises what transformers raises."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)


def end_tokens(model_config: Any, tokenizer: Any | None) -> frozenset[int]:
    """The ids that end a sequence: the config's ``eos_token_id`` (one or several) and the
    tokenizer's."""
    ends = getattr(model_config, "eos_token_id", None)
    ends = ends if isinstance(ends, list) else [ends]
    extra = [getattr(tokenizer, "eos_token_id", None)] if tokenizer is not None else []
    return frozenset(int(e) for e in [*ends, *extra] if e is not None)


def vocab_of(model: Any) -> int | None:
    """How many token ids the model embeds (its input embedding's rows, else its config's
    ``vocab_size``; None when neither says)."""
    with contextlib.suppress(Exception):
        rows = model.get_input_embeddings().num_embeddings
        if isinstance(rows, int) and rows > 0:
            return rows
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    return vocab if isinstance(vocab, int) and vocab > 0 else None


def check_prompt_ids(prompt: list[int] | tuple[int, ...], vocab: int | None, vocabulary: str) -> None:
    """Refuse (:class:`~layerfit.errors.InputError`) an empty prompt or one holding an id
    outside ``0 .. vocab - 1``; ``vocabulary`` names it ("the vocabulary of 'lm'")."""
    if not prompt:
        raise InputError("the prompt holds no tokens")
    low, high = min(prompt), max(prompt)
    if low < 0 or (vocab is not None and high >= vocab):
        bad = low if low < 0 else high
        span = f"0-{vocab - 1}" if vocab is not None else "0 or more"
        raise InputError(f"the prompt holds token id {bad}; {vocabulary} has ids {span}")


def check_generation_length(
    config: Any, n: int, max_tokens: int, *, model: str = "the model", tokens: str = "max_tokens",
    error: type[LayerfitError] = InputError,
) -> None:
    """Refuse (``error``) ``n`` prompt tokens and ``max_tokens`` new ones past the
    positions of the model of ``config`` (an encoder-decoder's prompt and new tokens
    each within its own); ``model`` and ``tokens`` name the model and the setting."""
    # imported here: it imports PyTorch, which the command line starts without
    from layerfit.store.hf_folder import positions_of

    if getattr(config, "is_encoder_decoder", False):
        source, target = positions_of(config, "max_source_positions"), positions_of(config, "max_target_positions")
        if source is not None and n > source[1]:
            raise error(f"the prompt has {n} tokens; {model}'s encoder has {source[1]} positions ({source[0]})")
        if target is not None and max_tokens + 1 > target[1]:
            raise error(
                f"{tokens} {max_tokens} and the decoder's start token need {max_tokens + 1} "
                f"positions; {model}'s decoder has {target[1]} ({target[0]})"
            )
        return
    limit = positions_of(config)
    if limit is None:
        return
    field, positions = limit
    if n > positions:
        raise error(f"the prompt has {n} tokens; {model} has {positions} positions ({field})")
    if n + max_tokens > positions:
        raise error(
            f"the prompt's {n} tokens and {tokens} {max_tokens} make {n + max_tokens} positions; "
            f"{model} has {positions} ({field}): ask for at most {positions - n} new tokens"
        )


__all__ = [
    "TOKENIZER_FILES",
    "Refusal",
    "check_generation_length",
    "check_prompt_ids",
    "config_of",
    "end_tokens",
    "has_tokenizer",
    "read_tokenizer",
    "refusal",
    "vocab_of",
]
