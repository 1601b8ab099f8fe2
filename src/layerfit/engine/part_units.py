"""Which units a submodule owns, and how often each unit runs as the model generates.

A part of a model (an encoder-decoder's encoder, see :mod:`layerfit.engine.parts`)
streams as its own pass only if its units are contiguous in the prepared order and each
wholly inside it. :func:`unit_runs` says how often each unit runs as the model generates
(the decoder's once per token), which ``auto`` weighs when it chooses the units to keep;
the engine's plan (:mod:`layerfit.engine.plan`) uses it, so it sits below the engine.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from torch import nn

from layerfit.errors import InputError

if TYPE_CHECKING:
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


DECODER_RUNS = 16
"""How many times ``auto`` counts a decoder unit running for each time an encoder unit
runs: the tokens a ``generate`` call makes per input, roughly (the plan depends little
on the number once it is well above one)."""


def encoder_name(model: nn.Module) -> str | None:
    """The submodule an encoder-decoder's ``generate`` calls on its own, once per input
    (Hugging Face's ``config.is_encoder_decoder`` and ``get_encoder()``); None for any
    other model."""
    config = getattr(model, "config", None)
    get_encoder = getattr(model, "get_encoder", None)
    if not getattr(config, "is_encoder_decoder", False) or not callable(get_encoder):
        return None
    encoder = get_encoder()
    if encoder is model:
        return None
    return next((n for n, m in model.named_modules() if m is encoder), None)


CROSS_KEY_VALUE = re.compile(r"(^|\.)(encoder_attn\.[kv]_proj|EncDecAttention\.[kv])$")
"""A decoder layer's cross-attention key and value projections, by Hugging Face's names
(BART, Marian, mBART, Pegasus, Whisper; T5): they project the encoder's output, once per
input, and a cached decoder step skips them."""


def unit_runs(model: nn.Module, blocks: Sequence[Block]) -> list[int] | None:
    """How often each unit runs relative to the others when the model generates: an
    encoder-decoder's encoder units and its cross-attention key and value projections
    once, the others :data:`DECODER_RUNS` times. None when every unit runs once per
    inference (any other model, or an encoder whose units cannot run as one part)."""
    name = encoder_name(model)
    if name is None:
        return None
    try:
        encoder = part_units(blocks, name)
    except InputError:
        return None

    def once(i: int) -> bool:
        return i in encoder or all(CROSS_KEY_VALUE.search(seg.name) for seg in blocks[i].segments)

    return [1 if once(i) else DECODER_RUNS for i in range(len(blocks))]
