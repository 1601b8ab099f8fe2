"""Decoding in the runtime: each language model's decode loop, its engine and tokenizer.

The runtime's room for text generation (the :class:`~layerfit.schedule.runtime.executor.Runtime`
exposes it as :meth:`~layerfit.schedule.runtime.executor.Runtime.decoder`,
:meth:`~layerfit.schedule.runtime.executor.Runtime.generate` and
:meth:`~layerfit.schedule.runtime.executor.Runtime.cannot_generate`). A READY model that
generates (:func:`~layerfit.schedule.decoding.rules.refusal`, batched, and a tokenizer
in its folder) gets one :class:`~layerfit.schedule.decoding.batching.DecodeLoop` on its
first request: its own streaming engine and thread, its weight buffers and every KV cache
held in the runtime's memory ledger while sequences are in flight. The loop follows its
model: a model unloaded, replaced by a reload or taken out of service has its loop
*retired* (no new sequence; those in flight decode to their end, then the loop returns
its memory and closes its engine); shutting the runtime down closes every loop.

A tokenizer that does not load keeps the model from generating with the reason, said
once per version of the model (:class:`~layerfit.errors.ModelNotReadyError`, one line,
never a traceback).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layerfit.errors import (
    GenerationTooLargeError,
    InputError,
    JobTimeoutError,
    LayerfitError,
    ModelNotReadyError,
    UnknownModelError,
)
from layerfit.schedule.decoding.batching import DecodeEngine, DecodeLoop, Finish, OnToken, Sequence
from layerfit.schedule.decoding.draft import DRAFT_TOKENS, Drafter
from layerfit.schedule.decoding.lookup import PromptLookup, check_lookup
from layerfit.schedule.decoding.rules import (
    Refusal,
    chat_prompt_ids,
    check_generation_length,
    end_tokens,
    has_tokenizer,
    read_tokenizer,
    refusal,
    vocab_of,
)
from layerfit.schedule.decoding.sampling import Sampling
from layerfit.store.manifest import read_manifest

if TYPE_CHECKING:
    from layerfit.schedule.ledger import MemoryLedger
    from layerfit.schedule.runtime.repository import ModelInfo
    from layerfit.store.manifest import Manifest

log = logging.getLogger("layerfit.runtime")

DEFAULT_MAX_WAITING = 64
"""Sequences of one model waiting for memory when the runtime has no queue limit."""


@dataclass
class LanguageModel:
    """A generating model as the runtime opened it: its loop, tokenizer, Hugging Face
    config (its positions) and end tokens, for the version of its ``manifest``."""

    name: str
    loop: DecodeLoop
    tokenizer: Any
    config: Any
    end_tokens: frozenset[int]
    manifest: Manifest | None = field(repr=False, default=None)
    lookup: int = 0  # prompt lookup's proposals per step, unless a request asks for its own

    def encode(self, text: str) -> tuple[int, ...]:
        """``text``'s token ids (:class:`~layerfit.errors.InputError`: none)."""
        ids = tuple(int(i) for i in self.tokenizer(text)["input_ids"])
        if not ids:
            raise InputError("the prompt makes no tokens: give some text")
        return ids

    def chat(self, messages: list[dict[str, str]]) -> tuple[int, ...]:
        """The chat's token ids through the tokenizer's chat template, ready for the reply
        (the rule ``layerfit generate --chat`` follows too: :func:`chat_prompt_ids`)."""
        return tuple(chat_prompt_ids(self.tokenizer, messages, f"model {self.name!r}"))

    def check_length(self, n: int, max_tokens: int) -> None:
        """Refuse (:class:`~layerfit.errors.GenerationTooLargeError`) ``n`` prompt tokens
        and ``max_tokens`` new ones past the model's positions: callable on a list's
        length before anything is made of it."""
        check_generation_length(self.config, n, max_tokens, model=f"model {self.name!r}", error=GenerationTooLargeError)

    def check(self, prompt: tuple[int, ...] | list[int], max_tokens: int) -> None:
        """Refuse a prompt and new tokens past the positions (413) and ids outside the
        vocabulary, negative ones too (:class:`~layerfit.errors.InputError`): before the
        request joins a batch, whose other sequences its failure would otherwise end."""
        self.check_length(len(prompt), max_tokens)
        self.loop.check_prompt(prompt)

    def submit(self, prompt: tuple[int, ...] | list[int], max_tokens: int, sampling: Sampling,
               on_token: OnToken, lookup: int | None = None, draft: bool | None = None) -> Sequence:
        """Queue a sequence in the loop (its tokens go to ``on_token``); refused at once
        past the positions or the budget (413), with a bad id or speculation (400) or a
        full queue (429). A greedy sequence proposes tokens each step: the model's draft's
        (``draft``; None: when it has one, unless ``lookup`` asks for prompt lookup), or up
        to ``lookup`` by prompt lookup (None: the model's :attr:`lookup`); a sampled one
        proposes none."""
        self.check(prompt, max_tokens)
        proposals = check_lookup(self.lookup if lookup is None else lookup)
        has_draft = self.loop.drafter is not None
        if draft and not has_draft:
            raise InputError(f"draft: model {self.name!r} has no draft model (layerfit serve --draft "
                             f"{self.name}=DRAFT gives it one)")
        if draft and lookup:
            raise InputError("prompt_lookup and draft are two ways to propose tokens: ask for one of the two")
        drafting = has_draft and draft is not False and not lookup and sampling.greedy
        return self.loop.submit(Sequence(list(prompt), max_tokens, sampling, self.end_tokens, on_token,
                                         lookup=proposals if sampling.greedy and not drafting else 0,
                                         draft=drafting))


class Decoders:
    """The decode loops of a runtime's language models, by name.

    ``models`` is the repository's :class:`~layerfit.schedule.runtime.repository.ModelInfo`
    by name, ``ledger`` the runtime's; ``engine(directory)`` opens a model's streaming
    engine. ``max_waiting`` sequences of one model may wait for memory; ``kept_share`` of
    the budget is what a loop's engine may keep weights in while it decodes;
    ``prompt_lookup`` how many tokens each model's sequences propose per step
    (:meth:`configure`)."""

    def __init__(
        self, models: Mapping[str, ModelInfo], ledger: MemoryLedger,
        engine: Callable[[Path], DecodeEngine], *, max_waiting: int | None = None,
    ) -> None:
        self._models = models
        self._ledger = ledger
        self._engine = engine
        self.max_waiting = max_waiting or DEFAULT_MAX_WAITING
        self.kept_share = 0.0
        self.prompt_lookup = PromptLookup()
        self.drafts: Mapping[str, str] = {}  # a model's draft model, by the model's name
        self.draft_tokens = DRAFT_TOKENS
        self._open: dict[str, LanguageModel] = {}
        self._broken: dict[str, tuple[Any, str]] = {}  # why a model's tokenizer did not load, by its manifest
        self._lock = threading.Lock()
        self._closed = False

    def configure(self, *, max_waiting: int | None = None, kept_share: float | None = None,
                  prompt_lookup: PromptLookup | None = None, drafts: Mapping[str, str] | None = None,
                  draft_tokens: int | None = None) -> None:
        """Set the waiting queue of each loop, the budget share for kept weights, each
        model's prompt lookup, draft model (another model of the repository, by name) and
        the tokens a draft proposes per step (for the loops opened from now on)."""
        if prompt_lookup is not None:
            self.prompt_lookup = prompt_lookup
        if drafts is not None:
            self.drafts = dict(drafts)
        if draft_tokens is not None:
            self.draft_tokens = check_lookup(draft_tokens, "draft_tokens")
        if max_waiting is not None:
            self.max_waiting = max_waiting
        if kept_share is not None:
            if not 0 <= kept_share < 1:
                raise InputError(f"kept_share must be from 0 up to (not including) 1, not {kept_share}")
            self.kept_share = kept_share

    # --- which models generate -------------------------------------------------------

    def cannot_generate(self, name: str, manifest: Manifest | None = None) -> str | None:
        """Why model ``name`` cannot generate text, or None when it can (it may still be
        loading: readiness is checked when a request comes); judged from ``manifest``,
        default the loaded model's, else its folder's."""
        if manifest is None:
            info = self._info(name)
            manifest = info.manifest if info.manifest is not None else read_manifest(info.directory)
        kind = refusal(manifest, batched=True)
        model = manifest.model
        if kind is Refusal.NOT_HUGGING_FACE:
            return f"model {name!r} was not prepared from a Hugging Face language model (it is {model.get('name')!r})"
        if kind is not None:
            return (f"model {name!r} is a {model.get('name')}: the runtime generates with decoder-only "
                    "language models (a …ForCausalLM class)")
        if not has_tokenizer(self._info(name).directory):
            return f"model {name!r} has no tokenizer in its folder (prepare it from a folder that holds one)"
        return None

    # --- the loops -----------------------------------------------------------------------

    def current(self, name: str) -> LanguageModel | None:
        """The loop of model ``name`` if it is open for the version READY now, else None;
        never blocks (a request's fast path: no lock, no thread)."""
        model, info = self._open.get(name), self._models.get(name)
        if model is None or info is None or not info.loaded or model.manifest is not info.manifest:
            return None
        return None if model.loop.retired else model

    def decoder(self, name: str) -> LanguageModel:
        """The open loop of READY model ``name`` (opened now on its first request, or anew
        for a version loaded since); :class:`~layerfit.errors.ModelNotReadyError` when it
        is not READY or its tokenizer does not load."""
        with self._lock:
            if self._closed:
                raise ModelNotReadyError("the runtime is shut down: it decodes no more")
            info = self._info(name)
            manifest = info.manifest
            current = self._open.get(name)
            if current is not None and (not info.loaded or current.manifest is not manifest):
                self._retire_locked(name)
                current = None
            if not info.loaded or manifest is None:
                raise ModelNotReadyError(f"model {name!r} is not ready ({info.reason}); load it first")
            if current is not None:
                return current
            reason = self.cannot_generate(name, manifest)
            if reason is not None:
                raise InputError(f"cannot generate with {name!r}: {reason}")
            self._open[name] = opened = self._open_locked(name, info.directory, manifest)
            return opened

    def _open_locked(self, name: str, directory: Path, manifest: Manifest) -> LanguageModel:
        """Open the model's tokenizer, engine and loop (lock held)."""
        broken = self._broken.get(name)
        if broken is not None and broken[0] is manifest:  # tried once since it was loaded: said once
            raise ModelNotReadyError(broken[1])
        try:
            tokenizer = _tokenizer(name, directory)
        except ModelNotReadyError as exc:
            self._broken[name] = (manifest, str(exc))
            raise
        engine = self._engine(directory)
        try:
            kind = refusal(manifest, engine.model, batched=True)
            if kind is not None:
                raise InputError(f"cannot generate with {name!r}: its {type(engine.model).__name__} {kind}")
            kept = int(self._ledger.budget * self.kept_share) or None
            drafter = self._drafter(name, vocab_of(engine.model))
            loop = DecodeLoop(name, engine, self._ledger, max_waiting=self.max_waiting, kept_budget=kept,
                              drafter=drafter)
        except BaseException:
            engine.close()
            raise
        config = engine.model.config
        return LanguageModel(name, loop, tokenizer, config, end_tokens(config, tokenizer), manifest,
                             self.prompt_lookup.of(name))

    def _drafter(self, name: str, vocab: int | None) -> Drafter | None:
        """Model ``name``'s draft (:attr:`drafts`), its engine opened and preloaded; None
        (said once in the log) when it has none or its draft cannot be one: a model that
        does not generate, or one of another vocabulary."""
        draft = self.drafts.get(name)
        if draft is None:
            return None
        try:
            info = self._info(draft)
            kind = refusal(read_manifest(info.directory), batched=True)
            if kind is not None:
                raise InputError(f"it is {kind}")
            engine = self._engine(info.directory)
        except LayerfitError as exc:
            log.warning("model %r decodes without its draft %r: %s", name, draft, exc)
            return None
        try:
            if vocab_of(engine.model) != vocab:
                raise InputError(f"its vocabulary has {vocab_of(engine.model)} ids, the model's {vocab}")
            engine.reconfigure(budget=None, pipeline="preload")  # resident: it runs several passes a step
            return Drafter(draft, engine, int(engine.memory.weight_bytes), self.draft_tokens)
        except LayerfitError as exc:
            engine.close()
            log.warning("model %r decodes without its draft %r: %s", name, draft, exc)
            return None
        except BaseException:
            engine.close()
            raise

    def retire(self, name: str, manifest: Manifest | None = None) -> None:
        """Retire model ``name``'s loop (unless it decodes ``manifest``, the version still
        serving): its sequences end, then it closes."""
        with self._lock:
            current = self._open.get(name)
            if current is not None and (manifest is None or current.manifest is not manifest):
                self._retire_locked(name)

    def _retire_locked(self, name: str) -> None:
        model = self._open.pop(name)
        model.loop.retire()

    def stats(self, name: str) -> dict[str, int]:
        """Model ``name``'s decode loop: steps, tokens, sequences in flight and waiting,
        bytes held (all 0 before its first request)."""
        model = self._open.get(name)
        return dict.fromkeys(DecodeLoop.STATS, 0) if model is None else model.loop.stats()

    def all_stats(self) -> dict[str, dict[str, int]]:
        """:meth:`stats` of every open decode loop, by model."""
        with self._lock:
            models = dict(self._open)
        return {name: model.loop.stats() for name, model in models.items()}

    def close(self, *, final: bool = False) -> None:
        """Close every loop: their sequences end (cancelled), their memory returns; with
        ``final`` (the runtime shuts down) no loop opens again."""
        with self._lock:
            models, self._open = list(self._open.values()), {}
            self._closed = self._closed or final
        for model in models:
            model.loop.close()

    def _info(self, name: str) -> ModelInfo:
        info = self._models.get(name)
        if info is None:
            raise UnknownModelError(f"no model {name!r} in the repository")
        return info


def generate_tokens(model: LanguageModel, prompt: list[int] | tuple[int, ...], max_tokens: int,
                    sampling: Sampling, timeout: float | None = None,
                    lookup: int | None = None, draft: bool | None = None) -> tuple[list[int], Finish]:
    """Decode ``prompt`` in ``model``'s loop beside every other sequence (proposing up to
    ``lookup`` tokens a step, or its draft's: :meth:`LanguageModel.submit`); its new tokens
    and why it ended (the Python API's blocking call)."""
    tokens: list[int] = []
    ended: list[tuple[Finish | None, BaseException | None]] = []
    done = threading.Event()

    def on_token(token: int | None, finish: Finish | None, error: BaseException | None) -> None:
        if token is not None:
            tokens.append(token)
        else:
            ended.append((finish, error))
            done.set()

    sequence = model.submit(prompt, max_tokens, sampling, on_token, lookup, draft)
    if not done.wait(timeout):
        model.loop.cancel(sequence)
        raise JobTimeoutError(f"generation did not finish within {timeout:g} s and was cancelled")
    finish, error = ended[0]
    if error is not None:
        raise error
    assert finish is not None
    return tokens, finish


def _tokenizer(name: str, directory: Path) -> Any:
    """The model's tokenizer, never running the folder's code; a tokenizer that does not
    load is :class:`~layerfit.errors.ModelNotReadyError` saying why in one line (logged
    as one line too, never a traceback)."""
    try:
        return read_tokenizer(directory)
    except Exception as exc:
        reason = (str(exc).strip().splitlines() or [""])[0][:300]
        log.warning("model %r: its tokenizer does not load: %s: %s", name, type(exc).__name__, reason)
        raise ModelNotReadyError(
            f"model {name!r} cannot generate: its tokenizer does not load ({type(exc).__name__}: {reason}); "
            "prepare the model again from a folder whose tokenizer loads"
        ) from None


__all__ = ["DEFAULT_MAX_WAITING", "Decoders", "LanguageModel", "generate_tokens"]
