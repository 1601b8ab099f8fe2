"""The policy interface shared by the simulator and the real executor.

A policy holds the *ready* tasks (all dependencies done) and decides which one an idle
worker runs next. The dispatcher calls, under one lock:

- :meth:`Policy.add` when a task becomes ready;
- :meth:`Policy.serves` to ask whether a worker is one the policy uses at all;
- :meth:`Policy.next` when a worker it serves is idle, with the ledger's free bytes (negative
  while over budget); the returned task is removed and counts as running;
- :meth:`Policy.complete` when a task it handed out has finished (or failed);
- :meth:`Policy.discard` to drop the ready tasks of a failed or cancelled job;
- :meth:`Policy.empty` to ask whether anything is ready.

Nothing here knows about SimPy or threads. The *memory gate* is common to every policy
(:meth:`Policy._gate`): a task starts only if it fits the free memory; when nothing
fits and nothing runs, the smallest candidate runs alone (the progress rule, which the
ledger counts). Policies differ in which tasks they consider and in what order; the
memory-oblivious ones (FCFS, SJF, …) only look at their first choice (head of line),
MASA searches by memory. ``gated=False`` turns the gate off for memory-oblivious
policies, reproducing the thesis's unmanaged baselines that over-commit.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import ClassVar

from layerfit.schedule.tasks import Scheme, Task


def fits(task: Task, free_memory: int) -> bool:
    """Whether ``task`` fits ``free_memory`` (a task needing no memory always does)."""
    return task.memory == 0 or task.memory <= free_memory


class ReadyQueue:
    """Tasks kept sorted by a key; ties keep insertion order. Small and predictable."""

    def __init__(self, key: Callable[[Task], tuple]) -> None:
        self._key = key
        self._keys: list[tuple] = []
        self._tasks: list[Task] = []
        self._counter = 0

    def push(self, task: Task) -> None:
        self._counter += 1
        entry = (*self._key(task), self._counter)
        index = bisect.bisect_right(self._keys, entry)
        self._keys.insert(index, entry)
        self._tasks.insert(index, task)

    def remove(self, task: Task) -> None:
        index = (
            0
            if self._tasks and self._tasks[0] is task
            else next(i for i, t in enumerate(self._tasks) if t is task)
        )
        del self._keys[index]
        del self._tasks[index]

    def first(self) -> Task | None:
        return self._tasks[0] if self._tasks else None

    def discard(self, predicate: Callable[[Task], bool]) -> list[Task]:
        dropped = [t for t in self._tasks if predicate(t)]
        if dropped:
            keep = [
                (k, t) for k, t in zip(self._keys, self._tasks, strict=True) if not predicate(t)
            ]
            self._keys = [k for k, _ in keep]
            self._tasks = [t for _, t in keep]
        return dropped

    def __iter__(self) -> Iterator[Task]:
        return iter(self._tasks)  # callers do not change the queue while iterating

    def __len__(self) -> int:
        return len(self._tasks)


class Policy:
    """Base class: the interface, the running count and the memory gate.

    Subclasses set :attr:`name`, :attr:`scheme`, :attr:`serial_networks` and
    :attr:`max_workers`, implement :meth:`add`, :meth:`_candidates` (ready tasks a worker
    may take, in preference order) and :meth:`_remove`, and override :meth:`next` when
    they choose differently.
    """

    name: ClassVar[str] = ""
    scheme: ClassVar[Scheme] = Scheme.PARTIAL
    serial_networks: ClassVar[bool] = False  # admit one network at a time (Bulk, Linear)
    memory_aware: ClassVar[bool] = False
    # Workers the policy hands tasks to; the others stay idle. EdgeCaffe's orchestrators
    # give Bulk and Linear one worker and DeepEye two, whatever the configuration says.
    max_workers: ClassVar[int | None] = None

    def __init__(self, *, gated: bool = True) -> None:
        self.gated = gated or self.memory_aware
        self.workers = 1
        self.running = 0
        self._size = 0

    # --- interface ------------------------------------------------------------------

    def bind(self, workers: int) -> None:
        """Tell the policy how many workers will ask it (DeepEye splits them into pools)."""
        self.workers = workers

    def serves(self, worker: int) -> bool:
        """Whether ``worker`` may get tasks from this policy at all."""
        return self.max_workers is None or worker < self.max_workers

    def add(self, task: Task) -> None:
        raise NotImplementedError

    def next(self, worker: int, free_memory: int) -> Task | None:
        """The task ``worker`` should run now, removed from the ready set; ``None`` to wait."""
        return self._gate(self._candidates(worker), free_memory)

    def complete(self, task: Task) -> None:
        """A task this policy handed out has finished (or failed)."""
        self.running -= 1

    def discard(self, job: Hashable) -> list[Task]:
        """Drop every ready task of ``job``; returns them."""
        dropped = self._discard(lambda t: t.job == job)
        self._size -= len(dropped)
        return dropped

    def empty(self) -> bool:
        return self._size == 0

    def __len__(self) -> int:
        return self._size

    # --- helpers for subclasses -----------------------------------------------------

    def _candidates(self, worker: int) -> Iterable[Task]:
        raise NotImplementedError

    def _remove(self, task: Task) -> None:
        raise NotImplementedError

    def _discard(self, predicate: Callable[[Task], bool]) -> list[Task]:
        raise NotImplementedError

    def _added(self) -> None:
        self._size += 1

    def _take(self, task: Task) -> Task:
        self._remove(task)
        self._size -= 1
        self.running += 1
        return task

    def _gate(self, candidates: Iterable[Task], free_memory: int) -> Task | None:
        """Head of line: the first candidate if it fits (or the gate is off); when nothing
        runs, the smallest candidate instead (progress rule); otherwise wait."""
        ordered = iter(candidates)
        head = next(ordered, None)
        if head is None:
            return None
        if not self.gated or fits(head, free_memory):
            return self._take(head)
        if self.running == 0:
            smallest = head
            for task in ordered:
                if task.memory < smallest.memory:
                    smallest = task
            return self._take(smallest)
        return None


class SingleQueuePolicy(Policy):
    """A policy whose ready tasks live in one sorted queue (FCFS, SJF, SNF, Bulk, …)."""

    def __init__(self, *, gated: bool = True) -> None:
        super().__init__(gated=gated)
        self._queue = ReadyQueue(self.key)

    def key(self, task: Task) -> tuple:
        """Sort key; smaller runs first. FCFS order unless overridden."""
        return (task.ready_seq,)

    def add(self, task: Task) -> None:
        self._queue.push(task)
        self._added()

    def _candidates(self, worker: int) -> Iterable[Task]:
        return self._queue

    def _remove(self, task: Task) -> None:
        self._queue.remove(task)

    def _discard(self, predicate: Callable[[Task], bool]) -> list[Task]:
        return self._queue.discard(predicate)
