"""A model's own ``generate`` (Hugging Face's) with every forward pass streamed.

A decoder generates one token per forward pass: ``generate`` calls the model
(``self(**inputs)``) again and again, with the KV cache and a new token, around its own
logic (sampling, beams, stopping criteria, logits processors). An engine is called like
the model, but ``generate`` belongs to the model and calls the model, not the engine.
:func:`generate` runs it on the engine's skeleton with the skeleton's ``forward``
replaced for the call by one that runs each pass through the engine: the units bound,
streamed and released as for any inference, and the same bits as ``model.generate``.

An encoder-decoder's ``generate`` (T5, BART, Whisper) calls its encoder once, outside the
model's forward, then the model once per token with the encoder's output. The encoder's
``forward`` is replaced too, for the call, by a pass that streams only the encoder's
units (:class:`~layerfit.engine.parts.Part`); each decoder step begins at the first unit
it runs, so it reads only the decoder's.

Several tokens per pass: transformers' assisted generation (``prompt_lookup_num_tokens``,
``assistant_model``) verifies guessed tokens with one pass of the model, through the same
replaced ``forward``. A draft given as an engine (``assistant_model=`` an
:class:`~layerfit.engine.engine.Engine` or a ``PretrainedModel``, loaded with its own
budget, usually all resident) runs its passes through its own engine the same way, for
the call. :class:`PassCount`, given as ``passes=``, counts the passes each made.

What it cannot stream: a ``generate`` that runs some other part of the model outside its
forward pass would run it with unbound weights; that is refused with a clear error
(decode with a loop of engine calls instead). Planned activations fix every shape at
prepare and the shapes change each step, so an engine loaded with them is refused too.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torch import nn

from layerfit.engine.part_units import encoder_name, part_units
from layerfit.errors import LayerfitError

if TYPE_CHECKING:
    from layerfit.engine.engine import Engine


@dataclass
class PassCount:
    """The forward passes one :func:`generate` made: of the model (``model``: each makes
    one new token, or verifies a guess of several), of an encoder-decoder's encoder apart
    (``encoder``), and of a draft engine (``draft``). Pass one as ``passes=`` and read it
    after the call; it adds to what it holds."""

    model: int = 0
    encoder: int = 0
    draft: int = 0

    def _add(self, field: str) -> Callable[[], None]:
        def add() -> None:
            setattr(self, field, getattr(self, field) + 1)

        return add


def generate(engine: Engine, *args: Any, passes: PassCount | None = None, **kwargs: Any) -> Any:
    """``engine.model.generate(*args, **kwargs)``, each forward pass run by ``engine``;
    ``assistant_model`` may be an engine (or a ``PretrainedModel``), whose passes run
    through it; ``passes`` counts the passes of each."""
    model = engine.model
    method = getattr(model, "generate", None)
    if not callable(method):
        raise LayerfitError(
            f"{type(model).__name__} has no generate method: call the engine once per step "
            "instead (engine(token, past_key_values=..., use_cache=True))"
        )
    count = passes if passes is not None else PassCount()
    draft = _draft_engine(engine, kwargs.get("assistant_model"))
    with contextlib.ExitStack() as stack:
        stack.enter_context(streamed(engine, on_pass=count._add("model"), on_encoder_pass=count._add("encoder")))
        if draft is not None:
            kwargs["assistant_model"] = stack.enter_context(
                streamed(draft, on_pass=count._add("draft"), on_encoder_pass=count._add("draft"))
            )
        try:
            return method(*args, **kwargs)
        except RuntimeError as exc:
            if "meta" not in str(exc):
                raise
            raise LayerfitError(
                f"{type(model).__name__}.generate ran part of the model outside its forward "
                "pass (and outside its encoder), where its weights are not loaded: decode with "
                "a loop of engine calls instead (engine.part(name) runs a submodule as a pass)"
            ) from exc


def _draft_engine(engine: Engine, assistant: Any) -> Engine | None:
    """The engine of a draft given as ``assistant_model`` (an engine, or a
    ``PretrainedModel``'s), None for a model (or none): a draft that is the engine itself
    is refused (its one ``generate`` at a time would wait on itself)."""
    if assistant is None or isinstance(assistant, nn.Module):
        return None
    draft = getattr(assistant, "engine", assistant)  # a PretrainedModel's
    if not callable(getattr(draft, "run_pass", None)):
        raise LayerfitError(
            f"assistant_model is a {type(assistant).__name__}: give a model, or an engine (layerfit.load) of one"
        )
    if draft is engine:
        raise LayerfitError("assistant_model is the model itself: a draft is a second, smaller model")
    return draft


@contextlib.contextmanager
def streamed(
    engine: Engine, on_pass: Callable[[], None] | None = None, on_encoder_pass: Callable[[], None] | None = None,
) -> Iterator[nn.Module]:
    """The engine's model with its ``forward`` (and an encoder-decoder's encoder's) run
    through the engine for the ``with`` block: code that takes a model and calls it or
    its ``generate`` (a transformers ``pipeline``) streams every pass. One block at a
    time per engine (it holds ``engine.generating``); the model's own ``forward`` is back
    after it. ``on_pass`` (``on_encoder_pass``) is called at each pass of the model (of
    its encoder)."""
    if engine.arena is not None:
        raise LayerfitError(
            "generate runs the model at a new input shape every step, and planned activations "
            "fix every shape at prepare: load the model with activations='default'"
        )
    model = engine.model
    encoder = _encoder(engine)
    with engine.generating:
        patched = [(model, _streamed_forward(engine, model.forward, None, on_pass))]
        if encoder is not None:
            module, units = encoder
            patched.append((module, _streamed_forward(engine, module.forward, units, on_encoder_pass)))
        for module, forward in patched:
            module.forward = forward
        try:
            yield model
        finally:
            for module, _ in patched:
                del module.forward


def _streamed_forward(engine: Engine, forward: Any, units: range | None, on_pass: Callable[[], None] | None) -> Any:
    """``forward`` run as a pass of ``engine`` (of ``units`` only, when given), calling
    ``on_pass`` as each begins."""

    # generate reads forward's signature to choose what to pass (logits_to_keep,
    # cache_position ...): the replacement must show the same one.
    @functools.wraps(forward)
    def streamed(*a: Any, **k: Any) -> Any:
        if engine.pass_thread == threading.get_ident():
            # A pass already runs in this thread (a plain engine call made while
            # generate's forward is installed): the engine already streams it.
            return forward(*a, **k)
        if on_pass is not None:
            on_pass()
        return engine.run_pass(None, forward, a, k, units)

    return streamed


def _encoder(engine: Engine) -> tuple[nn.Module, range] | None:
    """An encoder-decoder's encoder, which its ``generate`` calls on its own, and its
    units; None for a decoder-only model."""
    name = encoder_name(engine.model)
    if name is None:
        return None
    if any(seg.name == name for block in engine.blocks for seg in block.segments):
        # Its own hooks would run outside the pass that the replaced forward makes.
        raise LayerfitError(
            f"the encoder {name} holds weights of its own (not in a submodule), which "
            "generate cannot stream: decode with a loop of engine calls instead "
            f"(engine.part({name!r}) runs the encoder as a pass)"
        )
    return engine.model.get_submodule(name), part_units(engine.blocks, name)
