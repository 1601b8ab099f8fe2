"""A text model's passes measured at several shapes while it is prepared.

:mod:`.variable_shapes` turns these measurements into the estimate the runtime admits a
request by. Each sample is one eager forward pass (no gradients, the model's state
restored after it) on seeded inputs of that shape, counted by the capture's
:class:`~layerfit.capture.allocations.PassAllocations`: the most bytes of tensors the pass
held at once, its inputs and outputs included, the weights not.

The lengths are the prepared length and its quarter, half, double, four and eight times
(within the model's positions), one at a time; with two lengths (an encoder-decoder's)
both together too; and batches of two and three, so every term of the fit is measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from layerfit.capture.activations import _flat_tensors
from layerfit.capture.allocations import PassAllocations
from layerfit.capture.units import StateGuard
from layerfit.store.examples import example_input
from layerfit.store.variable_shapes import BATCH, ShapeSample, VariableShapes

LONGEST = 8  # the longest sampled length, in multiples of the prepared one


def sample_sizes(symbols: tuple[str, ...], prepared: tuple[int, ...], limits: Mapping[str, int]) -> list[tuple[int, ...]]:
    """The shapes to measure, one size per symbol (see the module docstring)."""
    shapes = {prepared}
    lengths_of = {}
    for k in range(1, len(symbols)):
        length, cap = prepared[k], limits.get(symbols[k])
        top = LONGEST * length if cap is None else min(cap, LONGEST * length)
        lengths_of[k] = sorted({max(1, length // 4), max(1, length // 2), length,
                                *(n * length for n in (2, 4, LONGEST) if n * length <= top)})
        for n in lengths_of[k]:
            shapes.add(prepared[:k] + (n,) + prepared[k + 1:])
    if len(symbols) > 2:  # the cross terms: every length small together, then long together
        shapes.add((prepared[0], *(v[1] for v in lengths_of.values())))
        shapes.add((prepared[0], *(v[-1] for v in lengths_of.values())))
    half = (prepared[0], *(v[1] for v in lengths_of.values()))
    shapes |= {(2, *prepared[1:]), (2, *half[1:]), (3, *prepared[1:])}
    return sorted(shapes)


def measure_shapes(
    module: nn.Module,
    example: Any,
    axes: tuple[tuple[str, int, str], ...],
    ranges: Mapping[str, tuple[int, int]],
    limits: Mapping[str, int],
    seed: int,
) -> VariableShapes:
    """Measure ``module``'s passes at :func:`sample_sizes`' shapes around ``example`` (a
    tensor, or a dict of keyword tensors) whose ``axes`` vary."""
    symbols = (BATCH, *dict.fromkeys(s for _, _, s in axes if s != BATCH))
    prepared = _sizes_of(example, axes, symbols)
    samples, output_shapes = [], []
    shapes = sample_sizes(symbols, prepared, limits)
    was_training = module.training
    module.eval()
    try:
        for sizes in shapes:
            call = _resized(example, axes, dict(zip(symbols, sizes, strict=True)), ranges, seed)
            args, kwargs = ((), call) if isinstance(call, dict) else ((call,), {})
            allocations = PassAllocations(weights=[*module.parameters(), *module.buffers()], inputs=(args, kwargs))
            with StateGuard(module), torch.no_grad(), allocations:
                output = module(*args, **kwargs)
            samples.append(ShapeSample(sizes, allocations.peak))
            output_shapes.append([tuple(t.shape) for t in _flat_tensors(output)])
            del output
    finally:
        module.train(was_training)
    return VariableShapes(
        symbols=symbols,
        axes=axes,
        limits=tuple((s, n) for s, n in limits.items() if s in symbols),
        prepared=prepared,
        samples=tuple(samples),
        outputs=_varying_outputs(output_shapes, shapes, symbols),
    )


def _sizes_of(example: Any, axes: tuple[tuple[str, int, str], ...], symbols: tuple[str, ...]) -> tuple[int, ...]:
    tensors = example if isinstance(example, dict) else {"": example}
    found = {symbol: tensors[name].shape[axis] for name, axis, symbol in axes}
    return tuple(int(found[s]) for s in symbols)


def _resized(
    example: Any, axes: tuple[tuple[str, int, str], ...], sizes: Mapping[str, int],
    ranges: Mapping[str, tuple[int, int]], seed: int,
) -> Any:
    """Seeded inputs like ``example`` with each varying axis at its symbol's size."""
    tensors = example if isinstance(example, dict) else {"": example}
    call = {}
    for k, (name, tensor) in enumerate(tensors.items()):
        shape = list(tensor.shape)
        for n, axis, symbol in axes:
            if n == name:
                shape[axis] = sizes[symbol]
        low, high = ranges.get(name, (0, 32))
        call[name] = example_input(tuple(shape), str(tensor.dtype).removeprefix("torch."), seed + k, low=low, high=high)
    return call if isinstance(example, dict) else call[""]


def _varying_outputs(
    output_shapes: list[list[tuple[int, ...]]], shapes: list[tuple[int, ...]], symbols: tuple[str, ...]
) -> tuple[tuple[int, int, str], ...]:
    """(output index, axis, symbol) for each output axis that followed a symbol's size in
    every measured pass."""
    found = []
    first = output_shapes[0]
    for index, shape in enumerate(first):
        for axis in range(len(shape)):
            sizes = [s[index][axis] if index < len(s) and axis < len(s[index]) else None for s in output_shapes]
            if len(set(sizes)) == 1:
                continue  # fixed (a hidden size, a vocabulary)
            for k, symbol in enumerate(symbols):
                if all(size == sample[k] for size, sample in zip(sizes, shapes, strict=True)):
                    found.append((index, axis, symbol))
                    break
    return tuple(found)


__all__ = ["measure_shapes", "sample_sizes"]
