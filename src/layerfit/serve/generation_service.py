"""Text generation for the HTTP routes: requests in, a completion's text out, as the
runtime's decode loop makes it.

The Triton generate routes (:mod:`layerfit.serve.generate_routes`) and the OpenAI ones
(:mod:`layerfit.serve.openai_routes`) differ only in their JSON; both turn their body
into a :class:`TextRequest` and read a :class:`Completion`. The runtime owns decoding
(:mod:`layerfit.schedule.runtime.decoders`): each language model's one decode loop (its
own streaming engine, opened on the model's first request, retired with its model's
version) decodes every request in flight together, its weight buffers and KV caches held
in the runtime's memory ledger; which models generate and which prompts they take are
the rules of :mod:`layerfit.schedule.decoding.rules`, the command line's too. This module
only speaks HTTP's terms to it.

Refusals, each one line: a model that is not in the repository (404, ``model_not_found``
under ``/v1``) or cannot generate (400, saying why), one whose tokenizer does not load
(503: the model's folder, not the request, is at fault), a prompt holding an id outside
the vocabulary (400), a prompt and ``max_tokens`` past the model's positions or a KV
cache past the budget (413), a full queue (429).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from starlette.concurrency import run_in_threadpool

from layerfit.errors import InputError, JobTimeoutError, LayerfitError
from layerfit.schedule.decoding.batching import Finish
from layerfit.schedule.decoding.rules import completion_token_count
from layerfit.schedule.decoding.sampling import Sampling
from layerfit.schedule.runtime.decoders import LanguageModel
from layerfit.serve.errors import BadRequestError, ModelNotFoundError, ShuttingDownError
from layerfit.serve.registry import ModelRegistry
from layerfit.serve.text_stream import TextStream

T = TypeVar("T")


@dataclass(frozen=True)
class TextRequest:
    """One generation request, whichever API it came by: the model, the prompt's token
    ids, at most ``max_tokens`` new tokens, how to choose them, where to stop and how many
    tokens to propose per step (``prompt_lookup``; None: the server's setting for the model)
    or whether the model's draft proposes them (``draft``)."""

    model: str
    prompt: tuple[int, ...]
    max_tokens: int
    sampling: Sampling
    stops: tuple[str, ...] = ()
    prompt_lookup: int | None = None
    draft: bool | None = None  # the model's draft proposes (None: when it has one and no lookup is asked)


@dataclass
class Delta:
    """What one new token adds to the text (``token`` False: the text held back, given at
    the end), and ``finish`` (``stop`` or ``length``) on the last one."""

    text: str
    token: bool = True
    finish: str | None = None


class DecodingRuntime(Protocol):
    """What the generation routes ask of the runtime (:class:`~layerfit.Runtime` is one):
    its rule for which models generate, their decode loops, and the loops' counters."""

    def cannot_generate(self, name: str) -> str | None: ...

    def decoder(self, name: str) -> LanguageModel: ...

    def open_decoder(self, name: str) -> LanguageModel | None: ...

    def decoding_stats(self, name: str) -> dict[str, int]: ...


def _bad_request(call: Callable[[], T]) -> T:
    """``call()``, a refusal of the request's own (:class:`~layerfit.errors.InputError`) a 400."""
    try:
        return call()
    except InputError as exc:
        raise BadRequestError(str(exc)) from None


class GenerationService:
    """The language models of a server's runtime and their completions, in HTTP's terms."""

    def __init__(self, runtime: DecodingRuntime, registry: ModelRegistry, *, timeout: float) -> None:
        self.runtime = runtime
        self.registry = registry
        self.timeout = timeout  # the longest wait for one token

    # --- which models generate --------------------------------------------------------

    def cannot_generate(self, name: str) -> str | None:
        """Why model ``name`` cannot generate text, or None when it can (it may still be
        loading: readiness is checked when a request comes)."""
        try:
            self.registry.manifest(name)  # a bad name, an unknown model, an unreadable manifest
            return self.runtime.cannot_generate(name)
        except LayerfitError as exc:
            return str(exc)

    def generating_models(self) -> list[str]:
        """The READY models that generate text."""
        return [n for n in self.registry.names() if self.registry.is_ready(n) and self.cannot_generate(n) is None]

    async def model(self, name: str) -> LanguageModel:
        """The runtime's decoder of ``name`` (404: not in the repository, as OpenAI's
        clients expect; 400: a bad name or a model that cannot generate; 503: not loaded,
        or its tokenizer does not load), its loop opened on the first request."""
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
        model = self.runtime.open_decoder(name)  # open already: no thread needed
        return model if model is not None else await run_in_threadpool(_bad_request, lambda: self.runtime.decoder(name))

    def stats(self, name: str) -> dict[str, int]:
        """Model ``name``'s decode loop: steps, tokens, sequences in flight and waiting,
        bytes held (all 0 before its first request)."""
        return self.runtime.decoding_stats(name)

    # --- prompts ------------------------------------------------------------------------

    def encode(self, model: LanguageModel, text: str) -> tuple[int, ...]:
        return _bad_request(lambda: model.encode(text))

    def chat(self, model: LanguageModel, messages: list[dict[str, str]]) -> tuple[int, ...]:
        """The chat's token ids through the tokenizer's chat template, ready for the reply."""
        return _bad_request(lambda: model.chat(messages))

    def check_length(self, model: LanguageModel, n: int, max_tokens: int) -> None:
        """Refuse (413) ``n`` prompt tokens and ``max_tokens`` new ones past the model's
        positions: called on a list of ids before anything is made of it."""
        model.check_length(n, max_tokens)

    # --- completions ---------------------------------------------------------------------

    def start(self, model: LanguageModel, request: TextRequest) -> Completion:
        """Submit ``request`` to the model's loop (400/413/429 at once); read the result."""
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
        self.tokens = 0  # tokens of the text (each made by the model)
        self.ended_by_end_token = False  # the model made an end token, the sequence's last (not text)
        self.finish: str | None = None
        loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[int | None, Finish | None, BaseException | None]] = asyncio.Queue()

        def on_token(token: int | None, finish: Finish | None, error: BaseException | None) -> None:
            with contextlib.suppress(RuntimeError):  # the event loop closed: nobody reads
                loop.call_soon_threadsafe(self._queue.put_nowait, (token, finish, error))

        self._sequence = _bad_request(
            lambda: model.submit(request.prompt, request.max_tokens, request.sampling, on_token, request.prompt_lookup,
                                 request.draft)
        )

    @property
    def usage(self) -> dict[str, int]:
        """The prompt's tokens and the new ones the model made: each token of the text, and
        the end-of-sequence token that ended it, which is not text
        (:func:`~layerfit.schedule.decoding.rules.completion_token_count`, the command
        line's count too)."""
        prompt = len(self.request.prompt)
        # the sequence's tokens as the loop made them, up to the last given (a stop string
        # ends the text there, though a step may have made more) or the end token
        made = completion_token_count(self._sequence.tokens[:self.tokens + self.ended_by_end_token],
                                      self.model.end_tokens)
        return {"prompt_tokens": prompt, "completion_tokens": made, "total_tokens": prompt + made}

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
                    self.ended_by_end_token = finish is Finish.STOP  # the loop stops only at an end token
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


def stops_of(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """A ``stop`` parameter (one string or several) as a tuple."""
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


__all__ = ["Completion", "DecodingRuntime", "Delta", "GenerationService", "LanguageModel", "TextRequest", "stops_of"]
