"""The real multi-request executor: prepared models, N workers, one memory budget.

``Runtime(repository, memory_budget, workers, policy)`` serves *jobs* — one input
analysed by a set of networks (thesis §7.1) — over the prepared models in the
sub-folders of ``repository`` (:mod:`layerfit.schedule.repository`)::

    with Runtime("models/", "512MB", workers=2, policy="masa-fair") as rt:
        future = rt.submit(Job(("agenet", "gendernet"), image))
        outputs = future.result()          # {"agenet": tensor, "gendernet": tensor}
        logits = rt.infer("agenet", image).result()

How a job runs. :meth:`Runtime.submit` turns the job into init/load/execute/unload
tasks under the policy's dependency scheme (:class:`~layerfit.schedule.Dispatcher`,
the same object the simulator drives). ``workers`` threads each take the task the
policy picks for them, with its memory reserved in the
:class:`~layerfit.schedule.MemoryLedger`:

- **init** checks an engine of the model out of its pool (a meta-device skeleton; no
  weights) and starts the network's forward thread, which runs the model's own
  ``forward`` through :meth:`layerfit.engine.Engine.run_from` with a
  :class:`~layerfit.schedule.network_run.NetworkRun` as its unit source;
- **load** reads one unit through the engine's reader into a buffer of exactly the
  unit's bytes — the bytes the ledger reserved for it;
- **execute** lets the forward thread run that unit and holds the worker until it has,
  so at most ``workers`` tasks run at any moment;
- **unload** frees the buffer — or, with ``cache_weights``, hands it to the
  :class:`~layerfit.schedule.weight_cache.WeightCache`, so that a later job's load of the
  same unit takes it instead of reading it (evicted whenever a task needs the memory).

Memory estimates per task come from the capture (default) or from the ``/proc/self/statm``
profiler (``estimates="profile"``, thesis §5.3), see :mod:`layerfit.schedule.profiler`.
The ledger never exceeds the budget except through the progress rule (when nothing
runs, the smallest ready task may run alone), counted in ``stats()["progress_rule_fired"]``.
A job whose largest task cannot fit the budget even alone is rejected
(:class:`~layerfit.errors.JobRejectedError` with the minimum budget).

Threads: ``workers`` worker threads, one timer thread (timeouts), one forward thread
per network in flight. All of them wait on conditions sharing one lock; none polls.
Futures stay cancellable until they resolve: :meth:`Future.cancel`, a timeout or
``shutdown(cancel_pending=True)`` drops the job's queued tasks, abandons its forward
threads and returns its reserved memory to the ledger at once (running tasks return
theirs when they finish).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from layerfit.engine.engine import Engine
from layerfit.engine.osmem import (
    AFTER_PASS_TRIM_THRESHOLD,
    HEAP_TRIM_THRESHOLD,
    limit_heap_arenas,
    return_large_frees_to_os,
    trim_heap,
)
from layerfit.engine.units import check_units_spec
from layerfit.errors import (
    CorruptStoreError,
    InputError,
    JobTimeoutError,
    LayerfitError,
    ModelNotReadyError,
    ModelOverBudgetError,
    QueueFullError,
    ScheduleError,
    UnknownModelError,
)
from layerfit.schedule.dispatch import Dispatcher, JobState, JobStatus
from layerfit.schedule.ledger import MemoryLedger
from layerfit.schedule.network_run import Abandoned, NetworkRun
from layerfit.schedule.policies import make_policy
from layerfit.schedule.profile import NetworkProfile, ProfileSet
from layerfit.schedule.profiler import estimate_profile, measure_profile
from layerfit.schedule.report import JobResult, RunReport, TaskRecord
from layerfit.schedule.repository import (
    EnginePool,
    ModelInfo,
    check_name,
    model_directory,
    scan,
)
from layerfit.schedule.tasks import Job as ScheduledJob
from layerfit.schedule.tasks import TaskKind
from layerfit.schedule.weight_cache import WeightCache
from layerfit.sizes import format_bytes, parse_bytes
from layerfit.store.manifest import DTYPES, Manifest, read_manifest
from layerfit.store.trust import trust_factories
from layerfit.store.verify import VERIFY_MODES

ESTIMATES = ("capture", "profile")
AUTO_UNITS = "merge:auto"  # merge layers as far as the model's minimum budget allows
FREED_MEMORY = ("after-pass", "eagerly", "never")  # when freed scratch leaves the process


def freed_memory_mode(value: object, option: str = "return_freed_memory") -> str:
    """``value`` as one of :data:`FREED_MEMORY` (``True``/``False`` are the default and
    ``"never"``); raises naming ``option`` (a CLI's flag) for anything else."""
    if value is True:
        return "after-pass"
    if value is False:
        return "never"
    if value not in FREED_MEMORY:
        raise ScheduleError(f"{option} must be one of {', '.join(FREED_MEMORY)}, got {value!r}")
    return str(value)


def check_runtime_units(units: object) -> None:
    """Raise if ``units`` is no granularity the runtime takes: the engine's (``layers``,
    ``blocks:N``, ``merge:SIZE``) or ``merge:auto`` (before any model is opened)."""
    if not isinstance(units, str):
        raise ScheduleError(f"units must be layers, merge:auto, merge:SIZE or blocks:N, got {units!r}")
    if units == AUTO_UNITS:
        return
    try:
        check_units_spec(units)
    except LayerfitError as exc:
        raise ScheduleError(f"{exc}; the runtime also takes {AUTO_UNITS}") from exc


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


Delivery = tuple[Future, bool, Any] | None  # (future, is result, value)


@dataclass(eq=False)
class _JobRun:
    """The runtime's side of a submitted job."""

    id: str
    spec: InferenceJob
    future: Future
    models: dict[str, str]  # network uid -> model name
    inputs: dict[str, tuple[tuple[Any, ...], dict[str, Any]]]  # network uid -> forward call, until its init
    pools: dict[str, EnginePool] = field(default_factory=dict)  # network uid -> its model's engines
    unwrap: str | None = None  # infer(): resolve with this model's output alone
    expires: float | None = None
    submitted: float = 0.0  # runtime clock at submit, for the queue time
    resolved: bool = False
    outcome: str = ""  # done, failed, rejected, cancelled, timed_out
    networks: list[NetworkRun] = field(default_factory=list)


class Runtime:
    """Serve jobs over a repository of prepared models within one memory budget.

    ``memory_budget`` is bytes or a size (``"512MB"``); ``policy`` any of
    :func:`layerfit.schedule.policy_names` (default ``masa-fair``, the one that never goes
    over a budget every model fits alone in; ``masa`` is the thesis's Algorithm 1).
    Keyword options:

    - ``queue_limit`` — most unfinished jobs at once; beyond it ``submit`` raises
      :class:`~layerfit.errors.QueueFullError`;
    - ``estimates`` — ``"capture"`` (default) or ``"profile"`` (statm profiler, runs
      each model a few times when it loads); ``profiles`` — precomputed profiles by
      model name, used instead where given;
    - ``estimate_factor`` — scales every memory estimate the scheduler is told
      (sensitivity analysis, thesis §7.6); the real allocations do not change;
    - ``trace`` — keep every task's start and end, the ledger's history and every job's
      result for :meth:`run_report` (memory grows with the number of tasks);
    - ``load`` — load every model of the repository now (else call :meth:`load_model`);
    - ``direct_io`` — read units with ``O_DIRECT`` where the filesystem allows it;
    - ``gated`` — ``False`` runs a memory-oblivious policy (Bulk, DeepEye, FCFS, …) the
      way the thesis's EdgeCaffe baselines run: it ignores the budget and over-commits
      (counted as ``overcommits``), leaving the operating system to page. Memory-aware
      policies (masa, masa-fcfs, masa-fair) keep the budget either way;
    - ``return_freed_memory`` — when the scratch that executions free leaves the process
      rather than staying resident in the C heap beside the budget (glibc only; what it
      sets is the whole process's: the allocator's thresholds,
      :func:`~layerfit.engine.osmem.return_large_frees_to_os`, and one heap per CPU,
      :func:`~layerfit.engine.osmem.limit_heap_arenas`): ``"after-pass"`` (default, or
      ``True``) when each network's forward pass ends; ``"eagerly"`` as soon as 128 KiB
      of a heap's top is free (a few MB less RSS, but a model that frees and allocates
      megabytes per layer computes up to twice as slowly); ``"never"`` (or ``False``)
      glibc's own adaptive thresholds, which keep freed blocks of up to 32 MiB
      (``bench/freed_memory.py`` compares the three);
    - ``units`` — what one load and one execute task cover: ``"layers"`` (default, one
      stored layer each, as the thesis schedules), ``"merge:auto"`` (consecutive layers
      joined as far as the model's minimum budget stays what it is by layers: fewer,
      larger reads and tasks, so less latency per request, at no cost in budget),
      ``"merge:SIZE"`` (blocks of at most SIZE bytes; a larger layer stays alone) or
      ``"blocks:N"``;
    - ``cache_weights`` — keep units loaded by earlier jobs in the budget's spare memory
      (:class:`~layerfit.schedule.weight_cache.WeightCache`): a later job's load of the
      same unit takes it instead of reading it, and any task that needs the memory
      evicts it first, so the budget holds either way. Off by default (the thesis reads
      every job's weights); a server with a budget above its models' minimum wants it;
    - ``verify`` — when a unit's SHA-256 is checked: ``"first"`` (default: its first read
      by the model's engines), ``"always"`` (every read from storage; a cached unit is
      not read again) or ``"never"``; a unit that fails makes its model UNAVAILABLE
      until it is loaded again;
    - ``trust_factory`` — modules whose factories the repository's folders may run
      (:mod:`layerfit.store.trust`).

    Call :meth:`shutdown` (or use it as a context manager): its threads wait for work
    until then.
    """

    def __init__(
        self,
        repository: str | Path,
        memory_budget: int | str,
        workers: int = 2,
        policy: str = "masa-fair",
        *,
        queue_limit: int | None = None,
        estimates: str = "capture",
        profiles: Mapping[str, NetworkProfile] | None = None,
        estimate_factor: float = 1.0,
        trace: bool = False,
        load: bool = True,
        direct_io: bool = True,
        gated: bool = True,
        return_freed_memory: bool | str = "after-pass",
        units: str = "layers",
        cache_weights: bool = False,
        trust_factory: Iterable[str] = (),
        verify: str = "first",
    ) -> None:
        # modules whose factories the repository's folders may run (layerfit.store.trust)
        trust_factories([trust_factory] if isinstance(trust_factory, str) else trust_factory)
        if verify not in VERIFY_MODES:
            raise ScheduleError(f"verify must be one of {', '.join(VERIFY_MODES)}, not {verify!r}")
        self._verify = verify  # when an engine checks a unit's SHA-256: each read from disk, its first, never
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ScheduleError(f"need at least one worker, got {workers!r}")
        if queue_limit is not None and (
            isinstance(queue_limit, bool) or not isinstance(queue_limit, int) or queue_limit < 1
        ):
            raise ScheduleError(f"queue_limit must be a positive whole number, got {queue_limit!r}")
        if estimates not in ESTIMATES:
            raise ScheduleError(f"estimates must be one of {', '.join(ESTIMATES)}, got {estimates!r}")
        if not isinstance(policy, str):
            raise ScheduleError(f"policy must be a policy's name, got {policy!r}")
        check_runtime_units(units)
        if not isinstance(cache_weights, bool):
            raise ScheduleError(f"cache_weights must be True or False, got {cache_weights!r}")
        freed_memory = freed_memory_mode(return_freed_memory)
        self.repository = Path(repository)
        self.workers = workers
        self.queue_limit = queue_limit
        self.estimates = estimates
        self.trace = trace
        self._profiles = dict(profiles or {})
        self._direct_io = direct_io
        self.units = units
        self._lock = threading.RLock()
        self._t0 = time.monotonic()
        budget = parse_bytes(memory_budget)
        self._ledger = MemoryLedger(budget, clock=self._clock, record=trace, lock=self._lock)
        self._work = self._ledger.condition  # notified by every ledger and dispatcher change
        self._timer_cond = threading.Condition(self._lock)
        self._policy = make_policy(policy, gated=gated)
        self._cache = WeightCache(self._ledger, self._cached_model) if cache_weights else None
        self._dispatcher = Dispatcher(
            self._policy, self._ledger, workers, estimate_factor=estimate_factor, reclaimer=self._cache
        )
        self.policy = self._policy.name
        self.models: dict[str, ModelInfo] = {
            name: ModelInfo(name, self.repository / name) for name in scan(self.repository)
        }
        # every setting and the repository are valid (the dispatcher checks estimate_factor); before any
        # model loads, since only later allocations follow the fixed thresholds
        if freed_memory != "never" and return_large_frees_to_os(
            trim_threshold_bytes=HEAP_TRIM_THRESHOLD if freed_memory == "eagerly" else AFTER_PASS_TRIM_THRESHOLD
        ):
            self.freed_memory = freed_memory
            limit_heap_arenas(max(os.cpu_count() or 1, 2))  # forward threads share few heaps
        else:
            self.freed_memory = "never"  # asked for, or not glibc
        self._jobs: dict[str, _JobRun] = {}  # unresolved jobs
        self._nets: dict[str, NetworkRun] = {}  # networks with a forward thread or buffers
        self._net_pools: dict[str, EnginePool] = {}
        self._retiring: list[EnginePool] = []  # unloaded or replaced, closed when no job holds them
        self._threads_running = workers + 1  # workers and timer; the last out closes the pools
        self._expiries: list[tuple[float, int, str]] = []
        self._seq = 0
        self._closing = False
        self._crashed: BaseException | None = None
        self._started = dict.fromkeys(TaskKind, 0)
        self._outcomes = dict.fromkeys(
            ("submitted", "done", "failed", "rejected", "cancelled", "timed_out"), 0
        )
        self._records: list[TaskRecord] = []
        self._results: list[JobResult] = []
        self._busy = [0.0] * workers
        self._forward_threads: list[threading.Thread] = []
        self._peak_buffers = 0
        self._bytes_read = 0  # unit bytes load tasks read from storage
        if load:
            for name in list(self.models):
                with contextlib.suppress(LayerfitError):  # recorded as UNAVAILABLE with the reason
                    self.load_model(name)
        self._threads = [
            threading.Thread(
                target=self._worker_loop, args=(i,), name=f"layerfit-worker-{i}", daemon=True
            )
            for i in range(workers)
        ]
        self._threads.append(
            threading.Thread(target=self._timer_loop, name="layerfit-timer", daemon=True)
        )
        for thread in self._threads:
            thread.start()

    def _clock(self) -> float:
        return time.monotonic() - self._t0

    # --- the repository ---------------------------------------------------------------

    def index(self) -> list[dict[str, str]]:
        """Every model folder of the repository: ``name``, ``state`` (READY/UNAVAILABLE), ``reason``.

        Folders added since the runtime started are listed too (UNAVAILABLE until loaded).
        """
        with contextlib.suppress(LayerfitError):
            names = scan(self.repository)
            with self._lock:
                for name in names:
                    if name not in self.models:
                        self.models[name] = ModelInfo(name, self.repository / name)
        with self._lock:
            return [self.models[name].index_entry() for name in sorted(self.models)]

    def load_model(self, name: str, *, within_budget: bool = False) -> ModelInfo:
        """(Re)load model ``name``: validate its folder, open it, fix its profile.

        A folder that cannot be loaded raises a :class:`~layerfit.errors.LayerfitError`
        and is marked UNAVAILABLE with the reason; other models are not affected. Loads
        and unloads of one model take effect one after the other, in the order called;
        a load still running when the runtime shuts down closes what it opened and raises.

        By default a model too large for the budget loads and each of its jobs is
        rejected with the minimum budget (a job whose tasks each fit runs, going over
        the budget if the model cannot run within it); with ``within_budget`` a model
        that cannot run within the budget is never READY: it stays UNAVAILABLE and
        :class:`~layerfit.errors.ModelOverBudgetError` (carrying ``min_budget``) is
        raised — what a server wants, whose clients must not see a model it cannot run.
        """
        directory = model_directory(self.repository, name)
        with self._lock:
            self._refuse_if_closing("it loads no models")
            info = self.models.get(name)
            if info is None:
                if not directory.is_dir():
                    raise UnknownModelError(
                        f"no model {name!r} in {self.repository}: known models are "
                        f"{', '.join(sorted(self.models)) or 'none'}"
                    )
                info = self.models[name] = ModelInfo(name, directory)
        with info.changing:
            return self._load_locked(info, directory, within_budget)

    def _load_locked(self, info: ModelInfo, directory: Path, within_budget: bool) -> ModelInfo:
        """:meth:`load_model` with the model's ``changing`` lock held.

        A model that is READY keeps serving while it is reloaded, and if the reload fails
        (as Triton does): the new version replaces it only once it has loaded.
        """
        name = info.name
        with self._lock:
            serving = info.loaded and info.pool is not None
            if not serving:
                info.loaded, info.reason = False, "loading"
        engine: Engine | None = None
        try:
            layered = self._profile(name, directory, read_manifest(directory))
            units = self._engine_units(layered)
            engine = self._new_engine(directory, units)
            # one task per unit of the engine: the profile by layers, grouped into its blocks
            profile = layered.grouped([len(b.segments) for b in engine.blocks]) if engine.blocks else layered
            if within_budget:
                self._check_fits(name, profile)
            with self._lock:
                self._refuse_if_closing("it loads no models")
                old_pool = info.pool
                info.manifest = engine.manifest
                info.profile = profile
                info.pool = EnginePool(partial(self._new_engine, directory, units), engine)
                info.loaded, info.reason = True, ""
            if old_pool is not None:
                self._retire_pool(old_pool)
        except Exception as exc:
            if engine is not None:
                engine.close()
            error = exc if isinstance(exc, LayerfitError) else LayerfitError(
                f"cannot load model {name!r} from {directory}: {type(exc).__name__}: {exc}"
            )
            with self._lock:
                still = serving and info.loaded and not self._closing
                if not still:
                    info.reason = "the runtime is shut down" if self._closing else str(error)
            if still:  # as Triton: the version loaded before keeps serving
                raise LayerfitError(f"{error} (the version loaded before keeps serving)") from exc
            if error is exc:
                raise
            raise error from exc
        return info

    def mark_unavailable(self, name: str, reason: str) -> None:
        """Take model ``name`` out of service (UNAVAILABLE, ``reason``) until it is loaded
        again, as when its weights fail verification: new jobs naming it are refused,
        jobs already accepted end, and its engines close when the last of them ends."""
        with self._lock:
            self._take_down_locked(name, reason)
            if self._retiring:
                self._close_retired_locked()

    def _take_down_locked(self, name: str, reason: str) -> None:
        info = self.models.get(name)
        if info is None or not info.loaded:
            return
        pool, info.pool = info.pool, None
        info.loaded, info.reason = False, reason
        if pool is not None:
            if self._cache is not None:
                self._cache.drop_model(pool)
            self._retiring.append(pool)

    def _refuse_if_closing(self, what: str) -> None:
        """Raise if :meth:`shutdown` was called (lock held)."""
        if self._closing:
            if self._crashed is not None:
                raise ScheduleError(f"the runtime is shut down: {self._crashed}") from self._crashed
            raise ScheduleError(f"the runtime is shut down: {what}")

    def unload_model(self, name: str) -> None:
        """Stop serving model ``name``: new jobs naming it are refused; jobs already accepted
        (running or queued) finish, and its engines close when the last of them ends."""
        check_name(name)
        with self._lock:
            info = self.models.get(name)
            if info is None:
                raise UnknownModelError(f"no model {name!r} in {self.repository}")
        with info.changing:  # after a load in progress, not before it ends
            with self._lock:
                pool, info.pool = info.pool, None
                info.loaded, info.reason = False, "unloaded"
            if pool is not None:
                self._retire_pool(pool)

    def _retire_pool(self, pool: EnginePool) -> None:
        """Close ``pool`` now, or once no unresolved job was accepted with it."""
        with self._lock:
            if self._cache is not None:
                self._cache.drop_model(pool)
            if any(pool in run.pools.values() for run in self._jobs.values()):
                self._retiring.append(pool)
                return
        pool.close()

    def _close_retired_locked(self) -> None:
        """Close the retired pools that no unresolved job holds any more."""
        held = {id(p) for run in self._jobs.values() for p in run.pools.values()}
        done = [p for p in self._retiring if id(p) not in held]
        self._retiring = [p for p in self._retiring if id(p) in held]
        for pool in done:
            pool.close()

    def _engine_units(self, layered: NetworkProfile) -> str | list[int]:
        """The engines' granularity for a model: the runtime's ``units``, or for
        ``merge:auto`` the partition points its profile by layers allows."""
        if self.units != AUTO_UNITS:
            return self.units
        return list(itertools.accumulate(layered.blocks_within_min_budget()))[:-1]

    def _new_engine(self, directory: Path, units: str | list[int]) -> Engine:
        return Engine(directory, pipeline="external", direct_io=self._direct_io, units=units, verify=self._verify)

    def _profile(self, name: str, directory: Path, manifest: Manifest) -> NetworkProfile:
        """The model's profile, one layer per stored layer."""
        profile = self._profiles.get(name)
        if profile is None:
            if self.estimates == "profile":
                profile = measure_profile(directory, name)
            else:
                profile = estimate_profile(manifest, name)
        if profile.name != name:
            profile = NetworkProfile(
                name=name,
                layers=profile.layers,
                init_time=profile.init_time,
                init_memory=profile.init_memory,
                unload_time=profile.unload_time,
                architecture=profile.architecture,
                source=profile.source,
                notes=dict(profile.notes),
            )
        if len(profile.layers) != max(1, len(manifest.units)):  # no unit: the whole model
            raise ScheduleError(
                f"the profile of {name!r} has {len(profile.layers)} layers but the prepared "
                f"model has {len(manifest.units)} units: profile this prepared model"
            )
        return profile

    def required_budget(self, name: str) -> int:
        """The least memory budget under which jobs of model ``name`` are not rejected:
        its largest task as the scheduler is told it (profile × ``estimate_factor``)."""
        profile, _ = self._ready(name)
        return int(round(profile.largest_task_memory * self._dispatcher.estimate_factor))

    def _check_fits(self, name: str, profile: NetworkProfile) -> None:
        """Raise :class:`ModelOverBudgetError` if ``profile`` cannot run within the budget.

        That is its init (resident weights, activations) beside its largest unit (load
        peak, or weights and execute scratch), not only its largest task: with less, its
        jobs would pass the job check and then run only through the progress rule, over
        the budget."""
        needed = int(round(profile.min_budget * self._dispatcher.estimate_factor))
        if needed > self._ledger.budget:
            raise ModelOverBudgetError(
                f"model {name!r} needs a memory budget of at least {format_bytes(needed)} "
                f"({needed} bytes) to run within it (one streamed unit at a time beside its "
                f"resident weights and activations), more than the runtime's budget of "
                f"{format_bytes(self._ledger.budget)}",
                min_budget=needed,
            )

    def profile_set(self, *, ready_only: bool = True) -> ProfileSet:
        """The scheduler's profiles of the loaded models (for workloads and the simulator);
        with ``ready_only=False`` also of models unloaded since (e.g. after shutdown)."""
        with self._lock:
            profiles = [
                i.profile
                for i in self.models.values()
                if i.profile is not None and (i.loaded or not ready_only)
            ]
        return ProfileSet(profiles, label=f"models of {self.repository}")

    def example_input(self, name: str, seed: int | None = None) -> torch.Tensor | dict[str, torch.Tensor]:
        """A deterministic input of the shape and dtype model ``name`` was prepared for, as
        :meth:`infer` takes it: a tensor, or for a model prepared from keyword arguments
        a dict of them."""
        from layerfit.store import example_call

        args, keywords = example_call(self._ready(name)[1], seed)
        return keywords if keywords else args[0]

    def _ready(self, name: str) -> tuple[NetworkProfile, Manifest]:
        check_name(name)
        with self._lock:
            info = self.models.get(name)
            if info is None:
                raise UnknownModelError(
                    f"no model {name!r} in {self.repository}: known models are "
                    f"{', '.join(sorted(self.models)) or 'none'}"
                )
            profile = info.require_ready()
            assert info.manifest is not None
            return profile, info.manifest

    # --- submitting -------------------------------------------------------------------

    def submit(self, job: InferenceJob) -> Future:
        """Queue ``job``; the future resolves to ``{model name: output}``.

        Raises at once for bad requests (unknown or unloaded model, wrong input, full
        queue, shut down); a job too large for the budget resolves with
        :class:`~layerfit.errors.JobRejectedError`, one whose task raised with that error.
        """
        return self._submit(job, unwrap=None)

    def infer(self, model: str, x: Any, *, timeout: float | None = None) -> Future:
        """One network on one input; the future resolves to that model's output."""
        return self._submit(InferenceJob((model,), x, timeout=timeout), unwrap=model)

    def _submit(self, spec: InferenceJob, unwrap: str | None) -> Future:
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
        profiles, inputs = [], []
        for name in spec.networks:
            profile, manifest = self._ready(name)
            profiles.append(profile)
            inputs.append(_forward_call(spec, name, manifest))
        future: Future = Future()
        deliveries: list[Delivery] = []
        with self._lock:
            self._refuse_if_closing("it takes no new jobs")
            pools = {}
            for name in spec.networks:
                pool = self.models[name].pool
                if pool is None:  # unloaded since the check above
                    raise ModelNotReadyError(f"model {name!r} is not ready ({self.models[name].reason}); load it first")
                pools[name] = pool
            if self.queue_limit is not None and len(self._jobs) >= self.queue_limit:
                raise QueueFullError(
                    f"the queue is full ({len(self._jobs)} unfinished jobs, limit "
                    f"{self.queue_limit}): retry later"
                )
            seq = self._seq
            self._seq += 1
            job_id = f"j{seq}"
            now = self._clock()
            uids = [f"{job_id}/{i}.{p.name}" for i, p in enumerate(profiles)]
            run = _JobRun(
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
                id=job_id,
                networks=tuple(profiles),
                arrival=now,
                deadline=spec.deadline,
                input=spec.tag,
                seq=seq,
            )
            state = self._dispatcher.submit(scheduled, now)
            if self._cache is not None and not state.resolved:
                for uid, pool in run.pools.items():
                    self._cache.requested(uid, pool)
            self._jobs[job_id] = run
            self._outcomes["submitted"] += 1
            if state.resolved:
                deliveries.append(self._resolve_locked(run, state))
            elif run.expires is not None:
                heapq.heappush(self._expiries, (run.expires, seq, job_id))
                self._timer_cond.notify_all()
        future.add_done_callback(partial(self._on_future_done, job_id))
        _deliver(deliveries)
        return future

    def _on_future_done(self, job_id: str, future: Future) -> None:
        """A caller cancelled the future: cancel the job and free its memory."""
        if not future.cancelled():
            return
        with self._lock:
            run = self._jobs.get(job_id)
            if run is not None:
                self._cancel_locked(run, ScheduleError(f"job {job_id} was cancelled"), "cancelled")

    # --- resolution -------------------------------------------------------------------

    def _cancel_locked(self, run: _JobRun, error: BaseException, outcome: str) -> Delivery:
        run.outcome = outcome
        state = self._dispatcher.cancel(run.id, error, self._clock())
        return self._resolve_locked(run, state)

    def _resolve_locked(self, run: _JobRun, state: JobState) -> Delivery:
        """``run``'s job is resolved in the dispatcher: settle the runtime's side."""
        if run.resolved:
            return None
        run.resolved = True
        self._jobs.pop(run.id, None)
        if not run.outcome:
            run.outcome = {
                JobStatus.DONE: "done",
                JobStatus.REJECTED: "rejected",
                JobStatus.CANCELLED: "cancelled",
            }.get(state.status, "failed")
        self._outcomes[run.outcome] += 1
        if self.trace:
            result = JobResult.from_state(state)
            if result.status != run.outcome:  # timed out, or failed by a crash: not "cancelled"
                result = replace(result, status=run.outcome)
            self._results.append(result)
        delivery: Delivery
        if state.status is JobStatus.DONE:
            outputs = {}
            for net in run.networks:
                outputs[net.model] = net.output
                net.output = None
            delivery = (run.future, True, outputs[run.unwrap] if run.unwrap else outputs)
        else:
            error = state.error or ScheduleError(f"job {run.id} {state.status.value}")
            if isinstance(error, CorruptStoreError):  # the model's weights changed or rotted on disk
                for net in run.networks:
                    if net.output is None:
                        self._take_down_locked(
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
            delivery = None if run.future.cancelled() else (run.future, False, error)
        run.inputs.clear()
        if self._cache is not None:
            for uid in run.models:
                self._cache.finished(uid)
        for net in run.networks:
            self._retire_network_locked(net)
        self._prune_locked(run.id)
        if self._retiring:
            self._close_retired_locked()
        self._work.notify_all()
        self._timer_cond.notify_all()
        return delivery

    def _retire_network_locked(self, net: NetworkRun) -> None:
        """Forget a network once its job is over and its forward thread has left the model."""
        if net.exited and net.job_id not in self._jobs:
            net.free_all()
            self._nets.pop(net.uid, None)

    def _prune_locked(self, job_id: str) -> None:
        """Drop a resolved job from the dispatcher once none of its tasks runs."""
        state = self._dispatcher.jobs.get(job_id)
        if state is None or not state.resolved:
            return
        if any(task.job == job_id for task in self._dispatcher.running.values()):
            return
        del self._dispatcher.jobs[job_id]

    # --- workers ----------------------------------------------------------------------

    def _worker_loop(self, index: int) -> None:
        try:
            while True:
                with self._lock:
                    while True:
                        if self._closing and not self._jobs:
                            self._thread_exits_locked()
                            return
                        assignment = self._dispatcher.assign(index, self._clock())
                        if assignment is not None:
                            break
                        self._work.wait()
                    task, admission = assignment
                    self._started[task.kind] += 1
                    start = self._clock()
                    job = self._jobs.get(task.job)
                    if job is not None and not hasattr(job.future, "queue_seconds"):
                        # Time from submission to the job's first task: the server's
                        # queue-time metric reads it from the future.
                        job.future.queue_seconds = start - job.submitted
                error: BaseException | None = None
                try:
                    self._execute(task)
                except BaseException as exc:  # the task's job fails with it
                    error = exc
                deliveries: list[Delivery] = []
                with self._lock:
                    end = self._clock()
                    if error is None:
                        self._dispatcher.complete(task, end)
                    else:
                        self._dispatcher.fail(task, error, end)
                    self._busy[index] += end - start
                    if self.trace:
                        self._records.append(TaskRecord.of(task, index, start, end, admission))
                    run = self._jobs.get(task.job)
                    state = self._dispatcher.jobs.get(task.job)
                    if run is not None and state is not None and state.resolved:
                        deliveries.append(self._resolve_locked(run, state))
                    self._prune_locked(task.job)
                _deliver(deliveries)
        except BaseException as exc:  # a bug in the scheduling core: fail every job, loudly
            self._crash(exc)

    def _execute(self, task: Any) -> None:
        """Run one task on the calling worker thread (outside the lock)."""
        if task.kind is TaskKind.INIT:
            self._init_network(task)
            return
        with self._lock:
            net = self._nets.get(task.network)
            cached = self._cache.take(task.id) if self._cache is not None and task.kind is TaskKind.LOAD else None
        if net is None:
            if cached is not None:
                cached.free()
            raise Abandoned(f"network {task.network} is gone (its job ended)")
        if task.kind is TaskKind.LOAD:
            nbytes = net.load(task.layer, cached)
            with self._lock:
                if cached is None:
                    self._bytes_read += nbytes
                self._peak_buffers = max(self._peak_buffers, self._buffer_bytes_locked())
        elif task.kind is TaskKind.EXEC:
            net.execute(task.layer)
        elif not self._cache_unit(task, net):
            net.unload(task.layer)

    def _init_network(self, task: Any) -> None:
        with self._lock:
            run = self._jobs.get(task.job)
            if run is None or run.resolved:
                raise Abandoned(f"job {task.job} ended before network {task.network} started")
            model = run.models[task.network]
            pool = run.pools[task.network]
            args, keywords = run.inputs.pop(task.network)
        engine = pool.checkout()
        net = NetworkRun(task.network, task.job, model, engine, args, self._lock, self._network_exited, keywords)
        with self._lock:
            if run.resolved:
                pool.checkin(engine)
                raise Abandoned(f"job {task.job} ended while network {task.network} started")
            try:
                net.start()
            except RuntimeError as exc:  # no thread to be had: the job fails, the engine goes back
                pool.checkin(engine)
                raise LayerfitError(
                    f"cannot start the forward thread of network {task.network}: {exc}"
                ) from exc
            self._nets[net.uid] = net
            self._net_pools[net.uid] = pool
            run.networks.append(net)
            self._forward_threads = [t for t in self._forward_threads if t.is_alive()]
            self._forward_threads.append(net.thread)

    def _network_exited(self, net: NetworkRun) -> None:
        """Called by a forward thread as it leaves: return the engine, fail the job on error."""
        deliveries: list[Delivery] = []
        with self._lock:
            net.exited = True
            pool = self._net_pools.pop(net.uid, None)
            run = self._jobs.get(net.job_id)
            if run is not None and net.error is not None and not isinstance(net.error, Abandoned):
                run.outcome = "failed"
                state = self._dispatcher.cancel(
                    run.id, net.error, self._clock(), status=JobStatus.FAILED
                )
                deliveries.append(self._resolve_locked(run, state))
            self._retire_network_locked(net)
        if pool is not None:
            pool.checkin(net.engine)
        _deliver(deliveries)
        if self.freed_memory == "after-pass":
            trim_heap()  # what the pass freed leaves the process (on this thread, after delivery)

    def _cached_model(self, task: Any) -> EnginePool | None:
        """What the weight cache keys ``task``'s unit by: its model's engine pool, while
        that is the model's current one (lock held)."""
        run = self._jobs.get(task.job)
        pool = None if run is None else run.pools.get(task.network)
        if pool is None or self.models[run.models[task.network]].pool is not pool:
            return None
        return pool

    def _cache_unit(self, task: Any, net: NetworkRun) -> bool:
        """Hand an unload task's unit to the weight cache, with the ledger reservation its
        load retained; ``False`` (nothing done) when there is no cache or no such unit."""
        if self._cache is None:
            return False
        with self._lock:
            pool = self._cached_model(task)
            unit = net.take_unit(task.layer) if pool is not None else None
            if unit is None:
                return False
            if not self._cache.put(pool, task.layer, unit, task.releases[0]):
                unit.free()
            return True

    def _buffer_bytes_locked(self) -> int:
        cached = 0 if self._cache is None else self._cache.nbytes
        return cached + sum(net.held_bytes for net in self._nets.values())

    # --- timeouts ---------------------------------------------------------------------

    def _timer_loop(self) -> None:
        try:
            while True:
                with self._lock:
                    while True:
                        if self._closing and not self._jobs:
                            self._thread_exits_locked()
                            return
                        now = self._clock()
                        due = []
                        while self._expiries and self._expiries[0][0] <= now:
                            _, _, job_id = heapq.heappop(self._expiries)
                            if job_id in self._jobs:
                                due.append(self._jobs[job_id])
                        if due:
                            break
                        while self._expiries and self._expiries[0][2] not in self._jobs:
                            heapq.heappop(self._expiries)
                        wait = self._expiries[0][0] - now if self._expiries else None
                        self._timer_cond.wait(None if wait is None else min(wait, threading.TIMEOUT_MAX))
                    deliveries = [
                        self._cancel_locked(
                            run, ScheduleError(f"job {run.id} timed out"), "timed_out"
                        )
                        for run in due
                    ]
                _deliver(deliveries)
        except BaseException as exc:
            self._crash(exc)

    def _crash(self, exc: BaseException) -> None:
        """An internal error stopped a runtime thread: fail every job instead of hanging."""
        error = ScheduleError(f"the runtime stopped after an internal error: {type(exc).__name__}: {exc}")
        error.__cause__ = exc
        deliveries = []
        with self._lock:
            self._crashed = error
            self._closing = True
            for run in list(self._jobs.values()):
                deliveries.append(self._cancel_locked(run, error, "failed"))
            self._work.notify_all()
            self._timer_cond.notify_all()
        _deliver(deliveries)

    # --- observing --------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The ledger, the tasks started by kind, the progress rule, the queue, the jobs, the
        unit buffers (the weight cache's included) and the bytes read, and the weight cache
        (``None`` without one)."""
        with self._lock:
            return {
                "policy": self.policy,
                "gated": self._policy.gated,
                "workers": self.workers,
                "budget_bytes": self._ledger.budget,
                "in_use_bytes": self._ledger.used,
                "peak_bytes": self._ledger.peak,
                "free_bytes": self._ledger.free,
                "progress_rule_fired": self._ledger.progress_count,
                "overcommits": self._ledger.overcommit_count,
                "tasks_started": {kind.name.lower(): n for kind, n in self._started.items()},
                "tasks_running": len(self._dispatcher.running),
                "tasks_ready": len(self._policy),
                "queue_length": len(self._jobs),
                "queue_limit": self.queue_limit,
                "jobs": dict(self._outcomes),
                "networks_in_flight": len(self._nets),
                "unit_buffer_bytes": self._buffer_bytes_locked(),
                "weight_cache": None if self._cache is None else self._cache.stats(),
                "unit_buffer_peak_bytes": self._peak_buffers,
                "unit_bytes_read": self._bytes_read,
                "estimates": self.estimates,
                "estimate_factor": self._dispatcher.estimate_factor,
                "returns_freed_memory": self.freed_memory != "never",
                "freed_memory": self.freed_memory,
                "compute_threads": torch.get_num_threads(),
            }

    def release_cached_weights(self) -> int:
        """Free every unit the weight cache holds now (the application needs the memory for
        a while); returns the bytes freed. Later jobs read their units again and cache them
        anew. Without ``cache_weights``, nothing to free: 0."""
        with self._lock:
            return 0 if self._cache is None else self._cache.evict_all()

    def clear_trace(self) -> None:
        """Forget the tasks, jobs, ledger history and counters recorded so far (after a
        warm-up), keeping what is reserved now."""
        with self._lock:
            self._records.clear()
            self._results.clear()
            self._busy = [0.0] * self.workers
            self._started = dict.fromkeys(TaskKind, 0)
            self._outcomes = dict.fromkeys(self._outcomes, 0)
            self._peak_buffers = self._buffer_bytes_locked()
            self._bytes_read = 0
            if self._cache is not None:
                self._cache.reset_counters()
            self._ledger.reset_history()

    def check_ledger(self) -> None:
        """Raise if the ledger ever exceeded the budget outside the progress rule (needs ``trace``)."""
        if not self.trace:
            raise ScheduleError("check_ledger() needs a Runtime created with trace=True")
        with self._lock:
            self._ledger.check()

    def run_report(self, workload: str = "") -> RunReport:
        """What the run so far looks like in the simulator's terms (needs ``trace=True``)."""
        if not self.trace:
            raise ScheduleError("run_report() needs a Runtime created with trace=True")
        with self._lock:
            history = list(self._ledger.history)
            return RunReport(
                policy=self.policy,
                workers=self.workers,
                budget=self._ledger.budget,
                physical_memory=self._ledger.budget,
                executor="real",
                jobs=sorted(self._results, key=lambda j: (j.arrival, j.id)),
                tasks=list(self._records),
                memory=[(s.time, s.used) for s in history],
                busy_time=list(self._busy),
                progress_count=self._ledger.progress_count,
                overcommit_count=self._ledger.overcommit_count,
                peak_memory=self._ledger.peak,
                peak_resident=self._peak_buffers,
                estimate_factor=self._dispatcher.estimate_factor,
                workload=workload,
                ledger_history=history,
            )

    # --- shutting down ----------------------------------------------------------------

    def shutdown(self, wait: bool = True, cancel_pending: bool = False) -> None:
        """Take no new jobs; finish (or, with ``cancel_pending``, cancel) the ones queued.

        With ``wait`` this returns when every future is resolved and every thread of the
        runtime has ended; without it, the threads end by themselves once the last job
        is resolved, and the last one closes the models' engines. Called on one of the
        runtime's own threads (a future's callback), it does not wait: that thread may
        be the one the remaining jobs need.
        """
        with self._lock:
            self._closing = True
            futures = [run.future for run in self._jobs.values()]
            self._work.notify_all()
            self._timer_cond.notify_all()
        if cancel_pending:
            for future in futures:
                future.cancel()
        me = threading.current_thread()
        with self._lock:
            own = me in self._threads or me in self._forward_threads
        if not wait or own:
            return
        with self._lock:
            self._work.wait_for(lambda: not self._jobs)
            forward = list(self._forward_threads)
        for thread in [*self._threads, *forward]:
            thread.join()
        with self._lock:
            self._close_pools_locked()

    def _thread_exits_locked(self) -> None:
        """A worker or the timer leaves for good; the last one closes the engines."""
        self._threads_running -= 1
        if self._threads_running == 0:
            self._close_pools_locked()

    def _close_pools_locked(self) -> None:
        """Close every model's engines (the runtime is shut down and no job is left)."""
        pools = [info.pool for info in self.models.values() if info.pool is not None]
        pools += self._retiring
        self._retiring = []
        if self._cache is not None:
            self._cache.clear()
        for info in self.models.values():
            info.pool = None
            if info.loaded:
                info.loaded, info.reason = False, "the runtime is shut down"
        for pool in pools:  # engines still checked out close as their forward threads return them
            pool.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown(wait=True, cancel_pending=exc[0] is not None)


def _forward_call(spec: InferenceJob, name: str, manifest: Manifest) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of model ``name``'s forward pass, ``(args, kwargs)``, checked against
    its manifest: a tensor (or a tuple of positional arguments), or for a model prepared
    from keyword arguments a mapping of each of them."""
    value = spec.input
    keywords = manifest.input_keywords
    if isinstance(value, Mapping):
        if name in value:
            value = value[name]
        elif not (keywords and set(value) & {k for k, _, _ in keywords}):  # no mapping of this model's keywords
            takes = f"; it takes keyword arguments {_describe(keywords)}" if keywords else ""
            raise InputError(
                f"the job gives no input for model {name!r} (inputs for: {', '.join(map(str, value))}){takes}"
            )
    if keywords:
        return (), _keyword_call(value, name, keywords)
    args = tuple(value) if isinstance(value, Sequence) and not isinstance(value, str) else (value,)
    if not args or not isinstance(args[0], torch.Tensor):
        raise InputError(f"model {name!r} takes a tensor input, got {type(args[0] if args else None).__name__}")
    _check_tensor(args[0], name, "input", tuple(manifest.input_shape), manifest.input_dtype)
    return args, {}


def _keyword_call(value: Any, name: str, keywords: Sequence[tuple[str, tuple[int, ...], str]]) -> dict[str, Any]:
    """The keyword arguments of a model prepared from them: every one, each a tensor as prepared."""
    if not isinstance(value, Mapping):
        raise InputError(
            f"model {name!r} takes keyword arguments {_describe(keywords)}: give a mapping of them, not a "
            f"{type(value).__name__}"
        )
    names = [k for k, _, _ in keywords]
    if set(value) != set(names):
        sent = ", ".join(map(str, value)) or "none"
        raise InputError(f"model {name!r} takes keyword arguments {_describe(keywords)}; the job gives {sent}")
    for k, shape, dtype in keywords:
        if not isinstance(value[k], torch.Tensor):
            raise InputError(f"model {name!r}'s {k} must be a tensor, got {type(value[k]).__name__}")
        _check_tensor(value[k], name, k, tuple(shape), dtype)
    return {k: value[k] for k in names}


def _describe(keywords: Sequence[tuple[str, tuple[int, ...], str]]) -> str:
    return ", ".join(f"{k} (N, {', '.join(map(str, shape[1:]))}) {dtype}" for k, shape, dtype in keywords)


def _check_tensor(x: torch.Tensor, name: str, what: str, expected: tuple[int, ...], dtype: str) -> None:
    """Refuse a tensor of another dtype, or another shape than the prepared one's but for
    its batch size (the memory estimates hold for that shape)."""
    if x.dim() != len(expected) or tuple(x.shape[1:]) != expected[1:] or x.dtype != DTYPES.get(dtype):
        raise InputError(
            f"model {name!r} expects {what} of shape (N, {', '.join(map(str, expected[1:]))}) and dtype "
            f"{dtype}, got shape {tuple(x.shape)} and dtype {str(x.dtype).removeprefix('torch.')}"
        )


def _deliver(deliveries: Sequence[Delivery]) -> None:
    """Resolve futures outside the runtime's lock (their callbacks may call back in)."""
    for delivery in deliveries:
        if delivery is None:
            continue
        future, ok, value = delivery
        with contextlib.suppress(InvalidStateError):  # cancelled by its caller meanwhile
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)


__all__ = ["InferenceJob", "Job", "Runtime"]
