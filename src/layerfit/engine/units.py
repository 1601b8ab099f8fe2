"""Engine units: consecutive stored layers read, bound and released together.

By default every layer is its own unit (Demand Layering). ``blocks:N`` groups the layers
into N contiguous blocks of roughly equal bytes (SwapNet's granularity); ``merge:SIZE``
joins consecutive layers into blocks of at most SIZE bytes (a larger layer stays alone),
so that a model's many small layers (norms, biases) are not one read and one task each;
explicit partition points (from the SwapNet partition search) give any other grouping.
Because layers are stored in execution order on aligned boundaries, a block is one
contiguous range of the weights file and is read with a single request.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from layerfit.errors import BudgetError, LayerfitError
from layerfit.sizes import parse_bytes
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
    """Exactly ``n`` contiguous blocks (at most one per layer) minimising the largest.

    The smallest feasible maximum block size is found by bisection with greedy packing;
    blocks are then split until there are ``n`` of them (splitting never grows the max).
    """
    sizes = [u.nbytes for u in units]
    n = max(1, min(n, len(sizes)))

    def pack(limit: int) -> list[int]:
        points, acc = [], 0
        for i, size in enumerate(sizes):
            if i and acc + size > limit:
                points.append(i)
                acc = 0
            acc += size
        return points

    lo, hi = max(sizes), sum(sizes)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(pack(mid)) + 1 <= n:
            hi = mid
        else:
            lo = mid + 1
    starts = [0, *pack(lo)]
    while len(starts) < n:  # split the largest block that has more than one layer
        bounds = [*starts, len(sizes)]
        spans = [(sum(sizes[a:b]), a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b - a > 1]
        _, a, b = max(spans)
        acc, cut = 0, a + 1
        for i in range(a, b - 1):
            acc += sizes[i]
            cut = i + 1
            if 2 * acc >= sum(sizes[a:b]):
                break
        starts = sorted({*starts, cut})
    return blocks_from_points(units, starts[1:])


def merged_blocks(units: Sequence[Segment], limit: int) -> list[Block]:
    """The fewest contiguous blocks of at most ``limit`` bytes each (a layer larger than
    ``limit`` is a block of its own): consecutive layers are packed greedily, which is
    optimal for a size cap on contiguous groups."""
    points, acc = [], 0
    for i, unit in enumerate(units):
        if i and acc + unit.nbytes > limit:
            points.append(i)
            acc = 0
        acc += unit.nbytes
    return blocks_from_points(units, points)


def check_units_spec(spec: str | Sequence[int]) -> None:
    """Raise :class:`LayerfitError` if ``spec`` is no granularity (checked before any model
    is opened, so that a typo fails at once, not at the first model)."""
    if not isinstance(spec, str):
        return
    if spec == "layers":
        return
    match = re.fullmatch(r"blocks:(\d+)", spec)
    if match and int(match.group(1)) >= 1:
        return
    if spec == "merge:auto":  # the runtime resolves it per model from its profile
        raise LayerfitError(
            "unit granularity 'merge:auto' is the runtime's (serve, schedule run), which merges "
            "layers within each model's minimum task memory; here give a size, e.g. merge:4MB"
        )
    if spec.startswith("merge:"):
        try:
            if parse_bytes(spec[len("merge:") :]) >= 1:
                return
        except BudgetError as exc:
            raise LayerfitError(f"unit granularity {spec!r}: {exc}") from exc
    raise LayerfitError(
        f"unknown unit granularity {spec!r}: use layers, blocks:N (N >= 1) or merge:SIZE (e.g. merge:1MB)"
    )


def make_blocks(units: Sequence[Segment], spec: str | Sequence[int] = "layers") -> list[Block]:
    """Blocks for a granularity spec: ``layers``, ``blocks:N``, ``merge:SIZE`` or explicit
    start points."""
    check_units_spec(spec)
    if not units:
        return []
    if not isinstance(spec, str):
        return blocks_from_points(units, list(spec))
    if spec == "layers":
        return [Block(i, (u,)) for i, u in enumerate(units)]
    if spec.startswith("merge:"):
        return merged_blocks(units, parse_bytes(spec[len("merge:") :]))
    return equal_blocks(units, int(spec[len("blocks:") :]))
