"""Bulk on every worker: EdgeCaffe's ``MultiBulkOrchestrator``.

The same bulk graph, FCFS order and networks in series as
:class:`~layerfit.schedule.policies.bulk.Bulk`, but all workers take tasks, so a
network's layers load in parallel (its executions stay a chain). EdgeCaffe has this
orchestrator but its experiments, and so the thesis's Bulk, use the one-worker one;
it is kept as the stronger whole-network baseline.
"""

from __future__ import annotations

from layerfit.schedule.policies.bulk import Bulk


class BulkMulti(Bulk):
    """Whole-network loading, networks in series, FCFS, all workers."""

    name = "bulk-multi"
    max_workers = None
