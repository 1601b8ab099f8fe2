"""A model's own ``generate`` (Hugging Face's) with every forward pass streamed.

A decoder generates one token per forward pass: ``generate`` calls the model
(``self(**inputs)``) again and again, with the KV cache and a new token, around its own
logic (sampling, beams, stopping criteria, logits processors). An engine is called like
the model, but ``generate`` belongs to the model and calls the model, not the engine.
:func:`generate` runs it on the engine's skeleton with the skeleton's ``forward``
replaced for the call by one that runs each pass through the engine: the units bound,
streamed and released as for any inference, and the same bits as ``model.generate``.

What it cannot stream: a ``generate`` that runs part of the model outside its forward
pass, as an encoder-decoder's does with the encoder, would run it with unbound weights;
that is refused with a clear error (decode with a loop of engine calls instead). Planned
activations fix every shape at prepare and the shapes change each step, so an engine
loaded with them is refused too.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any

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
    if engine.arena is not None:
        raise LayerfitError(
            "generate runs the model at a new input shape every step, and planned activations "
            "fix every shape at prepare: load the model with activations='default'"
        )
    forward = model.forward

    # generate reads forward's signature to choose what to pass (logits_to_keep,
    # cache_position ...): the replacement must show the same one.
    @functools.wraps(forward)
    def streamed(*a: Any, **k: Any) -> Any:
        if engine.pass_thread == threading.get_ident():
            # A pass already runs in this thread (a plain engine call made while
            # generate's forward is installed): the engine already streams it.
            return forward(*a, **k)
        return engine.run_pass(None, forward, a, k)

    with engine.generating:
        model.forward = streamed
        try:
            return method(*args, **kwargs)
        except RuntimeError as exc:
            if "meta" not in str(exc):
                raise
            raise LayerfitError(
                f"{type(model).__name__}.generate ran part of the model outside its forward "
                "pass (as an encoder-decoder's generate runs its encoder), where its weights "
                "are not loaded: decode with a loop of engine calls instead"
            ) from exc
        finally:
            del model.forward
