"""Linear FCFS (thesis §6.2.3): FCFS on the linear graph, one network at a time.

Each load is followed by its execution and unload before the next load, so a network
holds one layer at a time — the least memory of all policies and no overlap between
workers. Networks are admitted one after another in arrival order, as EdgeCaffe's
linear mode chains them, and one worker serves them (EdgeCaffe's ``LinearOrchestrator``).
"""

from __future__ import annotations

from layerfit.schedule.policies.base import SingleQueuePolicy
from layerfit.schedule.tasks import Scheme


class LinearFcfs(SingleQueuePolicy):
    """FCFS over the linear graph, networks in series."""

    name = "linear-fcfs"
    scheme = Scheme.LINEAR
    serial_networks = True
    max_workers = 1
