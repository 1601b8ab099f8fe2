"""How many bytes the activations of a captured graph occupy: the one reading of views.

A captured :class:`~layerfit.capture.graph.ModelGraph` lists every tensor an op makes,
some of them views of others (``TensorRecord.alias_of``: a reshape, a slice, an
``expand``, what an in-place op returns). Memory belongs to storages, not tensors:

* a view owns no bytes of its own; a storage holds its *base* tensor's bytes, however
  many views of it there are and however large they look (an ``expand`` view reads as
  many elements as it broadcasts to, but stores none of them);
* a storage lives from the first op that makes or reads any tensor on it to the last,
  so a view read after its base's last use keeps the base alive (a model output lives
  to the end of the pass).

:func:`activation_records` gives one tensor usage record per storage under these rules
(the alias groups of :mod:`layerfit.memory.from_graph`), in the captured op order and
without in-place reuse, since eager PyTorch writes no elementwise module's output over
its input. :func:`activation_bytes` reduces them to one number: the most bytes live at
once, or the arena an offsets strategy lays them out in. Every estimate of a network's
activation memory is this function: the scheduler's (:mod:`layerfit.schedule.runtime.profiler`)
and SwapNet's reserve (:mod:`layerfit.tradeoff.swapnet.partition`).

The activation planner's own records (:func:`~layerfit.memory.from_graph.records_from_graph`)
use the same storages and lifetimes but size a storage by its largest tensor, as TFLite
does, where a broadcast is a tensor of its own: the Pisarchyk & Lee reproduction
(``bench/memory_planner.py``) keeps the paper's accounting (DeepLab v3's image-pooling
``expand`` is the one zoo model where the two differ).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from layerfit.memory.from_graph import _Storage
from layerfit.memory.profiles import max_breadth
from layerfit.memory.records import TensorUsageRecord, make_records

if TYPE_CHECKING:
    from layerfit.capture.graph import ModelGraph


def activation_records(graph: ModelGraph, *, alignment: int = 1) -> list[TensorUsageRecord]:
    """One record per storage that holds bytes: its base tensor's bytes (rounded up to
    ``alignment``), live from the first op using any tensor on it to the last, in the
    captured op order. Ids are the base tensors' ids, in increasing order."""
    storage = _Storage(graph)
    position = {op: op for op in range(len(graph.ops))}
    first, last = storage.intervals(position, max(len(graph.ops) - 1, 0))
    items = [
        (g, first[g], last[g], storage.base_bytes[g])
        for g in sorted(storage.members)
        if storage.base_bytes[g] > 0
    ]
    return make_records(items, alignment)


def activation_bytes(graph: ModelGraph, strategy: str | None = None, *, alignment: int = 1) -> int:
    """Bytes the activations of one forward pass of ``graph`` occupy.

    Without ``strategy``: the most bytes live at once (the usage records' peak, a lower
    bound of every layout). With an offsets strategy (``greedy_by_size``, ``best``...):
    the size of the arena that strategy lays the records out in. ``alignment`` rounds
    every storage up first (64: where a planned arena places buffers).
    """
    records = activation_records(graph, alignment=alignment)
    if not records:
        return 0
    if strategy is not None:
        from layerfit.memory.registry import plan_offsets

        return plan_offsets(records, strategy).arena_size
    return max_breadth(records)


__all__ = ["activation_bytes", "activation_records"]
