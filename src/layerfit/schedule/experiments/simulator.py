"""Discrete-event simulation of N workers driven by a policy (SimPy).

The simulated system is the real one with the work replaced by waiting: the same
:class:`~layerfit.schedule.dispatch.Dispatcher`, policy object and
:class:`~layerfit.schedule.ledger.MemoryLedger` decide what runs; a task then takes its
profiled duration times the paging slowdown (:mod:`layerfit.schedule.experiments.penalty`) for the
*actual* memory in use. The ledger sees the scheduler's estimates; a second ledger
(``resident``) follows the actual bytes, so an estimate factor ≠ 1 (thesis §7.6) shows
up as paging, not as a broken budget.

With a :class:`~layerfit.schedule.contention.ContentionModel`, loads and executions in
flight slow each other down (shared storage, shared cores): a task's duration is then
its work done at a rate that changes whenever another task starts or ends.

Workers are SimPy processes that ask the dispatcher for work and, when it has none for
them, wait on an event that fires at the next arrival or completion.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from layerfit.errors import ScheduleError
from layerfit.extras import require
from layerfit.schedule.contention import NO_CONTENTION, SHARED_KINDS, ContentionModel
from layerfit.schedule.dispatch import Dispatcher, JobState, Oversize
from layerfit.schedule.experiments.penalty import PagingModel
from layerfit.schedule.experiments.workload import Workload
from layerfit.schedule.ledger import MemoryLedger
from layerfit.schedule.policies import Policy, make_policy
from layerfit.schedule.profile import ProfileSet
from layerfit.schedule.report import JobResult, RunReport, TaskRecord
from layerfit.schedule.tasks import Job, TaskKind
from layerfit.sizes import format_bytes

simpy = require("simpy")

DEFAULT_PAGING = PagingModel()


class _SharedMachine:
    """Loads and executions in flight slow each other (:class:`ContentionModel`).

    :meth:`run` is a SimPy generator that returns when ``work`` seconds of alone-speed
    work are done. Rates hold between two changes of the set in flight; each start or
    end brings every task's remaining work up to date and re-plans the next completion.
    A stale timer (planned before the latest change) does nothing when it fires.
    """

    def __init__(self, env: simpy.Environment, model: ContentionModel) -> None:
        self._env = env
        self._model = model
        self._inflight: dict[simpy.Event, list] = {}  # event -> [remaining work, kind, rate]
        self._since = env.now
        self._plan = 0

    def run(self, kind: TaskKind, work: float):
        if self._model.free or kind not in SHARED_KINDS:
            yield self._env.timeout(work)
            return
        self._advance()
        done = self._env.event()
        self._inflight[done] = [work, kind, 1.0]
        self._replan()
        yield done

    def _advance(self) -> None:
        elapsed = self._env.now - self._since
        self._since = self._env.now
        for entry in self._inflight.values():
            entry[0] -= elapsed * entry[2]

    def _replan(self) -> None:
        self._plan += 1
        if not self._inflight:
            return
        loads = sum(entry[1] is TaskKind.LOAD for entry in self._inflight.values())
        execs = len(self._inflight) - loads
        for entry in self._inflight.values():
            entry[2] = self._model.rate_in(entry[1], loads, execs)
        first = min(self._inflight, key=lambda e: self._inflight[e][0] / self._inflight[e][2])
        remaining, _, rate = self._inflight[first]
        self._env.process(self._finish(max(0.0, remaining) / rate, first, self._plan))

    def _finish(self, delay: float, first: simpy.Event, plan: int):
        yield self._env.timeout(delay)
        if plan != self._plan:
            return
        self._advance()
        for event, entry in list(self._inflight.items()):
            # the planned task, and any other that ends within rounding of it
            if event is first or entry[0] <= 1e-9 * max(1.0, self._env.now):
                del self._inflight[event]
                event.succeed()
        self._replan()


class _Wakeup:
    """One event that all waiting workers share; replaced each time it fires."""

    def __init__(self, env: simpy.Environment) -> None:
        self._env = env
        self.event = env.event()

    def fire(self) -> None:
        event, self.event = self.event, self._env.event()
        event.succeed()


def simulate(
    workload: Workload | Sequence[Job],
    policy: str | Policy = "masa",
    *,
    memory: int,
    workers: int = 2,
    physical_memory: int | None = None,
    paging: PagingModel | None = DEFAULT_PAGING,
    estimate_factor: float = 1.0,
    oversize: Oversize = "reject",
    gated: bool = True,
    profiles: ProfileSet | None = None,
    mode: str | None = None,
    trace: bool = True,
    contention: ContentionModel = NO_CONTENTION,
) -> RunReport:
    """Run ``workload`` under ``policy`` with a ``memory`` budget on ``workers`` workers.

    ``physical_memory`` (default: the budget) is what paging is measured against;
    ``paging=None`` turns the penalty off. ``estimate_factor`` scales the memory the
    scheduler is told. ``oversize="alone"`` runs a task larger than the budget alone
    instead of rejecting its job. ``gated=False`` lets memory-oblivious policies ignore
    the budget. ``mode`` overrides the workload's (``open`` or ``closed``).
    ``contention`` makes concurrent loads and executions slow each other down (default:
    none, every task runs at its profiled speed, as in the thesis).

    The workers and the arrivals are SimPy processes of one :class:`_Simulation`, which
    holds what they share: the environment, the dispatcher, the ledgers and the records.
    """
    jobs, mode, name = _jobs_of(workload, profiles, mode)
    if memory <= 0:
        raise ScheduleError(f"a memory budget must be positive, got {memory} bytes")
    physical = int(memory if physical_memory is None else physical_memory)
    if physical <= 0:  # 0 is not "default": it would divide the paging model by zero
        raise ScheduleError(f"physical memory must be positive, got {physical} bytes")
    policy_obj = make_policy(policy, gated=gated)
    run = _Simulation(policy_obj, memory, physical, workers, paging, contention, trace,
                      oversize=oversize, estimate_factor=estimate_factor)
    run.run(jobs, mode)

    stalled = run.dispatcher.unresolved()
    if stalled:  # a scheduling bug, never a user error: say exactly where it stopped
        raise ScheduleError(
            f"simulation stalled at t={run.env.now:g} with {len(stalled)} unfinished job(s) "
            f"(first: {stalled[0].job.id}); policy {policy_obj.name} holds {len(policy_obj)} ready task(s), "
            f"{format_bytes(run.ledger.free)} free"
        )
    return _report(
        policy_obj, workers, run.ledger, run.resident, run.dispatcher, run.records, run.busy,
        estimate_factor, paging, contention, name,
    )


class _Simulation:
    """One simulated run: N worker processes and the arrivals, on one SimPy environment,
    sharing one dispatcher, the budget's ledger, the physical memory's ledger, the
    records and each worker's busy time."""

    def __init__(
        self, policy: Policy, memory: int, physical: int, workers: int, paging: PagingModel | None,
        contention: ContentionModel, trace: bool, *, oversize: Oversize, estimate_factor: float,
    ) -> None:
        self.env = simpy.Environment()
        clock = lambda: self.env.now  # noqa: E731 - the simulated clock
        self.ledger = MemoryLedger(memory, clock=clock)
        self.resident = MemoryLedger(physical, clock=clock)
        self.dispatcher = Dispatcher(
            policy, self.ledger, workers, oversize=oversize, estimate_factor=estimate_factor,
            clock=clock, resident=self.resident,
        )
        self.records: list[TaskRecord] = []
        self.busy = [0.0] * workers
        self._physical = physical
        self._paging = paging
        self._trace = trace
        self._wakeup = _Wakeup(self.env)
        self._machine = _SharedMachine(self.env, contention)
        self._finished: dict[str, simpy.Event] = {}

    def run(self, jobs: Sequence[Job], mode: str) -> None:
        for index in range(len(self.busy)):
            self.env.process(self._worker(index))
        self.env.process(self._arrivals(jobs, mode))
        self.env.run()

    def _resolved(self, states: Sequence[JobState]) -> None:
        for state in states:
            event = self._finished.pop(state.job.id, None)
            if event is not None:
                event.succeed()

    def _worker(self, index: int):
        env = self.env
        while True:
            assignment = self.dispatcher.assign(index)
            if assignment is None:
                yield self._wakeup.event
                continue
            task, admission = assignment
            slowdown = 1.0
            if self._paging is not None:
                slowdown = self._paging.slowdown(
                    self.resident.used / self._physical, (task.actual_memory or 0) / self._physical
                )
            start = env.now
            yield from self._machine.run(task.kind, task.duration * slowdown)
            self.busy[index] += env.now - start
            if self._trace:
                self.records.append(TaskRecord.of(task, index, start, env.now, admission, slowdown))
            self._resolved(self.dispatcher.complete(task))
            self._wakeup.fire()

    def _submit(self, job: Job) -> JobState:
        state = self.dispatcher.submit(job)
        if not state.resolved:
            self._finished[job.id] = self.env.event()
        self._wakeup.fire()
        return state

    def _arrivals(self, jobs: Sequence[Job], mode: str):
        env = self.env
        for job in jobs:
            if mode == "open":
                if job.arrival > env.now:
                    yield env.timeout(job.arrival - env.now)
                self._submit(job)
            else:
                state = self._submit(replace(job, arrival=env.now))
                if not state.resolved:
                    yield self._finished[job.id]


def _jobs_of(
    workload: Workload | Sequence[Job], profiles: ProfileSet | None, mode: str | None
) -> tuple[list[Job], str, str]:
    """The jobs of ``workload``, the mode they arrive in (``mode``, else the workload's, else
    ``open``) and the workload's name."""
    if isinstance(workload, Workload):
        jobs, mode, name = workload.jobs(profiles), mode or workload.mode, workload.name
    else:
        jobs, mode, name = list(workload), mode or "open", "jobs"
    if mode not in ("open", "closed"):
        raise ScheduleError(f"mode must be 'open' or 'closed', got {mode!r}")
    return jobs, mode, name


def _report(
    policy: Policy,
    workers: int,
    ledger: MemoryLedger,
    resident: MemoryLedger,
    dispatcher: Dispatcher,
    records: list[TaskRecord],
    busy: list[float],
    estimate_factor: float,
    paging: PagingModel | None,
    contention: ContentionModel,
    name: str,
) -> RunReport:
    """The report of a finished simulation."""
    states = sorted(dispatcher.jobs.values(), key=lambda s: (s.job.arrival, s.job.seq))
    return RunReport(
        policy=policy.name,
        workers=workers,
        budget=ledger.budget,
        physical_memory=resident.budget,
        executor="simulator",
        jobs=[JobResult.from_state(s) for s in states],
        tasks=records,
        memory=[(s.time, s.used) for s in ledger.history],
        resident=[(s.time, s.used) for s in resident.history],
        busy_time=busy,
        progress_count=ledger.progress_count,
        overcommit_count=ledger.overcommit_count,
        peak_memory=ledger.peak,
        peak_resident=resident.peak,
        estimate_factor=estimate_factor,
        paging=None if paging is None else paging.describe(),
        contention=None if contention.free else contention.describe(),
        workload=name,
        ledger_history=list(ledger.history),
    )
