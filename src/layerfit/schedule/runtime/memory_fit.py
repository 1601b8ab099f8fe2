"""A runtime within a memory limit: its budget is what the process's footprint leaves.

A server's process holds, beside the runtime's ledger (weights, activations and KV caches
of its jobs and decode loops, each reserved there), the interpreter and its libraries,
each model's skeleton and the request memory its routes read bodies into. Once the models
are loaded and warmed up, the library pages the imports left resident are paged out and
each model runs its example once more (faulting back the pages a pass runs), the weight
cache is emptied and the process measured: what it holds beyond the
ledger's reservations is the footprint, and the ledger's budget becomes the limit less
the footprint, the request memory and :data:`~layerfit.memory_limit.MIN_HEADROOM`.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import TYPE_CHECKING

from layerfit.engine.osmem import page_out_libraries, trim_heap
from layerfit.errors import LayerfitError
from layerfit.memory_limit import MIN_HEADROOM, Footprint, effective_limit, process_memory

if TYPE_CHECKING:
    from layerfit.schedule.runtime.executor import Runtime

WARM_UP_SECONDS = 120.0  # one example pass of a model, its units read from storage


def fit_runtime(runtime: Runtime, memory_limit: int, requests_bytes: int, asked_budget: int | None) -> Footprint:
    """Set ``runtime``'s budget to what ``memory_limit`` leaves (``asked_budget`` where it
    fits in that) and return the footprint measured. A limit that leaves less than the
    smallest loaded model needs, or a budget it cannot hold, is one line
    (:class:`~layerfit.errors.BudgetError`)."""
    limit, notice = effective_limit(memory_limit)
    if notice is not None:
        warnings.warn(notice, stacklevel=3)
    # The library pages the imports left resident go back, and each model runs its example
    # once more to fault back the ones a pass runs, which the footprint then counts.
    page_out_libraries()
    for name in list(runtime.models):
        with contextlib.suppress(Exception):  # a model that fails is the registry's to report
            runtime.infer(name, runtime.example_input(name)).result(timeout=WARM_UP_SECONDS)
    runtime.release_cached_weights()  # what the passes cached is not footprint
    trim_heap()
    now = process_memory()
    ledger = runtime.ledger
    needs = []
    for name in list(runtime.models):
        with contextlib.suppress(LayerfitError):  # not ready (failed to load): it needs nothing
            needs.append(runtime.required_budget(name))
    footprint = Footprint(
        limit_bytes=limit,
        anon_bytes=max(0, now.anon_bytes - ledger.used),
        file_bytes=now.file_bytes,
        activation_bytes=0,  # reserved in the ledger by each job, like its KV cache
        kv_bytes=0,
        headroom_bytes=MIN_HEADROOM,
        minimum_weight_bytes=min(needs, default=0),
        requests_bytes=requests_bytes,
    )
    budget = footprint.check(asked_budget, notice)
    with ledger.condition:
        ledger.budget = budget
    runtime.footprint = footprint
    return footprint


__all__ = ["fit_runtime"]
