"""Round Robin (thesis §6.2.1) at task granularity.

Tasks cannot be pre-empted, so fairness is by turns: each dispatch takes the oldest
ready task of the next network in circular order, giving every active network an equal
share of dispatches. Memory-oblivious (the head is the current turn's task). Partial
graph. The thesis expects this to interleave many networks' loads and so hold much
memory — exactly the behaviour the comparison needs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from layerfit.schedule.policies.base import Policy, ReadyQueue
from layerfit.schedule.tasks import Scheme, Task


class RoundRobin(Policy):
    """One task per network per turn."""

    name = "round-robin"
    scheme = Scheme.PARTIAL

    def __init__(self, *, gated: bool = True) -> None:
        super().__init__(gated=gated)
        self._queues: dict[str, ReadyQueue] = {}
        self._turn = 0

    def add(self, task: Task) -> None:
        queue = self._queues.get(task.network)
        if queue is None:
            queue = self._queues[task.network] = ReadyQueue(lambda t: (t.ready_seq,))
        queue.push(task)
        self._added()

    def _candidates(self, worker: int) -> Iterator[Task]:
        names = list(self._queues)
        for k in range(len(names)):
            first = self._queues[names[(self._turn + k) % len(names)]].first()
            if first is not None:
                yield first

    def _remove(self, task: Task) -> None:
        names = list(self._queues)
        index = names.index(task.network)
        queue = self._queues[task.network]
        queue.remove(task)
        if len(queue):
            self._turn = index + 1
        else:
            del self._queues[task.network]
            self._turn = index  # the next network slid into this position
        self._turn = self._turn % len(self._queues) if self._queues else 0

    def _discard(self, predicate: Callable[[Task], bool]) -> list[Task]:
        dropped: list[Task] = []
        for name in list(self._queues):
            dropped += self._queues[name].discard(predicate)
            if not len(self._queues[name]):
                del self._queues[name]
        self._turn = 0
        return dropped
