"""The runtime's job front end: requests in, futures out, each resolved exactly once.

:meth:`JobFrontEnd.submit` checks a job (its networks READY, its input of the prepared
shape, :mod:`layerfit.schedule.runtime.inputs`; the queue not full), turns it into tasks with the
dispatcher and hands back a :class:`~concurrent.futures.Future`. The job then resolves
exactly once, whichever comes first: its last task completes, a task fails, its caller
cancels the future, its timeout expires (the timer thread, :meth:`JobFrontEnd.run_timer`)
or the runtime shuts down. Resolving drops its queued tasks, abandons its networks and
returns its reserved memory at once; the future is set outside the runtime's lock.
"""

from __future__ import annotations

import heapq
import math
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from layerfit.errors import (
    CorruptStoreError,
    JobTimeoutError,
    ModelNotReadyError,
    QueueFullError,
    RequestTooLargeError,
    ScheduleError,
)
from layerfit.schedule.dispatch import JobState, JobStatus
from layerfit.schedule.report import JobResult
from layerfit.schedule.runtime.core import Delivery, deliver
from layerfit.schedule.runtime.inputs import ForwardCall, call_sizes, forward_call
from layerfit.schedule.tasks import Job as ScheduledJob
from layerfit.sizes import format_bytes

if TYPE_CHECKING:
    from layerfit.schedule.profile import NetworkProfile
    from layerfit.schedule.runtime.config import RuntimeConfig
    from layerfit.schedule.runtime.core import RuntimeCore
    from layerfit.schedule.runtime.network_run import NetworkRun
    from layerfit.schedule.runtime.repository import EnginePool, ModelRepository
    from layerfit.store.manifest import Manifest

OUTCOMES = ("submitted", "done", "failed", "rejected", "cancelled", "timed_out")


@dataclass(frozen=True)
class InferenceJob:
    """One input analysed by a set of networks (model names of the repository).

    ``input`` is the model input — a tensor, or a tuple of positional arguments — given
    to every network, or a mapping from model name to its own input (networks of one
    job may expect different resolutions). A model prepared from keyword arguments
    (Whisper's features and decoder ids) takes a mapping of them, by their names: as the
    job's input, or as its entry in a mapping by model name. ``timeout`` (seconds from
    submission) cancels the job if it has not finished by then; ``deadline`` (seconds)
    is only reported. ``tag`` is carried through for the caller (e.g. an image file name).
    """

    networks: tuple[str, ...]
    input: Any
    deadline: float | None = None
    timeout: float | None = None
    tag: str | None = None

    def __post_init__(self) -> None:
        networks = (self.networks,) if isinstance(self.networks, str) else tuple(self.networks)
        object.__setattr__(self, "networks", networks)


Job = InferenceJob  # the name the runtime's API uses: ``rt.submit(Job(...))``


@dataclass(eq=False)
class JobRun:
    """The runtime's side of a submitted job (read by the worker pool, under the lock)."""

    id: str
    spec: InferenceJob
    future: Future
    models: dict[str, str]  # network uid -> model name
    inputs: dict[str, ForwardCall]  # network uid -> forward call, until its init
    pools: dict[str, EnginePool] = field(default_factory=dict)  # network uid -> its model's engines
    unwrap: str | None = None  # infer(): resolve with this model's output alone
    expires: float | None = None
    submitted: float = 0.0  # runtime clock at submit, for the queue time
    resolved: bool = False
    outcome: str = ""  # done, failed, rejected, cancelled, timed_out
    networks: list[NetworkRun] = field(default_factory=list)


class JobFrontEnd:
    """Submit, futures, timeouts and input checks of a runtime's jobs.

    ``retire_network`` forgets a network of a resolved job once its forward thread has
    left (the worker pool's); ``on_exit`` and ``on_crash`` are the runtime's, called by
    the timer thread as it leaves for good or after an internal error.
    """

    def __init__(
        self,
        core: RuntimeCore,
        repository: ModelRepository,
        config: RuntimeConfig,
        *,
        retire_network: Callable[[NetworkRun], None],
        on_exit: Callable[[], None],
        on_crash: Callable[[BaseException], None],
    ) -> None:
        self._core = core
        self._repository = repository
        self.queue_limit = config.queue_limit
        self._trace = config.trace
        self._retire_network = retire_network
        self._on_exit = on_exit
        self._on_crash = on_crash
        self._expiries: list[tuple[float, int, str]] = []  # (expiry, seq, job id), a heap
        self._seq = 0
        self.outcomes = dict.fromkeys(OUTCOMES, 0)  # jobs by how they ended
        self.results: list[JobResult] = []  # every resolved job, with ``trace``

    # --- submitting ----------------------------------------------------------------------

    def submit(self, spec: InferenceJob, unwrap: str | None) -> Future:
        """Check ``spec`` and queue it; see :meth:`layerfit.schedule.runtime.executor.Runtime.submit`.
        With ``unwrap``, the future resolves to that model's output alone."""
        _check_job(spec)
        profiles, inputs = [], []
        for name in spec.networks:
            profile, manifest = self._repository.ready(name)
            call = forward_call(spec.input, name, manifest)
            sizes = call_sizes(call, name, manifest)
            if sizes is not None:
                profiles.append(self._sized(name, profile, manifest, sizes))
            else:
                profiles.append(self._batched(name, profile, manifest, call))
            inputs.append(call)
        future: Future = Future()
        with self._core.lock:
            job_id, delivery = self._enqueue_locked(spec, unwrap, future, profiles, inputs)
        future.add_done_callback(partial(self._on_future_done, job_id))
        deliver([delivery])
        return future

    def _sized(self, name: str, profile: NetworkProfile, manifest: Manifest, sizes: dict[str, int]) -> NetworkProfile:
        """``profile`` with its activations at the request's shape (a text model's batch and
        lengths; measured at prepare time) in place of the prepared shape's; a shape whose
        job could never fit the budget is refused (:class:`RequestTooLargeError`, 413)."""
        shapes = manifest.variable_shapes
        extra = shapes.activation_bytes(sizes) - shapes.prepared_activation_bytes()
        return self._grown(name, profile, manifest, extra, f"a pass over {shapes.describe(sizes)}",
                           "its activations as measured when the model was prepared", "fewer or shorter sequences")

    def _batched(self, name: str, profile: NetworkProfile, manifest: Manifest, call: ForwardCall) -> NetworkProfile:
        """``profile`` for a call of a larger batch than prepared, of a model without
        varying axes: its activations grown in proportion to the batch (every activation
        tensor of a pass carries the batch; the weights do not), never shrunk for a
        smaller one (a tensor that does not carry the batch would then be undercounted)."""
        args, kwargs = call
        first = args[0] if args else next(iter(kwargs.values()))
        prepared = (manifest.input_keywords[0][1] if manifest.input_keywords else manifest.input_shape)[0]
        batch = int(first.shape[0]) if first.dim() else prepared
        if batch <= prepared:
            return profile
        activations = max(profile.init_memory - manifest.resident_bytes, 0)
        extra = -(-activations * batch // prepared) - activations
        return self._grown(name, profile, manifest, extra, f"a batch of {batch}",
                           f"its activations at batch {prepared} × {batch / prepared:g}", "a smaller batch")

    def _grown(
        self, name: str, profile: NetworkProfile, manifest: Manifest, extra: int, what: str, how: str, instead: str
    ) -> NetworkProfile:
        """``profile`` with ``extra`` bytes of activations; refused (413) if its job could never fit."""
        if extra == 0:
            return profile
        sized = replace(profile, init_memory=max(manifest.resident_bytes, profile.init_memory + extra))
        needed, budget = self._repository.budget_needed(sized), self._core.ledger.budget
        if needed > budget:
            raise RequestTooLargeError(
                f"model {name!r}: {what} needs a memory budget of {format_bytes(needed)} ({how}, beside its "
                f"weights), more than the runtime's {format_bytes(budget)}: send {instead}"
            )
        return sized

    def _enqueue_locked(
        self,
        spec: InferenceJob,
        unwrap: str | None,
        future: Future,
        profiles: list[NetworkProfile],
        inputs: list[ForwardCall],
    ) -> tuple[str, Delivery]:
        """Queue a checked job with the dispatcher (lock held): its id, and its delivery
        if it resolved at once (rejected for its size)."""
        core = self._core
        core.refuse_if_closing("it takes no new jobs")
        models = self._repository.models
        pools = {}
        for name in spec.networks:
            pool = models[name].pool
            if pool is None:  # unloaded since the check above
                raise ModelNotReadyError(f"model {name!r} is not ready ({models[name].reason}); load it first")
            pools[name] = pool
        if self.queue_limit is not None and len(core.jobs) >= self.queue_limit:
            raise QueueFullError(
                f"the queue is full ({len(core.jobs)} unfinished jobs, limit "
                f"{self.queue_limit}): retry later"
            )
        seq = self._seq
        self._seq += 1
        job_id = f"j{seq}"
        now = core.clock()
        uids = [f"{job_id}/{i}.{p.name}" for i, p in enumerate(profiles)]
        run = JobRun(
            id=job_id,
            spec=spec,
            future=future,
            models=dict(zip(uids, spec.networks, strict=True)),
            inputs=dict(zip(uids, inputs, strict=True)),
            pools={uid: pools[name] for uid, name in zip(uids, spec.networks, strict=True)},
            unwrap=unwrap,
            expires=None if spec.timeout is None else now + spec.timeout,
            submitted=now,
        )
        scheduled = ScheduledJob(
            id=job_id, networks=tuple(profiles), arrival=now, deadline=spec.deadline, input=spec.tag, seq=seq
        )
        state = core.dispatcher.submit(scheduled, now)
        if core.cache is not None and not state.resolved:
            for uid, pool in run.pools.items():
                core.cache.requested(uid, pool)
        core.jobs[job_id] = run
        self.outcomes["submitted"] += 1
        delivery: Delivery = None
        if state.resolved:
            delivery = self.resolve_locked(run, state)
        elif run.expires is not None:
            heapq.heappush(self._expiries, (run.expires, seq, job_id))
            core.timer.notify_all()
        return job_id, delivery

    def _on_future_done(self, job_id: str, future: Future) -> None:
        """A caller cancelled the future: cancel the job and free its memory."""
        if not future.cancelled():
            return
        with self._core.lock:
            run = self._core.jobs.get(job_id)
            if run is not None:
                self.cancel_locked(run, ScheduleError(f"job {job_id} was cancelled"), "cancelled")

    def started_locked(self, job_id: str, start: float) -> None:
        """A task of job ``job_id`` starts at ``start`` (lock held): the first one sets the
        time from submission to it on the future, where the server's queue-time metric reads it."""
        run = self._core.jobs.get(job_id)
        if run is not None and not hasattr(run.future, "queue_seconds"):
            run.future.queue_seconds = start - run.submitted

    def futures(self) -> list[Future]:
        """The futures of every unresolved job (lock held)."""
        return [run.future for run in self._core.jobs.values()]

    # --- resolution ----------------------------------------------------------------------

    def task_ended_locked(self, job_id: str) -> Delivery:
        """A task of job ``job_id`` completed or failed in the dispatcher (lock held):
        resolve the job if that resolved it, and forget it once none of its tasks runs."""
        run = self._core.jobs.get(job_id)
        state = self._core.dispatcher.jobs.get(job_id)
        delivery = None
        if run is not None and state is not None and state.resolved:
            delivery = self.resolve_locked(run, state)
        self._prune_locked(job_id)
        return delivery

    def fail_locked(self, job_id: str, error: BaseException) -> Delivery:
        """Job ``job_id`` fails with ``error`` (a network's forward pass raised; lock held)."""
        run = self._core.jobs.get(job_id)
        if run is None:
            return None
        run.outcome = "failed"
        state = self._core.dispatcher.cancel(run.id, error, self._core.clock(), status=JobStatus.FAILED)
        return self.resolve_locked(run, state)

    def cancel_locked(self, run: JobRun, error: BaseException, outcome: str) -> Delivery:
        """Cancel ``run`` in the dispatcher, recording ``outcome`` (lock held)."""
        run.outcome = outcome
        state = self._core.dispatcher.cancel(run.id, error, self._core.clock())
        return self.resolve_locked(run, state)

    def fail_all_locked(self, error: BaseException) -> list[Delivery]:
        """Fail every unresolved job with ``error`` (the runtime crashed; lock held)."""
        return [self.cancel_locked(run, error, "failed") for run in list(self._core.jobs.values())]

    def resolve_locked(self, run: JobRun, state: JobState) -> Delivery:
        """``run``'s job is resolved in the dispatcher: settle the runtime's side."""
        if run.resolved:
            return None
        core = self._core
        run.resolved = True
        core.jobs.pop(run.id, None)
        if not run.outcome:
            run.outcome = {
                JobStatus.DONE: "done",
                JobStatus.REJECTED: "rejected",
                JobStatus.CANCELLED: "cancelled",
            }.get(state.status, "failed")
        self.outcomes[run.outcome] += 1
        if self._trace:
            result = JobResult.from_state(state)
            if result.status != run.outcome:  # timed out, or failed by a crash: not "cancelled"
                result = replace(result, status=run.outcome)
            self.results.append(result)
        delivery: Delivery
        if state.status is JobStatus.DONE:
            outputs = {}
            for net in run.networks:
                outputs[net.model] = net.output
                net.output = None
            delivery = (run.future, True, outputs[run.unwrap] if run.unwrap else outputs)
        else:
            delivery = self._failure_locked(run, state)
        run.inputs.clear()
        if core.cache is not None:
            for uid in run.models:
                core.cache.finished(uid)
        for net in run.networks:
            self._retire_network(net)
        self._prune_locked(run.id)
        self._repository.close_retired_locked()
        core.notify_all()
        return delivery

    def _failure_locked(self, run: JobRun, state: JobState) -> Delivery:
        """The delivery of a job that did not complete, abandoning its networks; a unit that
        failed verification takes its model out of service."""
        error = state.error or ScheduleError(f"job {run.id} {state.status.value}")
        if isinstance(error, CorruptStoreError):  # the model's weights changed or rotted on disk
            for net in run.networks:
                if net.output is None:
                    self._repository.take_down_locked(
                        net.model, f"its weights failed verification ({error}); fix or prepare the folder "
                        "again, then load it"
                    )
        for net in run.networks:
            net.abandon()
        if run.outcome == "timed_out":
            error = JobTimeoutError(
                f"job {run.id} did not finish within its timeout of {run.spec.timeout:g} s; "
                "it was cancelled and its memory freed"
            )
        return None if run.future.cancelled() else (run.future, False, error)

    def _prune_locked(self, job_id: str) -> None:
        """Drop a resolved job from the dispatcher once none of its tasks runs."""
        dispatcher = self._core.dispatcher
        state = dispatcher.jobs.get(job_id)
        if state is None or not state.resolved:
            return
        if any(task.job == job_id for task in dispatcher.running.values()):
            return
        del dispatcher.jobs[job_id]

    # --- timeouts ------------------------------------------------------------------------

    def run_timer(self) -> None:
        """The timer thread: cancel each job whose timeout expires, until the runtime is
        shut down and no job is left."""
        core = self._core
        try:
            while True:
                with core.lock:
                    due = self._wait_for_expiries_locked()
                    if due is None:
                        self._on_exit()
                        return
                    deliveries = [
                        self.cancel_locked(run, ScheduleError(f"job {run.id} timed out"), "timed_out")
                        for run in due
                    ]
                deliver(deliveries)
        except BaseException as exc:
            self._on_crash(exc)

    def _wait_for_expiries_locked(self) -> list[JobRun] | None:
        """Wait until some jobs' timeouts expire and return them, or ``None`` once the
        runtime is closing and no job is left (lock held)."""
        core = self._core
        while True:
            if core.closing and not core.jobs:
                return None
            now = core.clock()
            due = []
            while self._expiries and self._expiries[0][0] <= now:
                _, _, job_id = heapq.heappop(self._expiries)
                if job_id in core.jobs:
                    due.append(core.jobs[job_id])
            if due:
                return due
            while self._expiries and self._expiries[0][2] not in core.jobs:
                heapq.heappop(self._expiries)
            wait = self._expiries[0][0] - now if self._expiries else None
            core.timer.wait(None if wait is None else min(wait, threading.TIMEOUT_MAX))

    def clear_trace(self) -> None:
        """Forget the jobs' results and outcome counts recorded so far (lock held)."""
        self.results.clear()
        self.outcomes = dict.fromkeys(self.outcomes, 0)


def _check_job(spec: InferenceJob) -> None:
    """Refuse a job that is not one: no or repeated networks, a timeout or deadline that
    is no finite number of seconds > 0."""
    if not isinstance(spec, InferenceJob):
        raise ScheduleError(f"submit() takes a layerfit Job, got {type(spec).__name__}")
    if not spec.networks:
        raise ScheduleError("a job needs at least one network")
    if len(set(spec.networks)) != len(spec.networks):
        raise ScheduleError(f"a job names each network once, got {list(spec.networks)}")
    for key in ("timeout", "deadline"):
        value = getattr(spec, key)
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not value > 0
            or not math.isfinite(value)
        ):
            raise ScheduleError(
                f"a job's {key} must be a finite number of seconds > 0 (None: no limit), got {value!r}"
            )


__all__ = ["InferenceJob", "Job", "JobFrontEnd", "JobRun"]
