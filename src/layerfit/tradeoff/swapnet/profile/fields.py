"""The checks a stored profile's JSON fields pass before they become records.

Each raises :class:`~layerfit.errors.ProfileError` naming the field (``where``, e.g.
``coefficients.alpha_s_per_byte`` or ``models['...'].read_s[3]``) and what it expects,
so that a hand-edited or truncated profile says exactly what is wrong with it.
"""

from __future__ import annotations

import math
from typing import Any

from layerfit.errors import ProfileError


def is_int(value: Any) -> bool:
    """An integer that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProfileError(f"{where}: expected a mapping, got {type(value).__name__} {value!r:.60}")
    return value


def string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ProfileError(f"{where}: expected a string, got {value!r:.60}")
    return value


def seconds(value: Any, where: str, negative: bool = False) -> float:
    """A finite number, >= 0 unless ``negative`` (NaN and infinity are refused)."""
    if not is_number(value) or (not negative and value < 0):
        kind = "a finite number" if negative else "a finite number >= 0"
        raise ProfileError(f"{where}: expected {kind}, got {value!r:.60}")
    return float(value)


def per_layer(value: Any, where: str, length: int, *, integer: bool) -> list:
    """One value per layer: ``length`` non-negative integers or finite seconds."""
    if not isinstance(value, list) or len(value) != length:
        got = f"{len(value)} values" if isinstance(value, list) else f"{type(value).__name__} {value!r:.60}"
        raise ProfileError(f"{where}: expected a list of {length} values (one per layer), got {got}")
    for k, v in enumerate(value):
        if integer and not (is_int(v) and v >= 0):
            raise ProfileError(f"{where}[{k}]: expected a non-negative integer, got {v!r:.60}")
        if not integer:
            seconds(v, f"{where}[{k}]")
    return [int(v) for v in value] if integer else [float(v) for v in value]
