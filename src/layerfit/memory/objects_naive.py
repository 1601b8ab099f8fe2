"""Shared objects, naive: one object per tensor (no sharing at all).

Algorithm (TFLite ``NaiveAssignment``):
  1. Tensor ``i`` (in record order) gets object ``i``.
  2. Object ``i`` is exactly as large as tensor ``i``.

It is the baseline of the paper's tables ("Naïve"): the memory a framework needs when
it keeps every intermediate tensor alive.
"""

from __future__ import annotations

from collections.abc import Sequence

from layerfit.memory.plans import SharedObjectsPlan
from layerfit.memory.records import TensorUsageRecord
from layerfit.memory.registry import register


@register("objects", "naive", "one object per tensor, no sharing")
def naive_objects(records: Sequence[TensorUsageRecord]) -> SharedObjectsPlan:
    return SharedObjectsPlan(
        object_sizes=tuple(r.size for r in records),
        object_ids={r.id: i for i, r in enumerate(records)},
    )
