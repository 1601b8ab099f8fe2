"""DeepEye (Mathur et al. 2017), as EdgeCaffe reproduces it: two pools, two chains.

Tasks of a network's convolutional part (and its init) go to the *conv* pool, tasks of
its fully connected part to the *fc* pool; each pool is served first come, first served
by its own worker (worker 0 serves conv, worker 1 fc, further workers stay idle, as in
EdgeCaffe's ``DeepEyeOrchestrator``; a single worker serves conv first, then fc). With
the DeepEye graph this interleaves the compute-heavy conv execution of one network with
the memory-heavy fc loading of another. Memory-oblivious: each pool is head of line
behind the shared gate.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import chain

from layerfit.schedule.policies.base import Policy, ReadyQueue
from layerfit.schedule.tasks import Pool, Scheme, Task


class DeepEye(Policy):
    """Conv pool and fc pool, FCFS each, on the DeepEye graph."""

    name = "deepeye"
    scheme = Scheme.DEEPEYE
    max_workers = 2

    def __init__(self, *, gated: bool = True) -> None:
        super().__init__(gated=gated)
        self._pools = {pool: ReadyQueue(lambda t: (t.ready_seq,)) for pool in Pool}

    def pool_of(self, worker: int) -> Pool | None:
        """The pool ``worker`` serves; ``None`` when a single worker serves both."""
        if self.workers < 2:
            return None
        return Pool.CONV if worker % 2 == 0 else Pool.FC

    def add(self, task: Task) -> None:
        self._pools[task.pool].push(task)
        self._added()

    def _candidates(self, worker: int) -> Iterable[Task]:
        pool = self.pool_of(worker)
        if pool is None:
            return chain(self._pools[Pool.CONV], self._pools[Pool.FC])
        return self._pools[pool]

    def _remove(self, task: Task) -> None:
        self._pools[task.pool].remove(task)

    def _discard(self, predicate: Callable[[Task], bool]) -> list[Task]:
        return [t for pool in self._pools.values() for t in pool.discard(predicate)]
