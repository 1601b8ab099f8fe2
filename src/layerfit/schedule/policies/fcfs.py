"""First Come First Serve (thesis §6.2.2): ready tasks in the order they became ready.

Memory-oblivious: the first ready task runs when it fits, otherwise the worker waits
(head of line); the shared progress rule keeps it from stalling. Partial graph.
"""

from __future__ import annotations

from layerfit.schedule.policies.base import SingleQueuePolicy
from layerfit.schedule.tasks import Scheme


class Fcfs(SingleQueuePolicy):
    """Tasks in ready order, head of line."""

    name = "fcfs"
    scheme = Scheme.PARTIAL
