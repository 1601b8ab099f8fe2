"""Shortest Network First (thesis §6.2.5): the tasks of the network with the least total
work first, so a network finishes as soon as possible and frees its memory; within a
network, first come. Memory-oblivious, head of line. Partial graph."""

from __future__ import annotations

from layerfit.schedule.policies.base import SingleQueuePolicy
from layerfit.schedule.tasks import Scheme, Task


class Snf(SingleQueuePolicy):
    """Tasks of the shortest network first."""

    name = "snf"
    scheme = Scheme.PARTIAL

    def key(self, task: Task) -> tuple:
        return (task.network_cost, task.job_seq, task.network_index, task.ready_seq)
