"""MASA that never deadlocks: ``masa-fcfs`` with a safety check (the Banker's algorithm).

MASA's rules (execute and unload before load, the first task that fits) can deadlock
under heavy traffic with a tight budget: the loads of several networks fill memory
while each of those networks waits for one large load that no longer fits, and only the
progress rule moves on, by running a task alone over the budget. Each firing
over-commits memory, which pages, which slows every task, which lets more requests pile
up. Sorting by memory (``masa``) makes it likely; arrival order (``masa-fcfs``) makes it
rarer but does not rule it out: with the thesis's profiles at 1 GB, 150 all-random
requests at traffic intensity 1.2 made ``masa-fcfs`` fire the rule 6,845 times (mean
response 1,863 s in the simulator, thesis paging model).

``masa-fair`` (not in the thesis) takes ``masa-fcfs``'s order but starts a memory-taking
task (init or load) only if the state after it is *safe*: once the tasks running now
have finished, there is an order in which every network in flight can run to its end
alone, one after the other, each giving back everything it holds (its init and its
loaded layers) when it ends. What a network still needs comes from its
:class:`~layerfit.schedule.tasks.NetworkPlan`, which every task carries: running alone
from where it is, it loads each layer it has not loaded (the load's peak), executes it
(the execute memory) and unloads it, so the layers it has executed are given back
before its next load. Execute and unload tasks need no check: they only move a network
along its plan.

A safe state always has a network whose next task fits and leaves the state safe, so
when every network of the workload can run alone within the budget the progress rule
never fires; it remains for a network that cannot (its job would otherwise wait
forever). In the case above ``masa-fair`` never fired it and its mean response was
21 s; where ``masa-fcfs`` does not fire it the two behave alike (13.7 s each at 2 GB).

The same check in ``masa``'s memory order also never fired the rule but let large
networks wait behind small ones: 75 s at 1 GB and 45 s at 2 GB in the case above, so it
is not used. Earlier versions of the check knew only the loads that were ready and
missed the execute memory, the init given back at a network's end, networks whose init
was still running and the part of a running load's peak it gives back; with the
thesis's profiles they fired the rule thousands of times.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from layerfit.errors import ScheduleError
from layerfit.schedule.policies.base import fits
from layerfit.schedule.policies.masa_fcfs import MasaFcfs
from layerfit.schedule.tasks import NetworkPlan, Task, TaskKind


@dataclass
class _Flight:
    """Where one network in flight stands on its plan (tasks taken, not only finished)."""

    plan: NetworkPlan
    job: Hashable
    init: int = 0  # init memory held until the network ends
    loaded: dict[int, int] = field(default_factory=dict)  # layer -> retained bytes, until unloaded
    executed: int = 0  # layers whose execution has started (they run in order)

    def held(self) -> int:
        """What the network gives back when it ends."""
        return self.init + sum(self.loaded.values())

    def need(self) -> int:
        """The most memory it still needs beyond what it holds, running alone from here."""
        extra = -sum(b for layer, b in self.loaded.items() if layer < self.executed)
        most = 0
        for layer in range(self.executed, len(self.plan.layers)):
            load, retained, execute = self.plan.layers[layer]
            if layer not in self.loaded:
                most = max(most, extra + load)
                extra += retained
            most = max(most, extra + execute)
            extra -= retained  # unloaded once executed
        return most

    def after(self, task: Task) -> _Flight:
        """A copy with ``task`` taken."""
        flight = _Flight(self.plan, self.job, self.init, dict(self.loaded), self.executed)
        flight.take(task)
        return flight

    def take(self, task: Task) -> None:
        if task.kind is TaskKind.INIT:
            self.init = task.retained
        elif task.kind is TaskKind.LOAD:
            self.loaded[task.layer] = task.retained
        elif task.kind is TaskKind.EXEC:
            self.executed = max(self.executed, task.layer + 1)


class MasaFair(MasaFcfs):
    """``masa-fcfs`` whose memory-taking tasks must leave the networks in flight a safe state."""

    name = "masa-fair"

    def __init__(self, *, gated: bool = True) -> None:
        super().__init__(gated=gated)
        self._flights: dict[str, _Flight] = {}  # network uid -> its state, from its first task
        self._returns: dict[str, int] = {}  # running task id -> bytes it frees when it ends
        self.unsafe_skips = 0  # tasks that fitted but were held back as unsafe

    # --- bookkeeping ----------------------------------------------------------------

    def add(self, task: Task) -> None:
        if task.plan is None:
            raise ScheduleError(
                f"masa-fair needs each task's network plan; task {task.id} has none "
                "(build tasks with layerfit.schedule.graph)"
            )
        super().add(task)

    def _take(self, task: Task) -> Task:
        task = super()._take(task)
        flight = self._flights.get(task.network)
        if flight is None:
            assert task.plan is not None  # add() refuses tasks without one
            flight = self._flights[task.network] = _Flight(task.plan, task.job)
        flight.take(task)
        self._returns[task.id] = task.memory - task.retained
        return task

    def complete(self, task: Task) -> None:
        super().complete(task)
        self._returns.pop(task.id, None)
        flight = self._flights.get(task.network)
        if flight is None:  # its job was discarded: the ledger already took its memory back
            return
        if task.kind is TaskKind.UNLOAD:
            flight.loaded.pop(task.layer, None)
        # every layer executed and unloaded: the network ended and the ledger freed its init
        if flight.executed == len(flight.plan.layers) and not flight.loaded:
            del self._flights[task.network]

    def discard(self, job: Hashable) -> list[Task]:
        for uid in [uid for uid, flight in self._flights.items() if flight.job == job]:
            del self._flights[uid]
        # The ledger frees the job's memory now, its running tasks' memory whole when they
        # end; until then ``_returns`` counts only their peaks beyond what they keep, which
        # errs on the safe side.
        return super().discard(job)

    # --- choice ---------------------------------------------------------------------

    def next(self, worker: int, free_memory: int) -> Task | None:
        task = self._first_fitting(self._frees, free_memory)
        if task is not None:
            return self._take(task)
        # what is free once the running tasks end, and what each network in flight needs
        settled = free_memory + sum(self._returns.values())
        needs = {uid: flight.need() for uid, flight in self._flights.items()}
        for candidate in self._takes:  # arrival order: a later task that fits may pass
            if not fits(candidate, free_memory):
                continue
            if self._safe(candidate, settled, needs):
                return self._take(candidate)
            self.unsafe_skips += 1
        if self.running == 0:  # progress rule: a network that cannot run alone in the budget
            task = self._frees.first() or self._takes.first()
            if task is not None:
                return self._take(task)
        return None

    def _safe(self, candidate: Task, settled: int, needs: dict[str, int]) -> bool:
        """After ``candidate`` starts (and everything running ends), can every network in
        flight still run to its end, one after the other?"""
        flight = self._flights.get(candidate.network)
        if flight is None:
            assert candidate.plan is not None
            flight = _Flight(candidate.plan, candidate.job)
        moved = flight.after(candidate)
        needs = {**needs, candidate.network: moved.need()}
        free = settled - candidate.retained
        for uid, need in sorted(needs.items(), key=lambda item: item[1]):
            if need > free:
                return False
            free += (moved if uid == candidate.network else self._flights[uid]).held()
        return True
