"""A call's token axes checked against the model's positions, before the pass begins.

A text model has a fixed number of positions; an input longer than that fails deep in
its forward pass (a size mismatch of the position embeddings, an index out of range)
with a traceback that names neither the input nor the limit. :func:`check_positions` is
the one check of it, used by :class:`~layerfit.engine.Engine` (``layerfit run``, the
Python API) and the runtime's input checks (:mod:`layerfit.schedule.runtime.inputs`), so both
refuse such a call with the same one line
(:class:`~layerfit.errors.RequestTooLargeError`).

The limits are the manifest's: a text model prepared with varying shapes records each
length's most positions (:class:`~layerfit.store.variable_shapes.VariableShapes`). A
model prepared at a fixed shape records none; the positions its Hugging Face config
states (:func:`~layerfit.store.hf_folder.positions_of`) then bound its main input's
sequence axis, where that input is token ids.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from layerfit.errors import RequestTooLargeError
from layerfit.store.hf_folder import positions_of
from layerfit.store.manifest import Manifest

SEQUENCE_AXIS = 1  # (batch, sequence, ...): a Hugging Face text input's layout


def named_inputs(manifest: Manifest, main_input: str, args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The call's inputs by the names the manifest gives them: ``""`` for the positional
    input of a model prepared from one tensor (also when given as ``main_input=``), the
    keyword's name for a model prepared from keyword arguments (its positional input is
    ``main_input``)."""
    named = dict(kwargs)
    if manifest.input_keywords:
        if args:
            named.setdefault(main_input, args[0])
    elif args:
        named[""] = args[0]
    elif main_input in named:
        named[""] = named.pop(main_input)
    return named


def check_positions(manifest: Manifest, inputs: Mapping[str, Any], model: str, config: Any = None) -> None:
    """Refuse a call whose token axis is longer than the model's positions.

    ``inputs`` are the call's tensors by name (:func:`named_inputs`); ``config`` is the
    model's Hugging Face config where it has one, read only when the manifest records
    no limit. Anything not a tensor, or of too few dimensions, is left to the model.
    """
    for name, axis, limit in _limits(manifest, config):
        shape = getattr(inputs.get(name), "shape", None)
        if shape is None or axis >= len(shape) or shape[axis] <= limit:
            continue
        where = f"{name or 'input'} axis {axis}"
        raise RequestTooLargeError(
            f"model {model!r}: {where} is {shape[axis]} tokens, more than the model's {limit} positions "
            f"(give at most {limit})"
        )


def check_call(manifest: Manifest, model: Any, args: tuple, kwargs: Mapping[str, Any]) -> None:
    """:func:`check_positions` for a call of ``model`` (the skeleton an engine runs): its
    inputs named as the manifest names them, its config's positions where the manifest
    records none."""
    main = getattr(model, "main_input_name", "input_ids")
    check_positions(manifest, named_inputs(manifest, main, args, kwargs), manifest.model["name"],
                    getattr(model, "config", None))


def _limits(manifest: Manifest, config: Any) -> list[tuple[str, int, int]]:
    """``(input name, axis, most positions)`` of each bounded axis."""
    shapes = manifest.variable_shapes
    if shapes is not None:
        return [(name, axis, limit) for name, axis, symbol in shapes.axes if (limit := shapes.limit(symbol)) is not None]
    if config is None or getattr(config, "is_encoder_decoder", False):  # two lengths: only the manifest says which
        return []
    stated = positions_of(config)
    if stated is None:
        return []
    if manifest.input_keywords:
        dtypes = {name: dtype for name, _, dtype in manifest.input_keywords}
        main, dtype = "input_ids", dtypes.get("input_ids", "")
    else:
        main, dtype = "", manifest.input_dtype
    return [(main, SEQUENCE_AXIS, stated[1])] if dtype.startswith("int") else []  # token ids, not features


__all__ = ["check_call", "check_positions", "named_inputs"]
