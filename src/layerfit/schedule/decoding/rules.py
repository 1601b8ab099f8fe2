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

**A chat** (:func:`check_messages`, :func:`chat_prompt_ids`): messages of a known role
(:data:`CHAT_ROLES`) and text content, made into token ids by the tokenizer's own chat
template exactly as ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)``
tokenizes them (never through text a shell or a file could change, such as the
template's trailing newline); a tokenizer without a template, or a template that fails
on the messages, is one line.

**How new tokens are counted** (:func:`completion_token_count`): every token the model
made counts, *the end-of-sequence token that ended the generation included* (it was
made, and cost a pass, like any other: transformers' ``generate`` returns it, vLLM counts
it), and nothing after it (a token a batch or a speculative pass computed past the end was
never made for this sequence). A stop string ends a generation after the token that
completed it, which counts; the text is cut before the stop string. The end token is not
part of the text. ``layerfit generate`` (``new_tokens``), the Python API (the ids
``generate`` returns after the prompt) and the server's ``usage.completion_tokens`` all
count so: 30 new tokens of which the last is the end token are 30 everywhere.

**Several tokens per pass** (:class:`Speculation`): prompt lookup (the next tokens guessed
from an earlier occurrence of the last ones in the prompt and text so far) or a small draft
model's guesses, verified by one pass of the model; one of the two, not both. A pass
accepts the guesses up to the first the model would not have made, and the model's own
token after them, so greedy tokens are exactly plain decoding's; only the passes are fewer
(:func:`tokens_per_pass`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass
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


CHAT_ROLES = ("system", "user", "assistant", "developer", "tool")
"""The roles a chat message may have (OpenAI's chat API's; a chat template reads them)."""


def check_messages(messages: Any, what: str = "the messages") -> list[dict[str, str]]:
    """``messages`` as a chat: a non-empty list of ``{"role", "content"}`` objects, each
    role one of :data:`CHAT_ROLES` and each content text; one :class:`~layerfit.errors.InputError`
    line naming the first thing wrong. The messages are returned as plain dicts of the
    two keys (anything else a message holds is refused, not passed to the template)."""
    if not isinstance(messages, list) or not messages:
        raise InputError(f"{what} must be a non-empty list of {{\"role\": ..., \"content\": ...}} objects")
    checked = []
    for i, message in enumerate(messages):
        where = f"{what}: message {i + 1}"
        if not isinstance(message, dict):
            raise InputError(f"{where} is not an object with \"role\" and \"content\"")
        extra = sorted(set(message) - {"role", "content"})
        if extra:
            raise InputError(f"{where} has {', '.join(map(repr, extra))}: a message holds only \"role\" and \"content\"")
        role, content = message.get("role"), message.get("content")
        if role not in CHAT_ROLES:
            raise InputError(f"{where} has role {role!r}: a role is one of {', '.join(CHAT_ROLES)}")
        if not isinstance(content, str):
            raise InputError(f"{where} ({role}) has no text \"content\" (a string)")
        checked.append({"role": role, "content": content})
    return checked


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, str]], model: str = "the model") -> list[int]:
    """The prompt of the chat ``messages`` (checked by :func:`check_messages`) as
    ``tokenizer``'s own chat template makes it, ready for the reply: the ids of
    ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)``, which
    tokenizes the rendered text as it stands (no special tokens added again). A tokenizer
    with no template, or a template that fails on the messages (a Jinja error, its own
    ``raise_exception``), is one :class:`~layerfit.errors.InputError` line naming ``model``."""
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(
            f"{model}'s tokenizer has no chat template (tokenizer_config.json's chat_template or "
            "chat_template.jinja): give the whole prompt as text instead"
        )
    try:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    except Exception as exc:  # a Jinja error of the template, or its own raise_exception: one line
        raise InputError(f"{model}'s chat template failed on the messages: {' '.join(str(exc).split())}") from None
    ids = [int(i) for i in ids]
    if not ids:
        raise InputError("the messages make no tokens")
    return ids


def generated_tokens(new_ids: Sequence[int], ends: Collection[int]) -> list[int]:
    """The tokens a generation made, by the rule of the module's docstring: ``new_ids``
    (every id after the prompt) up to and including the first end token (an id of
    ``ends``), nothing after it."""
    for i, token in enumerate(new_ids):
        if token in ends:
            return list(new_ids[:i + 1])
    return list(new_ids)


def completion_token_count(new_ids: Sequence[int], ends: Collection[int]) -> int:
    """How many new tokens a generation counts (``new_tokens``, ``usage.completion_tokens``):
    those it made, the end token that ended it included, none after it
    (:func:`generated_tokens`)."""
    return len(generated_tokens(new_ids, ends))


def tokens_per_pass(new_tokens: int, passes: int) -> float | None:
    """New tokens (counted by :func:`completion_token_count`) per pass of the model that
    made them (None: no pass): 1 for plain decoding, more where a pass accepted guesses."""
    return new_tokens / passes if passes > 0 else None


PROMPT_LOOKUP_MAX = 64
"""The most tokens prompt lookup may guess per pass: each guess is a position the
verifying pass computes, and past a few dozen one is all but never accepted."""


@dataclass(frozen=True)
class Speculation:
    """How a generation guesses several tokens per pass of the model, as its caller gave
    it: ``prompt_lookup`` tokens guessed from the prompt (None: off), or a ``draft``
    model's guesses (its name or folder; None: none). :meth:`check` refuses what no
    caller may ask, naming the settings as the caller spells them."""

    prompt_lookup: int | None = None
    draft: str | None = None

    @property
    def active(self) -> bool:
        """Whether a pass may make more than one token."""
        return self.prompt_lookup is not None or self.draft is not None

    def check(self, lookup: str = "--prompt-lookup", draft: str = "--draft") -> None:
        """One line (:class:`~layerfit.errors.InputError`) for prompt lookup and a draft
        together, or a lookup outside 1..:data:`PROMPT_LOOKUP_MAX`."""
        if self.prompt_lookup is not None and self.draft is not None:
            raise InputError(f"{lookup} and {draft} are two ways to guess tokens: give one of the two")
        n = self.prompt_lookup
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= PROMPT_LOOKUP_MAX):
            raise InputError(f"{lookup} must be a number of tokens from 1 to {PROMPT_LOOKUP_MAX}, not {n!r}")


__all__ = [
    "CHAT_ROLES",
    "PROMPT_LOOKUP_MAX",
    "Refusal",
    "Speculation",
    "TOKENIZER_FILES",
    "chat_prompt_ids",
    "check_generation_length",
    "check_messages",
    "check_prompt_ids",
    "completion_token_count",
    "config_of",
    "end_tokens",
    "generated_tokens",
    "has_tokenizer",
    "read_tokenizer",
    "refusal",
    "tokens_per_pass",
    "vocab_of",
]
