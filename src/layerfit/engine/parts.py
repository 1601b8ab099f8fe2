"""A part of a model (an encoder-decoder's encoder) run as its own streamed pass.

An encoder-decoder runs its encoder once per input and its decoder once per generated
token, each step given the encoder's output. A pass of the whole model begins at the
first unit it runs, so a decoder step already reads only the decoder; but the encoder
is called on its own (by ``generate``, or by a user's decoding loop), not through the
model's forward. :class:`Part` calls one submodule as a pass that may run only that
submodule's units: the reader reads those and stops at their end, instead of reading
ahead into units the part never runs.

A part's units must be contiguous in the prepared order and each wholly inside the
submodule (a unit merged across its border cannot be split); capture orders an
encoder's units before the decoder's when the example input runs the encoder first.
Which units a submodule owns is :mod:`layerfit.engine.part_units`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from layerfit.engine.part_units import part_units
from layerfit.errors import InputError

if TYPE_CHECKING:
    from layerfit.engine.engine import Engine


class Part:
    """Submodule ``name`` of an engine's model, called like the submodule: each call is
    a pass of the engine that streams only the submodule's units."""

    def __init__(self, engine: Engine, name: str) -> None:
        modules = dict(engine.model.named_modules())
        if name not in modules:
            children = ", ".join(n for n, _ in engine.model.named_children()) or "none"
            raise InputError(f"the model has no submodule {name!r} (its children: {children})")
        self.engine = engine
        self.name = name
        self.module: nn.Module = modules[name]
        self.units = part_units(engine.blocks, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.engine.run_pass(None, self.module, args, kwargs, self.units)

    def __repr__(self) -> str:
        span = f"units {self.units.start}-{self.units.stop - 1}" if self.units else "no streamed units"
        return f"Part({self.name!r}, {span})"
