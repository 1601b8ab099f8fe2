"""MASA, the memory-aware scheduling algorithm (thesis §6.3.3, Algorithm 1).

Ready tasks are kept in two groups, each sorted by increasing memory (ties: first come):
tasks that lead to memory being freed (execute, unload) and tasks that take memory
(init, load). For an idle worker:

1. the smallest execute/unload task, if it fits the free memory;
2. otherwise the smallest init/load task, if it fits;
3. otherwise, if no worker is busy, the smallest task of the preferred group (execute
   before load) runs alone although it does not fit — the progress rule;
4. otherwise the worker waits.

Because each group is sorted by memory, "the first task that fits" is always the
group's first task or none. Step 3 follows the thesis's prose ("in case none of the
ready tasks fits … and all workers are idle"); read literally, Algorithm 1 would
prefer an execute task that does not fit over a load that does whenever all workers are
idle, needlessly exceeding the budget. Runs on the partial dependency graph.
"""

from __future__ import annotations

from collections.abc import Callable

from layerfit.schedule.policies.base import Policy, ReadyQueue, fits
from layerfit.schedule.tasks import Scheme, Task


class Masa(Policy):
    """Execute before load, ascending memory, smallest alone when all workers are idle."""

    name = "masa"
    scheme = Scheme.PARTIAL
    memory_aware = True

    def __init__(self, *, gated: bool = True) -> None:
        super().__init__(gated=gated)
        self._frees = ReadyQueue(self._order)
        self._takes = ReadyQueue(self._order)

    @staticmethod
    def _order(task: Task) -> tuple:
        """Both groups' sort key: increasing memory, then first come."""
        return (task.memory, task.ready_seq)

    def add(self, task: Task) -> None:
        (self._frees if task.frees_memory else self._takes).push(task)
        self._added()

    def next(self, worker: int, free_memory: int) -> Task | None:
        for group in (self._frees, self._takes):
            task = self._first_fitting(group, free_memory)
            if task is not None:
                return self._take(task)
        if self.running == 0:
            task = self._frees.first() or self._takes.first()
            if task is not None:
                return self._take(task)
        return None

    @staticmethod
    def _first_fitting(group: ReadyQueue, free_memory: int) -> Task | None:
        """The group's first task that fits: sorted by memory, its first task or none."""
        task = group.first()
        return task if task is not None and fits(task, free_memory) else None

    def _remove(self, task: Task) -> None:
        (self._frees if task.frees_memory else self._takes).remove(task)

    def _discard(self, predicate: Callable[[Task], bool]) -> list[Task]:
        return self._frees.discard(predicate) + self._takes.discard(predicate)
