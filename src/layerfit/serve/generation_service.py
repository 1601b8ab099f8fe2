"""Text generation for the HTTP routes: which models generate, prompts to tokens, the
checks a prompt must pass, and a completion's text as the decode loop makes it.

The Triton generate routes (:mod:`layerfit.serve.generate_routes`) and the OpenAI ones
(:mod:`layerfit.serve.openai_routes`) differ only in their JSON; both turn their body
into a :class:`TextRequest` and read a :class:`Completion`. Below this module, each
language model has one :class:`~layerfit.schedule.decoding.batching.DecodeLoop` (its own
streaming engine, opened on the model's first request) that decodes every request in
flight together, its weight buffers and KV caches held in the runtime's memory ledger.

A model generates when it was prepared from a Hugging Face folder whose class is a
decoder-only language model with ``generate`` (a ``…ForCausalLM``) and the folder holds
its tokenizer. Refusals, each one line: a model that is not in the repository (404,
``model_not_found`` under ``/v1``) or cannot generate (400, saying why), one whose
tokenizer does not load (503: the model's folder, not the request, is at fault), a
prompt holding an id outside the vocabulary (400), a prompt and ``max_tokens`` past the
model's positions or a KV cache past the budget (413), a full queue (429).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool

from layerfit.errors import (
    GenerationTooLargeError,
    JobTimeoutError,
    LayerfitError,
    ModelNotReadyError,
)
from layerfit.schedule.decoding.batching import DecodeLoop, Finish
from layerfit.schedule.decoding.batching import Sequence as Decoding
from layerfit.schedule.decoding.sampling import Sampling
from layerfit.serve.errors import BadRequestError, ModelNotFoundError, ShuttingDownError
from layerfit.serve.text_stream import TextStream
from layerfit.store.hf_folder import positions_of

log = logging.getLogger("layerfit.serve")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class TextRequest:
    """One generation request, whichever API it came by: the model, the prompt's token
    ids, at most ``max_tokens`` new tokens, how to choose them and where to stop."""

    model: str
    prompt: tuple[int, ...]
    max_tokens: int
    sampling: Sampling
    stops: tuple[str, ...] = ()


@dataclass
class Delta:
    """What one new token adds to the text (``token`` False: the text held back, given at
    the end), and ``finish`` (``stop`` or ``length``) on the last one."""

    text: str
    token: bool = True
    finish: str | None = None


@dataclass
class LanguageModel:
    """A generating model's loop, tokenizer and positions (None: the config states none)."""

    loop: DecodeLoop
    tokenizer: Any
    positions: tuple[str, int] | None
    end_tokens: frozenset[int]
    manifest: Any = field(repr=False, default=None)


class GenerationService:
    """The language models of a server's runtime and their completions."""

    def __init__(
        self, runtime: Any, registry: Any, *, timeout: float, max_waiting: int, kept_share: float = 0.0
    ) -> None:
        self.runtime = runtime
        self.registry = registry
        self.timeout = timeout  # the longest wait for one token
        self.max_waiting = max_waiting
        self.kept_share = kept_share  # of the budget, for a decode engine's kept weights
        self._models: dict[str, LanguageModel] = {}
        self._broken: dict[str, tuple[Any, str]] = {}  # why a model's tokenizer did not load, by its manifest
        self._lock = threading.Lock()

    # --- which models generate --------------------------------------------------------

    def cannot_generate(self, name: str) -> str | None:
        """Why model ``name`` cannot generate text, or None when it can (it may still be
        loading: readiness is checked when a request comes)."""
        try:
            manifest = self.registry.manifest(name)
        except LayerfitError as exc:
            return str(exc)
        model = manifest.model
        config = _config_of(manifest)
        if model.get("source") != "hf":
            return f"model {name!r} was not prepared from a Hugging Face language model (it is {model.get('name')!r})"
        if config.get("is_encoder_decoder") or not str(model.get("name", "")).endswith("ForCausalLM"):
            return (f"model {name!r} is a {model.get('name')}: the server generates with decoder-only "
                    "language models (a …ForCausalLM class)")
        info = self.registry.info(name)
        if not any((info.directory / f).is_file() for f in TOKENIZER_FILES):
            return f"model {name!r} has no tokenizer in its folder (prepare it from a folder that holds one)"
        return None

    def generating_models(self) -> list[str]:
        """The READY models that generate text."""
        return [n for n in self.registry.names() if self.registry.is_ready(n) and self.cannot_generate(n) is None]

    async def model(self, name: str) -> LanguageModel:
        """The loop and tokenizer of ``name`` (404: not in the repository, as OpenAI's
        clients expect; 400: a bad name or a model that cannot generate; 503: not loaded,
        or its tokenizer does not load), its engine opened on the first request."""
        try:
            self.registry.info(name)
        except ModelNotFoundError as exc:
            raise ModelNotFoundError(f"cannot generate with {name!r}: {exc}") from None
        except LayerfitError as exc:
            raise BadRequestError(f"cannot generate with {name!r}: {exc}") from None
        reason = self.cannot_generate(name)
        if reason is not None:
            raise BadRequestError(f"cannot generate with {name!r}: {reason}")
        self.registry.require_ready(name)
        manifest = self.registry.manifest(name)
        current = self._models.get(name)
        if current is not None and current.manifest is manifest:
            return current
        return await run_in_threadpool(self._open, name, manifest)

    def _open(self, name: str, manifest: Any) -> LanguageModel:
        """Open the model's engine, loop and tokenizer (a model reloaded since: anew)."""
        from transformers import AutoTokenizer

        from layerfit.engine import Engine

        with self._lock:
            current = self._models.get(name)
            if current is not None and current.manifest is manifest:
                return current
            directory = self.registry.info(name).directory
            broken = self._broken.get(name)
            if broken is not None and broken[0] is manifest:  # tried once since it was loaded: said once
                raise ModelNotReadyError(broken[1])
            try:
                tokenizer = _tokenizer(AutoTokenizer, name, directory)
            except ModelNotReadyError as exc:
                self._broken[name] = (manifest, str(exc))
                raise
            config = self.runtime.config
            engine = Engine(directory, pipeline="async", direct_io=config.direct_io, verify=config.verify)
            try:
                kept = int(self.runtime.ledger.budget * self.kept_share) or None
                loop = DecodeLoop(name, engine, self.runtime.ledger, max_waiting=self.max_waiting, kept_budget=kept)
            except BaseException:
                engine.close()
                raise
            model_config = engine.model.config
            ends = getattr(model_config, "eos_token_id", None)
            ends = ends if isinstance(ends, list) else [ends]
            end_tokens = frozenset(int(e) for e in [*ends, tokenizer.eos_token_id] if e is not None)
            self._models[name] = LanguageModel(loop, tokenizer, positions_of(model_config), end_tokens, manifest)
            if current is not None:
                current.loop.close()
            return self._models[name]

    def stats(self, name: str) -> dict[str, int]:
        """Model ``name``'s decode loop: steps, tokens, sequences in flight and waiting,
        bytes held (all 0 before its first request)."""
        model = self._models.get(name)
        return dict.fromkeys(DecodeLoop.STATS, 0) if model is None else model.loop.stats()

    def close(self) -> None:
        """Close every loop (the server stops): their sequences end, their memory returns."""
        with self._lock:
            models, self._models = list(self._models.values()), {}
        for model in models:
            model.loop.close()

    # --- prompts ------------------------------------------------------------------------

    def encode(self, model: LanguageModel, text: str) -> tuple[int, ...]:
        ids = tuple(int(i) for i in model.tokenizer(text)["input_ids"])
        if not ids:
            raise BadRequestError("the prompt makes no tokens: give some text")
        return ids

    def chat(self, model: LanguageModel, messages: list[dict[str, str]]) -> tuple[int, ...]:
        """The chat's token ids through the tokenizer's chat template, ready for the reply."""
        tokenizer = model.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise BadRequestError(
                f"model {model.loop.name!r} has no chat template in its tokenizer: use /v1/completions with a prompt"
            )
        try:
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as exc:  # the template's own error (a jinja exception): the messages' fault
            raise BadRequestError(f"the model's chat template refused the messages: {exc}") from None
        ids = tuple(int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"])
        if not ids:
            raise BadRequestError("the messages make no tokens")
        return ids

    def check(self, model: LanguageModel, request: TextRequest) -> None:
        """Refuse a prompt and new tokens past the model's positions (413) and token ids
        outside the vocabulary, negative ones too (400): before the request joins a batch,
        whose other sequences its failure would otherwise end."""
        self.check_length(model, len(request.prompt), request.max_tokens)
        try:
            model.loop.check_prompt(request.prompt)
        except LayerfitError as exc:
            raise BadRequestError(str(exc)) from None

    def check_length(self, model: LanguageModel, n: int, max_tokens: int) -> None:
        """Refuse (413) ``n`` prompt tokens and ``max_tokens`` new ones past the model's
        positions: called on a list of ids before anything is made of it."""
        if model.positions is None:
            return
        field_name, positions = model.positions
        if n + max_tokens > positions:
            raise GenerationTooLargeError(
                f"the prompt's {n} tokens and max_tokens {max_tokens} make {n + max_tokens} "
                f"positions; model {model.loop.name!r} has {positions} ({field_name})"
                + (f": ask for at most {positions - n} tokens" if n < positions else "")
            )

    # --- completions ---------------------------------------------------------------------

    def start(self, model: LanguageModel, request: TextRequest) -> Completion:
        """Submit ``request`` to the model's loop (413/429 at once); read the result."""
        self.check(model, request)
        return Completion(model, request, self.timeout)

    def start_admitted(
        self, model: LanguageModel, request: TextRequest, admit: Callable[[], contextlib.AbstractContextManager],
        slot: contextlib.ExitStack | None = None,
    ) -> tuple[Completion, contextlib.ExitStack]:
        """:meth:`start` inside the server's admission slot (``admit``, the data plane's),
        entered into ``slot`` (default: a new one; the request's memory may be in it already),
        which the caller closes when the response has been sent; closed at once if
        starting fails."""
        slot = slot if slot is not None else contextlib.ExitStack()
        slot.enter_context(admit())
        try:
            return self.start(model, request), slot
        except BaseException:
            slot.close()
            raise


class Completion:
    """A completion in progress: iterate for each token's :class:`Delta`; ``usage`` counts
    the prompt's and the new tokens. Leaving the iteration early (the client went away)
    takes the sequence out of the batch and frees its cache."""

    def __init__(self, model: LanguageModel, request: TextRequest, timeout: float) -> None:
        self.model = model
        self.request = request
        self.timeout = timeout
        self.text = TextStream(model.tokenizer, request.stops)
        self.tokens = 0
        self.finish: str | None = None
        loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[int | None, Finish | None, BaseException | None]] = asyncio.Queue()

        def on_token(token: int | None, finish: Finish | None, error: BaseException | None) -> None:
            with contextlib.suppress(RuntimeError):  # the event loop closed: nobody reads
                loop.call_soon_threadsafe(self._queue.put_nowait, (token, finish, error))

        self._sequence = model.loop.submit(
            Decoding(list(request.prompt), request.max_tokens, request.sampling, model.end_tokens, on_token)
        )

    @property
    def usage(self) -> dict[str, int]:
        prompt = len(self.request.prompt)
        return {"prompt_tokens": prompt, "completion_tokens": self.tokens, "total_tokens": prompt + self.tokens}

    async def __aiter__(self) -> AsyncIterator[Delta]:
        try:
            while self.finish is None:
                try:
                    token, finish, error = await asyncio.wait_for(self._queue.get(), self.timeout)
                except asyncio.TimeoutError:
                    raise JobTimeoutError(f"no token came within {self.timeout:g} s; the request was cancelled") from None
                if error is not None:
                    if isinstance(error, LayerfitError):
                        raise error
                    raise LayerfitError(f"generation failed: {type(error).__name__}: {error}") from error
                if token is None:
                    if finish is Finish.CANCELLED:  # the loop closed: the server is stopping
                        raise ShuttingDownError("the server shut down before this request finished")
                    self.finish = str(finish)
                    yield Delta(self.text.finish(), token=False, finish=self.finish)
                    return
                self.tokens += 1
                delta = self.text.push(token)
                if self.text.stopped:
                    self.finish = Finish.STOP.value
                    yield Delta(delta, finish=self.finish)
                    return
                yield Delta(delta)
        finally:
            self.cancel()

    def cancel(self) -> None:
        """Take the sequence out of the batch unless the loop ended it (idempotent)."""
        if self.finish is None or self.text.stopped:
            self.model.loop.cancel(self._sequence)

    async def collect(self) -> str:
        """The whole text (the non-streaming routes)."""
        parts = [delta.text async for delta in self]
        return "".join(parts)


def _tokenizer(auto_tokenizer: Any, name: str, directory: Any) -> Any:
    """The model's tokenizer, never running the folder's code; a tokenizer that does not
    load is a 503 saying why in one line (logged as one line too, never a traceback)."""
    try:
        return auto_tokenizer.from_pretrained(str(directory), local_files_only=True, trust_remote_code=False)
    except Exception as exc:
        reason = (str(exc).strip().splitlines() or [""])[0][:300]
        log.warning("model %r: its tokenizer does not load: %s: %s", name, type(exc).__name__, reason)
        raise ModelNotReadyError(
            f"model {name!r} cannot generate: its tokenizer does not load ({type(exc).__name__}: {reason}); "
            "prepare the model again from a folder whose tokenizer loads"
        ) from None


def _config_of(manifest: Any) -> dict[str, Any]:
    """The Hugging Face config a manifest recorded (empty when it recorded none)."""
    kwargs = manifest.model.get("kwargs")
    if isinstance(kwargs, dict) and isinstance(kwargs.get("config"), dict):
        return kwargs["config"]
    return {}


def stops_of(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """A ``stop`` parameter (one string or several) as a tuple."""
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


__all__ = ["Completion", "Delta", "GenerationService", "LanguageModel", "TextRequest", "stops_of"]
