"""Smallest-gap placement shared by the greedy offset strategies (Algorithm 3, L.7–23).

:class:`GapPlacer` keeps the tensors placed so far ordered by offset. To place a new
tensor it scans them in offset order, skipping those whose usage interval does not
intersect the new one, and tracks the end of the rightmost intersecting tensor seen so
far (``prev_end``). Every intersecting tensor that starts at or after ``prev_end`` closes
a gap ``[prev_end, its offset)``; the smallest gap the tensor fits in wins. Without one,
the tensor goes right after the rightmost intersecting tensor. This is TFLite's
``GreedyBySizeAssignment`` loop with the alignment already folded into record sizes.

The intersection test runs vectorised over all placed tensors; only the few that
intersect (at most one operator profile's worth) are scanned in Python.
"""

from __future__ import annotations

import numpy as np

from layerfit.memory.records import TensorUsageRecord


class GapPlacer:
    """Incremental smallest-gap placement of tensors into one arena."""

    def __init__(self, capacity: int = 0) -> None:
        # parallel arrays of placed tensors in offset order (ties: placement order)
        self._count = 0
        self._offset = np.zeros(max(capacity, 16), dtype=np.int64)
        self._end = np.zeros_like(self._offset)
        self._first = np.zeros_like(self._offset)
        self._last = np.zeros_like(self._offset)
        self.offsets: dict[int, int] = {}
        self.arena_size = 0

    def place(self, rec: TensorUsageRecord) -> int:
        """Choose ``rec``'s offset, record it, and return it."""
        n = self._count
        live = np.flatnonzero((self._last[:n] >= rec.first_op) & (self._first[:n] <= rec.last_op))
        best_gap = -1
        best_offset = -1
        prev_end = 0
        for offset, end in zip(self._offset[live].tolist(), self._end[live].tolist(), strict=True):
            if offset >= prev_end:
                gap = offset - prev_end
                if gap >= rec.size and (best_gap < 0 or gap < best_gap):
                    best_gap, best_offset = gap, prev_end
            if end > prev_end:
                prev_end = end
        if best_offset < 0:
            best_offset = prev_end
        # insert after every tensor with offset <= best_offset, as TFLite does
        pos = int(np.searchsorted(self._offset[:n], best_offset, side="right"))
        if n == len(self._offset):
            for name in ("_offset", "_end", "_first", "_last"):
                arr = getattr(self, name)
                setattr(self, name, np.concatenate([arr, np.zeros_like(arr)]))
        for arr, value in (
            (self._offset, best_offset),
            (self._end, best_offset + rec.size),
            (self._first, rec.first_op),
            (self._last, rec.last_op),
        ):
            arr[pos + 1 : n + 1] = arr[pos:n]
            arr[pos] = value
        self._count = n + 1
        self.offsets[rec.id] = best_offset
        self.arena_size = max(self.arena_size, best_offset + rec.size)
        return best_offset
