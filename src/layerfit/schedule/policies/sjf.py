"""Shortest Job First (thesis §6.2.4) at task level: the ready task with the shortest
duration first (ties: first come). Memory-oblivious, head of line. Partial graph."""

from __future__ import annotations

from layerfit.schedule.policies.base import SingleQueuePolicy
from layerfit.schedule.tasks import Scheme, Task


class Sjf(SingleQueuePolicy):
    """Shortest ready task first."""

    name = "sjf"
    scheme = Scheme.PARTIAL

    def key(self, task: Task) -> tuple:
        return (task.duration, task.ready_seq)
