"""Bulk: how Caffe and PyTorch run a model — load it whole, execute it, free it.

The thesis's Bulk baseline as EdgeCaffe implements it (``BulkOrchestrator``): the bulk
graph (every load before the first execution, every unload after the last) served
first come, first served by **one** worker, whatever the number of workers configured,
with networks chained in arrival order (each network's first task waits for the last
task of the one before). Memory-oblivious (head of line behind the shared gate).
:class:`~layerfit.schedule.policies.bulk_multi.BulkMulti` is the variant that lets
every worker load.
"""

from __future__ import annotations

from layerfit.schedule.policies.base import SingleQueuePolicy
from layerfit.schedule.tasks import Scheme


class Bulk(SingleQueuePolicy):
    """Whole-network loading, networks in series, FCFS, one worker."""

    name = "bulk"
    scheme = Scheme.BULK
    serial_networks = True
    max_workers = 1
