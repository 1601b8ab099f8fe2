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
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from torch import nn

from layerfit.errors import InputError

if TYPE_CHECKING:
    from layerfit.engine.engine import Engine
    from layerfit.engine.units import Block


def inside(name: str, module: str) -> bool:
    """Whether the module called ``name`` is ``module`` or one of its submodules."""
    return not module or name == module or name.startswith(module + ".")


def part_units(blocks: Sequence[Block], module: str) -> range:
    """The units of submodule ``module``: empty when all its weights are resident."""
    within = []
    for i, block in enumerate(blocks):
        flags = {inside(seg.name, module) for seg in block.segments}
        if flags == {True, False}:
            raise InputError(
                f"unit {i} ({block.name or '<root>'}) holds layers inside and outside {module}, "
                f"so {module} cannot run on its own (units merged by blocks:N or merge:SIZE are: "
                "load the model with units='layers')"
            )
        if True in flags:
            within.append(i)
    if not within:
        return range(0)
    units = range(within[0], within[-1] + 1)
    if len(units) != len(within):
        gap = next(i for i in units if i not in within)
        raise InputError(
            f"the units of {module} are not contiguous in the prepared order (unit {gap}, "
            f"{blocks[gap].name or '<root>'}, runs between them), so it cannot stream as one part"
        )
    return units


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
