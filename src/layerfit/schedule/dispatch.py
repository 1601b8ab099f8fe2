"""The dispatcher: jobs in, tasks out, memory accounted — no clock, no threads, no SimPy.

It owns the bookkeeping both drivers need and nothing else:

- :meth:`Dispatcher.submit` builds a job's task graph under the policy's scheme, rejects
  a job whose largest task cannot fit the budget even alone, and hands the tasks whose
  dependencies are done to the policy;
- :meth:`Dispatcher.assign` asks the policy for an idle worker's next task and reserves
  its memory in the ledger (memory a :class:`Reclaimer` can give back — the runtime's
  weight cache — counts as free to the policy and is taken back first);
- :meth:`Dispatcher.complete` / :meth:`Dispatcher.fail` retire a task: free what it
  does not retain, release what it unlocks, make its successors ready, finish networks
  and jobs.

The simulator calls these from SimPy processes; the real executor will call them from
worker threads. Every method holds the ledger's lock (re-entrant), so a thread can wait
on ``ledger.condition`` for the next change instead of polling.

Policies with ``serial_networks`` (Bulk, Linear FCFS) get one network at a time, in
arrival order across jobs, as EdgeCaffe chains them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol

from layerfit.backports import StrEnum
from layerfit.errors import JobRejectedError, ScheduleError
from layerfit.schedule.graph import GraphCache, TaskGraph, check_estimate_factor
from layerfit.schedule.ledger import Admission, MemoryLedger
from layerfit.schedule.policies import Policy
from layerfit.schedule.tasks import Job, Task
from layerfit.sizes import format_bytes

Oversize = Literal["reject", "alone"]


class JobStatus(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    REJECTED = "rejected"
    CANCELLED = "cancelled"


RESOLVED = frozenset({JobStatus.DONE, JobStatus.FAILED, JobStatus.REJECTED, JobStatus.CANCELLED})


@dataclass(eq=False)
class JobState:
    """A submitted job's progress."""

    job: Job
    submitted: float
    graph: TaskGraph | None = None
    status: JobStatus = JobStatus.WAITING
    started: float | None = None
    finished: float | None = None
    error: BaseException | None = None
    remaining: int = 0
    pending: list[int] = field(default_factory=list)  # per task: unfinished predecessors
    network_remaining: dict[str, int] = field(default_factory=dict)
    released: set[str] = field(default_factory=set)  # networks whose tasks may become ready

    @property
    def resolved(self) -> bool:
        return self.status in RESOLVED

    @property
    def response_time(self) -> float | None:
        """Arrival to completion of the last network (thesis §7.1.4)."""
        return None if self.finished is None else self.finished - self.job.arrival

    @property
    def missed_deadline(self) -> bool:
        if self.job.deadline is None:
            return False
        if self.status is not JobStatus.DONE:
            return True
        return self.response_time is not None and self.response_time > self.job.deadline + 1e-9

    def tasks(self) -> list[Task]:
        return [] if self.graph is None else self.graph.tasks


class Reclaimer(Protocol):
    """Memory reserved in the ledger that may be taken back for a task (the runtime's
    :class:`~layerfit.schedule.runtime.weight_cache.WeightCache`): the policy counts it as free."""

    def reclaimable(self) -> int: ...

    def make_room(self, task: Task, nbytes: int) -> None: ...


class Assignment(NamedTuple):
    task: Task
    admission: Admission


class Dispatcher:
    """Synchronous scheduling core over one policy and one ledger."""

    def __init__(
        self,
        policy: Policy,
        ledger: MemoryLedger,
        workers: int,
        *,
        oversize: Oversize = "reject",
        estimate_factor: float = 1.0,
        clock: Callable[[], float] | None = None,
        resident: MemoryLedger | None = None,
        reclaimer: Reclaimer | None = None,
    ) -> None:
        if workers < 1:
            raise ScheduleError(f"need at least one worker, got {workers}")
        if oversize not in ("reject", "alone"):
            raise ScheduleError(f"oversize must be 'reject' or 'alone', got {oversize!r}")
        check_estimate_factor(estimate_factor)
        self.policy = policy
        self.ledger = ledger
        self.resident = resident
        self.reclaimer = reclaimer
        self.workers = workers
        self.oversize = oversize
        self.estimate_factor = estimate_factor
        self._clock = clock or ledger.clock
        self.jobs: dict[str, JobState] = {}
        self._ready_seq = 0
        self._serial: deque[tuple[JobState, str]] = deque()
        self._active_network: tuple[JobState, str] | None = None
        self.running: dict[str, Task] = {}
        self._graphs = GraphCache(policy.scheme, estimate_factor)
        policy.bind(workers)

    # --- jobs -----------------------------------------------------------------------

    def submit(self, job: Job, now: float | None = None) -> JobState:
        """Accept ``job`` (or reject it) and make its first tasks ready."""
        with self.ledger.condition:
            if job.id in self.jobs:
                raise ScheduleError(f"a job with id {job.id!r} was already submitted")
            now = self._clock() if now is None else now
            state = JobState(job, submitted=now)
            self.jobs[job.id] = state
            if not job.networks:
                state.status, state.started, state.finished = JobStatus.DONE, now, now
                return state
            state.graph = self._graphs.job_graph(job)
            tasks = state.tasks()
            largest = max(tasks, key=lambda t: t.memory)
            if largest.memory > self.ledger.budget and self.oversize == "reject":
                state.status, state.finished = JobStatus.REJECTED, now
                state.error = JobRejectedError(
                    f"job {job.id} rejected: its largest task ({largest.network_name} "
                    f"{largest.kind.name.lower()} of {largest.layer_name}) needs "
                    f"{format_bytes(largest.memory)}, more than the whole budget of "
                    f"{format_bytes(self.ledger.budget)}; it needs a budget of at least "
                    f"{format_bytes(largest.memory)} ({largest.memory} bytes)",
                    min_budget=largest.memory,
                )
                self.ledger.condition.notify_all()
                return state
            state.remaining = len(tasks)
            state.pending = list(state.graph.indegree)
            for task in tasks:
                state.network_remaining[task.network] = (
                    state.network_remaining.get(task.network, 0) + 1
                )
            networks = list(dict.fromkeys(t.network for t in tasks))
            if self.policy.serial_networks:
                self._serial.extend((state, uid) for uid in networks)
                self._admit_next_network()
            else:
                for uid in networks:
                    self._release_network(state, uid)
            self.ledger.condition.notify_all()
            return state

    def _release_network(self, state: JobState, uid: str) -> None:
        state.released.add(uid)
        self._make_ready(
            t for i, t in enumerate(state.tasks()) if t.network == uid and state.pending[i] == 0
        )

    def _admit_next_network(self) -> None:
        while self._active_network is None and self._serial:
            state, uid = self._serial.popleft()
            if state.resolved:
                continue
            self._active_network = (state, uid)
            self._release_network(state, uid)

    def _make_ready(self, tasks: Iterable[Task]) -> None:
        for task in tasks:
            task.ready_seq = self._ready_seq
            self._ready_seq += 1
            self.policy.add(task)

    # --- tasks ----------------------------------------------------------------------

    def assign(self, worker: int, now: float | None = None) -> Assignment | None:
        """The next task for idle ``worker`` with its memory reserved, or ``None``."""
        with self.ledger.condition:
            if self.policy.empty() or not self.policy.serves(worker):
                return None
            free = self.ledger.free
            if self.reclaimer is not None:
                free += self.reclaimer.reclaimable()
            task = self.policy.next(worker, free)
            if task is None:
                return None
            if self.reclaimer is not None:
                self.reclaimer.make_room(task, task.memory)
            admission = self.ledger.acquire(
                task.id, task.memory, owner=task.network, allow_overcommit=not self.policy.gated
            )
            if self.resident is not None:
                self.resident.acquire(
                    task.id, task.actual_memory or 0, owner=task.network, allow_overcommit=True
                )
            state = self.jobs[task.job]
            if state.started is None:
                state.started = self._clock() if now is None else now
                state.status = JobStatus.RUNNING
            self.running[task.id] = task
            return Assignment(task, admission)

    def complete(self, task: Task, now: float | None = None) -> list[JobState]:
        """``task`` finished; returns the jobs this completed."""
        with self.ledger.condition:
            now = self._clock() if now is None else now
            state = self._retire(task, keep=True)
            if state.resolved:  # a task of a failed or cancelled job: nothing follows it
                self.ledger.condition.notify_all()
                return []
            done: list[JobState] = []
            state.remaining -= 1
            graph = state.graph
            assert graph is not None
            newly_ready = []
            for j in graph.successors[graph.index[task.id]]:
                state.pending[j] -= 1
                if state.pending[j] == 0 and graph.tasks[j].network in state.released:
                    newly_ready.append(graph.tasks[j])
            self._make_ready(newly_ready)
            state.network_remaining[task.network] -= 1
            if state.network_remaining[task.network] == 0:
                self._network_done(state, task.network)
            if state.remaining == 0:
                state.status, state.finished = JobStatus.DONE, now
                done.append(state)
            self.ledger.condition.notify_all()
            return done

    def fail(self, task: Task, error: BaseException, now: float | None = None) -> JobState:
        """``task`` raised: its job fails with ``error``, its memory is returned."""
        with self.ledger.condition:
            state = self._retire(task, keep=False)
            if not state.resolved:
                self._resolve(state, JobStatus.FAILED, error, now)
            self.ledger.condition.notify_all()
            return state

    def cancel(
        self,
        job_id: str,
        error: BaseException,
        now: float | None = None,
        *,
        status: JobStatus = JobStatus.CANCELLED,
    ) -> JobState:
        """Stop a job: drop its ready tasks and free its memory; running tasks finish alone.

        ``status`` is ``CANCELLED`` (its caller gave up) or ``FAILED`` (work of the job
        raised outside any task, e.g. in the real executor's forward thread)."""
        with self.ledger.condition:
            state = self.jobs[job_id]
            if not state.resolved:
                self._resolve(state, status, error, now)
            self.ledger.condition.notify_all()
            return state

    def _retire(self, task: Task, keep: bool) -> JobState:
        if self.running.pop(task.id, None) is None:
            raise ScheduleError(f"task {task.id} is not running")
        state = self.jobs[task.job]
        keep = keep and not state.resolved
        self.policy.complete(task)
        self.ledger.finish(task.id, task.retained if keep else 0)
        if self.resident is not None:
            self.resident.finish(task.id, (task.actual_retained or 0) if keep else 0)
        for key in task.releases:
            self.ledger.release(key)
            if self.resident is not None:
                self.resident.release(key)
        return state

    def _resolve(
        self, state: JobState, status: JobStatus, error: BaseException, now: float | None
    ) -> None:
        state.status, state.error = status, error
        state.finished = self._clock() if now is None else now
        self.policy.discard(state.job.id)
        for uid in list(state.network_remaining):
            self._free_network(uid)
        if self._active_network is not None and self._active_network[0] is state:
            self._active_network = None
            self._admit_next_network()

    def _network_done(self, state: JobState, uid: str) -> None:
        self._free_network(uid)
        if self._active_network == (state, uid):
            self._active_network = None
            self._admit_next_network()

    def _free_network(self, uid: str) -> None:
        self.ledger.release_owner(uid, keep=self.running)
        if self.resident is not None:
            self.resident.release_owner(uid, keep=self.running)

    # --- state ----------------------------------------------------------------------

    @property
    def busy(self) -> int:
        """Tasks running now."""
        return len(self.running)

    def unresolved(self) -> list[JobState]:
        return [s for s in self.jobs.values() if not s.resolved]
