"""Bulk: how Caffe and PyTorch run a model — load it whole, execute it, free it.

Runs the bulk graph (every load before the first execution, every unload after the
last) with FCFS order, one network at a time in arrival order (EdgeCaffe's bulk mode
chains networks). Several workers help only by loading layers of the same network in
parallel. Memory-oblivious (head of line behind the shared gate).
"""

from __future__ import annotations

from layerfit.schedule.policies.base import SingleQueuePolicy
from layerfit.schedule.tasks import Scheme


class Bulk(SingleQueuePolicy):
    """Whole-network loading, networks in series, FCFS."""

    name = "bulk"
    scheme = Scheme.BULK
    serial_networks = True
