"""Offsets, naive: every tensor gets its own bytes, laid end to end in record order.

Algorithm:
  1. Offset of tensor ``i`` = sum of the sizes of the tensors before it.
  2. The arena is the sum of all sizes (the paper's "Naïve" row).
"""

from __future__ import annotations

from collections.abc import Sequence

from layerfit.memory.plans import OffsetsPlan
from layerfit.memory.records import TensorUsageRecord
from layerfit.memory.registry import register


@register("offsets", "naive", "tensors end to end, no sharing")
def naive_offsets(records: Sequence[TensorUsageRecord]) -> OffsetsPlan:
    offsets = {}
    total = 0
    for rec in records:
        offsets[rec.id] = total
        total += rec.size
    return OffsetsPlan(total, offsets)
