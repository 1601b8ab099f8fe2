"""Inputs whose batch and sequence length vary, and what a pass costs at each shape.

A text model accepts any number of sequences of any length up to its positions, and the
memory a pass needs follows the shape: the hidden states grow with batch × length, the
attention scores with batch × length². A prepared text model therefore records which
axes of its inputs vary (each named by a *symbol*: ``batch``, ``sequence``,
``decoder_sequence``), the longest length its positions allow, and the activation bytes
of passes *measured* at several shapes when it was prepared (:mod:`.shape_samples`).

:meth:`VariableShapes.activation_bytes` fits ``c0 + b·(c1 + Σ ck·sk + dk·sk² + Σ ejk·sj·sk)``
to those samples by least squares (the terms of a transformer's tensors), then lifts it
by its worst underestimate among the samples, each also predicted from the others alone,
so the estimate is at least every measure and carries the error the fit makes on a
shape it did not see. The fit is recomputed from the samples when the
manifest is read: the manifest stores measurements only.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from layerfit.errors import InputError, RequestTooLargeError

BATCH = "batch"


@dataclass(frozen=True)
class ShapeSample:
    """Activation bytes of one measured pass, at ``sizes`` (one per symbol, in order)."""

    sizes: tuple[int, ...]
    activation_bytes: int


@dataclass(frozen=True)
class VariableShapes:
    """Which input and output axes vary, their limits, and the measured passes."""

    symbols: tuple[str, ...]  # "batch" first, then the lengths
    axes: tuple[tuple[str, int, str], ...]  # (input name, "" for the positional one; axis; symbol)
    limits: tuple[tuple[str, int], ...]  # a length symbol's most positions (none: any length)
    prepared: tuple[int, ...]  # the sizes of the example input the model was captured with
    samples: tuple[ShapeSample, ...]
    outputs: tuple[tuple[int, int, str], ...] = ()  # (output index, axis, symbol) that vary

    def limit(self, symbol: str) -> int | None:
        return dict(self.limits).get(symbol)

    def axes_of(self, name: str) -> dict[int, str]:
        """``{axis: symbol}`` of input ``name`` ("" for the positional input)."""
        return {axis: symbol for n, axis, symbol in self.axes if n == name}

    # --- a request's shape ------------------------------------------------------------

    def sizes_of(self, shapes: Mapping[str, tuple[int, ...]], model: str) -> dict[str, int]:
        """The size of each symbol in a call whose inputs have ``shapes`` (by name): every
        axis of one symbol must agree, and a length must be within the model's positions
        (:class:`RequestTooLargeError`, answered 413)."""
        sizes: dict[str, tuple[int, str]] = {}
        for name, axis, symbol in self.axes:
            if name not in shapes or axis >= len(shapes[name]):
                continue
            size, where = shapes[name][axis], f"{name or 'input'} axis {axis}"
            if symbol in sizes and sizes[symbol][0] != size:
                raise InputError(
                    f"model {model!r}: {where} is {size} but {sizes[symbol][1]} is {sizes[symbol][0]}; "
                    f"both are the {symbol.replace('_', ' ')} and must be equal"
                )
            sizes.setdefault(symbol, (size, where))
        for symbol, (size, where) in sizes.items():
            limit = self.limit(symbol)
            if limit is not None and size > limit:
                raise RequestTooLargeError(
                    f"model {model!r}: {where} is {size} tokens, more than the model's {limit} positions"
                )
        return {symbol: sizes.get(symbol, (prepared, ""))[0] for symbol, prepared in zip(self.symbols, self.prepared, strict=True)}

    # --- the estimate -----------------------------------------------------------------

    def activation_bytes(self, sizes: Mapping[str, int]) -> int:
        """Activation bytes of a pass at ``sizes`` (a size per symbol; missing: as prepared)."""
        coefficients, scale, offset = self._fit
        row = _features(self._sizes(sizes))
        return math.ceil(max(float(row @ coefficients), 0.0) * scale + offset)

    def prepared_activation_bytes(self) -> int:
        return self.activation_bytes(dict(zip(self.symbols, self.prepared, strict=True)))

    def describe(self, sizes: Mapping[str, int]) -> str:
        """``2 batch × 300 sequence``: a shape in words."""
        return " × ".join(f"{sizes[s]} {s.replace('_', ' ')}" for s in self.symbols if s in sizes)

    def _sizes(self, sizes: Mapping[str, int]) -> tuple[int, ...]:
        return tuple(int(sizes.get(s, p)) for s, p in zip(self.symbols, self.prepared, strict=True))

    @functools.cached_property
    def _fit(self) -> tuple[np.ndarray, float, float]:
        """Least-squares coefficients over the samples, then a factor and an offset that
        lift the fit to at least every measured value *and* every value predicted without
        that sample (leave one out): the margin a shape outside the samples needs,
        measured on the samples themselves."""
        rows = np.array([_features(s.sizes) for s in self.samples], dtype=np.float64)
        measured = np.array([s.activation_bytes for s in self.samples], dtype=np.float64)
        coefficients = _least_squares(rows, measured)
        pairs = [(m, max(float(r @ coefficients), 0.0)) for r, m in zip(rows, measured, strict=True)]
        if len(rows) > rows.shape[1]:  # enough left to fit every term without sample i
            for i in range(len(rows)):
                keep = np.arange(len(rows)) != i
                pairs.append((measured[i], max(float(rows[i] @ _least_squares(rows[keep], measured[keep])), 0.0)))
        # a relative error where the fit is near the measure, bytes where it is far off
        scale = max([1.0, *(m / p for m, p in pairs if p >= m / 2 and p > 0)])
        offset = max([0.0, *(m - p * scale for m, p in pairs)])
        return coefficients, scale, offset

    # --- manifest ---------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "symbols": list(self.symbols),
            "axes": [[n, a, s] for n, a, s in self.axes],
            "limits": {s: n for s, n in self.limits},
            "prepared": list(self.prepared),
            "samples": [[list(s.sizes), s.activation_bytes] for s in self.samples],
            "outputs": [[i, a, s] for i, a, s in self.outputs],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> VariableShapes:
        """Parse and check; ``ValueError``/``TypeError``/``KeyError`` on anything malformed."""
        symbols = tuple(_name(s) for s in d["symbols"])
        if not symbols or symbols[0] != BATCH or len(set(symbols)) != len(symbols):
            raise ValueError(f"variable shapes' symbols {list(symbols)} must start with {BATCH!r}, each once")
        shapes = cls(
            symbols=symbols,
            axes=tuple((str(n), _count(a, 0), _symbol(s, symbols)) for n, a, s in d["axes"]),
            limits=tuple((_symbol(s, symbols), _count(n)) for s, n in dict(d.get("limits", {})).items()),
            prepared=tuple(_count(x) for x in d["prepared"]),
            samples=tuple(
                ShapeSample(tuple(_count(x) for x in sizes), _count(b, 0)) for sizes, b in d["samples"]
            ),
            outputs=tuple((_count(i, 0), _count(a, 0), _symbol(s, symbols)) for i, a, s in d.get("outputs", ())),
        )
        width = len(symbols)
        if len(shapes.prepared) != width or any(len(s.sizes) != width for s in shapes.samples):
            raise ValueError("a sample's sizes do not name one size per symbol")
        if len(shapes.samples) < len(_features(shapes.prepared)):
            raise ValueError(f"{len(shapes.samples)} samples are too few to fit the activations' terms")
        return shapes


def _least_squares(rows: np.ndarray, measured: np.ndarray) -> np.ndarray:
    norms = np.maximum(np.abs(rows).max(axis=0), 1.0)  # columns of very different sizes
    solution, *_ = np.linalg.lstsq(rows / norms, measured, rcond=None)
    return solution / norms


def _features(sizes: tuple[int, ...]) -> np.ndarray:
    """The terms the activations are fitted over: 1, b, then b·s, b·s² of each length and
    b·sj·sk of each pair."""
    b, lengths = float(sizes[0]), [float(s) for s in sizes[1:]]
    terms = [1.0, b]
    terms += [b * s for s in lengths] + [b * s * s for s in lengths]
    terms += [b * x * y for x, y in itertools.combinations(lengths, 2)]
    return np.array(terms, dtype=np.float64)


def _name(value: object) -> str:
    if not isinstance(value, str) or not value.replace("_", "").isalpha():
        raise ValueError(f"{value!r} is not a symbol name")
    return value


def _symbol(value: object, symbols: tuple[str, ...]) -> str:
    if value not in symbols:
        raise ValueError(f"{value!r} is not one of the symbols {list(symbols)}")
    return str(value)


def _count(value: object, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{value!r} is not a whole number of at least {least}")
    return value


__all__ = ["BATCH", "ShapeSample", "VariableShapes"]
