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

What it cannot stream: a ``generate`` that runs some other part of the model outside its
forward pass would run it with unbound weights; that is refused with a clear error
(decode with a loop of engine calls instead). Planned activations fix every shape at
prepare and the shapes change each step, so an engine loaded with them is refused too.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from torch import nn

from layerfit.engine.part_units import encoder_name, part_units
from layerfit.errors import LayerfitError

if TYPE_CHECKING:
    from layerfit.engine.engine import Engine


def generate(engine: Engine, *args: Any, **kwargs: Any) -> Any:
    """``engine.model.generate(*args, **kwargs)``, each forward pass run by ``engine``."""
    model = engine.model
    method = getattr(model, "generate", None)
    if not callable(method):
        raise LayerfitError(
            f"{type(model).__name__} has no generate method: call the engine once per step "
            "instead (engine(token, past_key_values=..., use_cache=True))"
        )
    with streamed(engine):
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


@contextlib.contextmanager
def streamed(engine: Engine) -> Iterator[nn.Module]:
    """The engine's model with its ``forward`` (and an encoder-decoder's encoder's) run
    through the engine for the ``with`` block: code that takes a model and calls it or
    its ``generate`` (a transformers ``pipeline``) streams every pass. One block at a
    time per engine (it holds ``engine.generating``); the model's own ``forward`` is back
    after it."""
    if engine.arena is not None:
        raise LayerfitError(
            "generate runs the model at a new input shape every step, and planned activations "
            "fix every shape at prepare: load the model with activations='default'"
        )
    model = engine.model
    encoder = _encoder(engine)
    with engine.generating:
        patched = [(model, _streamed_forward(engine, model.forward, None))]
        if encoder is not None:
            module, units = encoder
            patched.append((module, _streamed_forward(engine, module.forward, units)))
        for module, forward in patched:
            module.forward = forward
        try:
            yield model
        finally:
            for module, _ in patched:
                del module.forward


def _streamed_forward(engine: Engine, forward: Any, units: range | None) -> Any:
    """``forward`` run as a pass of ``engine`` (of ``units`` only, when given)."""

    # generate reads forward's signature to choose what to pass (logits_to_keep,
    # cache_position ...): the replacement must show the same one.
    @functools.wraps(forward)
    def streamed(*a: Any, **k: Any) -> Any:
        if engine.pass_thread == threading.get_ident():
            # A pass already runs in this thread (a plain engine call made while
            # generate's forward is installed): the engine already streams it.
            return forward(*a, **k)
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
