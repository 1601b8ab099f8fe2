"""Engine units: consecutive stored layers read, bound and released together.

By default every layer is its own unit (Demand Layering). ``blocks:N`` groups the layers
into N contiguous blocks of roughly equal bytes (SwapNet's granularity); explicit
partition points (from the SwapNet partition search) give any other grouping. Because
layers are stored in execution order on aligned boundaries, a block is one contiguous
range of the weights file and is read with a single request.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from layerfit.errors import LayerfitError
from layerfit.store.manifest import Segment


@dataclass(frozen=True)
class Block:
    """Layers ``first..last`` (inclusive) of the stored model, read as one range."""

    index: int
    segments: tuple[Segment, ...]

    @property
    def offset(self) -> int:
        return self.segments[0].offset

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.segments)

    @property
    def name(self) -> str:
        first, last = self.segments[0].name, self.segments[-1].name
        return first if len(self.segments) == 1 else f"{first} .. {last}"


def blocks_from_points(units: Sequence[Segment], points: Sequence[int]) -> list[Block]:
    """Blocks that start at each layer index in ``points`` (0 is implied)."""
    starts = sorted({0, *points})
    if starts[-1] >= len(units) or starts[0] < 0:
        raise LayerfitError(f"partition points {list(points)} are outside 0..{len(units) - 1}")
    bounds = [*starts, len(units)]
    return [Block(i, tuple(units[a:b])) for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False))]


def equal_blocks(units: Sequence[Segment], n: int) -> list[Block]:
    """``n`` contiguous blocks of roughly equal bytes (fewer if there are fewer layers)."""
    n = max(1, min(n, len(units)))
    total = sum(u.nbytes for u in units)
    points, acc, k = [], 0, 1
    for i, u in enumerate(units):
        if i and acc >= k * total / n and len(points) < n - 1:
            points.append(i)
            k += 1
            while k < n and acc >= k * total / n:
                k += 1
        acc += u.nbytes
    return blocks_from_points(units, points)


def make_blocks(units: Sequence[Segment], spec: str | Sequence[int] = "layers") -> list[Block]:
    """Blocks for a granularity spec: ``layers``, ``blocks:N`` or explicit start points."""
    if not units:
        return []
    if not isinstance(spec, str):
        return blocks_from_points(units, list(spec))
    if spec == "layers":
        return [Block(i, (u,)) for i, u in enumerate(units)]
    match = re.fullmatch(r"blocks:(\d+)", spec)
    if match and int(match.group(1)) >= 1:
        return equal_blocks(units, int(match.group(1)))
    raise LayerfitError(f"unknown unit granularity {spec!r}: use layers or blocks:N (N >= 1)")
