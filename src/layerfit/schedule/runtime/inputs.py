"""A job's input checked against a prepared model, before the job is queued.

The runtime's memory estimates hold for the shape a model was prepared with, so a
request of another shape or dtype is refused at once with
:class:`~layerfit.errors.InputError` rather than run out of its budget — but for its
batch size (a larger batch is admitted by its activations grown in proportion, see
:meth:`~layerfit.schedule.runtime.frontend.JobFrontEnd.submit`), and along
the axes a text model's manifest marks as varying (batch, sequence lengths), whose
activations were measured at several shapes when it was prepared
(:mod:`layerfit.store.variable_shapes`): :func:`call_sizes` gives the size of each, and
the runtime admits the job by the activations at that shape. A model prepared from
keyword arguments (Whisper's features and decoder ids) takes a mapping of every one of
them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from layerfit.engine.positions import check_positions
from layerfit.errors import InputError
from layerfit.store.manifest import DTYPES, Manifest

ForwardCall = tuple[tuple[Any, ...], dict[str, Any]]  # (args, kwargs) of a forward pass


def forward_call(value: Any, name: str, manifest: Manifest) -> ForwardCall:
    """The arguments of model ``name``'s forward pass, ``(args, kwargs)``, from a job's
    input ``value``, checked against the model's manifest: a tensor (or a tuple of
    positional arguments), or for a model prepared from keyword arguments a mapping of
    each of them; either of them may also be ``value``'s entry for ``name``, when
    ``value`` maps model names to inputs."""
    keywords = manifest.input_keywords
    if isinstance(value, Mapping):
        if name in value:
            value = value[name]
        elif not (keywords and set(value) & {k for k, _, _ in keywords}):  # no mapping of this model's keywords
            takes = f"; it takes keyword arguments {_describe(keywords)}" if keywords else ""
            raise InputError(
                f"the job gives no input for model {name!r} (inputs for: {', '.join(map(str, value))}){takes}"
            )
    if keywords:
        return (), _keyword_call(value, name, keywords, manifest)
    args = tuple(value) if isinstance(value, Sequence) and not isinstance(value, str) else (value,)
    if not args or not isinstance(args[0], torch.Tensor):
        raise InputError(f"model {name!r} takes a tensor input, got {type(args[0] if args else None).__name__}")
    _check_tensor(args[0], name, "input", tuple(manifest.input_shape), manifest.input_dtype, _varying(manifest, ""))
    return args, {}


def call_sizes(call: ForwardCall, name: str, manifest: Manifest) -> dict[str, int] | None:
    """The size of each varying symbol (batch, sequence, ...) in a checked call of a model
    whose manifest marks varying axes; None for other models. Raises
    :class:`~layerfit.errors.RequestTooLargeError` for a length past the model's positions."""
    shapes = manifest.variable_shapes
    if shapes is None:
        return None
    args, kwargs = call
    tensors = dict(kwargs) if kwargs else {"": args[0]}
    check_positions(manifest, tensors, name)  # the engine's own check: one message for both
    return shapes.sizes_of({k: tuple(t.shape) for k, t in tensors.items()}, name)


def _varying(manifest: Manifest, input_name: str) -> frozenset[int]:
    """The axes of input ``input_name`` a request may size otherwise than prepared."""
    shapes = manifest.variable_shapes
    return frozenset(shapes.axes_of(input_name)) if shapes is not None else frozenset()


def _keyword_call(
    value: Any, name: str, keywords: Sequence[tuple[str, tuple[int, ...], str]], manifest: Manifest
) -> dict[str, Any]:
    """The keyword arguments of a model prepared from them: every one, each a tensor as prepared."""
    if not isinstance(value, Mapping):
        raise InputError(
            f"model {name!r} takes keyword arguments {_describe(keywords)}: give a mapping of them, not a "
            f"{type(value).__name__}"
        )
    names = [k for k, _, _ in keywords]
    if set(value) != set(names):
        sent = ", ".join(map(str, value)) or "none"
        raise InputError(f"model {name!r} takes keyword arguments {_describe(keywords)}; the job gives {sent}")
    for k, shape, dtype in keywords:
        if not isinstance(value[k], torch.Tensor):
            raise InputError(f"model {name!r}'s {k} must be a tensor, got {type(value[k]).__name__}")
        _check_tensor(value[k], name, k, tuple(shape), dtype, _varying(manifest, k))
    return {k: value[k] for k in names}


def _describe(keywords: Sequence[tuple[str, tuple[int, ...], str]]) -> str:
    return ", ".join(f"{k} (N, {', '.join(map(str, shape[1:]))}) {dtype}" for k, shape, dtype in keywords)


def _check_tensor(
    x: torch.Tensor, name: str, what: str, expected: tuple[int, ...], dtype: str, varying: frozenset[int] = frozenset()
) -> None:
    """Refuse a tensor of another dtype, or another shape than the prepared one's but for
    its batch size and its ``varying`` axes (the memory estimates hold for that shape)."""
    fixed = [i for i in range(1, len(expected)) if i not in varying]
    if (
        x.dim() != len(expected) or any(x.shape[i] != expected[i] for i in fixed)
        or any(x.shape[i] < 1 for i in varying) or x.dtype != DTYPES.get(dtype)
    ):
        shown = ", ".join("N" if i == 0 or i in varying else str(d) for i, d in enumerate(expected))
        raise InputError(
            f"model {name!r} expects {what} of shape ({shown}) and dtype "
            f"{dtype}, got shape {tuple(x.shape)} and dtype {str(x.dtype).removeprefix('torch.')}"
        )


__all__ = ["ForwardCall", "call_sizes", "forward_call"]
