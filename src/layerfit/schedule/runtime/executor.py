"""The real multi-request executor: prepared models, N workers, one memory budget.

``Runtime(repository, memory_budget, workers, policy)`` — or ``Runtime(config)`` with a
:class:`~layerfit.schedule.runtime.config.RuntimeConfig` — serves *jobs* — one input
analysed by a set of networks (thesis §7.1) — over the prepared models in the
sub-folders of ``repository`` (:mod:`layerfit.schedule.runtime.repository`)::

    with Runtime("models/", "512MB", workers=2, policy="masa-fair") as rt:
        future = rt.submit(Job(("agenet", "gendernet"), image))
        outputs = future.result()          # {"agenet": tensor, "gendernet": tensor}
        logits = rt.infer("agenet", image).result()

How a job runs. :meth:`Runtime.submit` turns the job into init/load/execute/unload
tasks under the policy's dependency scheme (:class:`~layerfit.schedule.Dispatcher`,
the same object the simulator drives); ``workers`` threads each take the task the
policy picks for them, with its memory reserved in the
:class:`~layerfit.schedule.MemoryLedger`, and run it (:mod:`layerfit.schedule.runtime.workers`).
With ``cache_weights`` an unload hands its unit to the
:class:`~layerfit.schedule.runtime.weight_cache.WeightCache`, so that a later job's load of the
same unit takes it instead of reading it (evicted whenever a task needs the memory).

Memory estimates per task come from the capture (default) or from the ``/proc/self/statm``
profiler (``estimates="profile"``, thesis §5.3), see :mod:`layerfit.schedule.runtime.profiler`.
The ledger never exceeds the budget except through the progress rule (when nothing
runs, the smallest ready task may run alone), counted in ``stats()["progress_rule_fired"]``.
A job whose largest task cannot fit the budget even alone is rejected
(:class:`~layerfit.errors.JobRejectedError` with the minimum budget).

The :class:`Runtime` is a facade over four rooms sharing one lock
(:class:`~layerfit.schedule.runtime.core.RuntimeCore`):

- the model repository (:class:`~layerfit.schedule.runtime.repository.ModelRepository`): which
  models are loaded, in which version, load/unload/reload, availability;
- the job front end (:class:`~layerfit.schedule.runtime.frontend.JobFrontEnd`): submit, futures,
  timeouts, input checks (:mod:`layerfit.schedule.runtime.inputs`);
- the worker pool (:class:`~layerfit.schedule.runtime.workers.WorkerPool`): the threads that execute;
- decoding (:class:`~layerfit.schedule.runtime.decoders.Decoders`): each language model's
  decode loop, its KV caches in the same ledger (:meth:`Runtime.decoder`, :meth:`Runtime.generate`).

Threads: ``workers`` worker threads, one timer thread (timeouts), one forward thread
per network in flight. All of them wait on conditions sharing one lock; none polls.
Futures stay cancellable until they resolve: :meth:`Future.cancel`, a timeout or
``shutdown(cancel_pending=True)`` drops the job's queued tasks, abandons its forward
threads and returns its reserved memory to the ledger at once (running tasks return
theirs when they finish).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from layerfit.engine.osmem import (
    AFTER_PASS_TRIM_THRESHOLD,
    HEAP_TRIM_THRESHOLD,
    limit_heap_arenas,
    return_large_frees_to_os,
)
from layerfit.errors import LayerfitError, ScheduleError
from layerfit.memory_limit import Footprint, process_memory
from layerfit.schedule.ledger import MemoryLedger
from layerfit.schedule.profile import NetworkProfile, ProfileSet
from layerfit.schedule.report import RunReport
from layerfit.schedule.runtime.config import (  # noqa: F401 - also importable from here, as before
    AUTO_UNITS,
    ESTIMATES,
    FREED_MEMORY,
    RuntimeConfig,
    check_runtime_units,
    freed_memory_mode,
)
from layerfit.schedule.runtime.core import RuntimeCore, deliver
from layerfit.schedule.runtime.decoders import Decoders, LanguageModel, generate_tokens
from layerfit.schedule.runtime.frontend import InferenceJob, Job, JobFrontEnd
from layerfit.schedule.runtime.repository import ModelInfo, ModelRepository
from layerfit.schedule.runtime.workers import WorkerPool
from layerfit.store.trust import trust_factories

if TYPE_CHECKING:  # annotations only: the rooms own these (patch them where they live)
    from layerfit.schedule.decoding.batching import DecodeEngine
    from layerfit.schedule.decoding.lookup import PromptLookup
    from layerfit.schedule.decoding.sampling import Sampling
    from layerfit.schedule.runtime.network_run import NetworkRun
    from layerfit.schedule.runtime.repository import EnginePool
    from layerfit.schedule.tasks import Task


class Runtime:
    """Serve jobs over a repository of prepared models within one memory budget.

    Give a :class:`~layerfit.schedule.runtime.config.RuntimeConfig`, or its fields as
    arguments — ``Runtime(repository, memory_budget, workers=2, policy="masa-fair",
    queue_limit=..., units=..., ...)`` builds one, so its defaults are the config's
    (see it for every setting). ``profiles`` are precomputed profiles by model name, used
    instead of measuring or estimating them: data for this runtime, not a setting.
    ``config`` is the config it runs with; ``repository``, ``workers``, ``policy`` (its
    name), ``queue_limit``, ``estimates``, ``trace``, ``units``, ``freed_memory`` (the mode
    in effect) and ``models`` (:class:`~layerfit.schedule.runtime.repository.ModelInfo` by name)
    are read as before.

    Call :meth:`shutdown` (or use it as a context manager): its threads wait for work
    until then.
    """

    def __init__(
        self,
        config: RuntimeConfig | str | Path | None = None,
        /,
        *args: Any,
        profiles: Mapping[str, NetworkProfile] | None = None,
        **settings: Any,
    ) -> None:
        if config is None:  # every setting by keyword, ``repository=`` too
            config = RuntimeConfig(*args, **settings)
        elif not isinstance(config, RuntimeConfig):
            config = RuntimeConfig(config, *args, **settings)
        elif args or settings:
            raise TypeError("give a RuntimeConfig or the runtime's settings, not both")
        trust = config.trust_factory
        # modules whose factories the repository's folders may run (layerfit.store.trust)
        trust_factories([trust] if isinstance(trust, str) else trust)
        config.validate()
        self.config = config
        self.repository = Path(config.repository)
        self.workers = config.workers
        self.queue_limit = config.queue_limit
        self.estimates = config.estimates
        self.trace = config.trace
        self.units = config.units
        self._core = core = RuntimeCore(config, self._cached_pool)
        self.policy = core.policy.name
        self._repo = ModelRepository(core, config, profiles)
        self.models: dict[str, ModelInfo] = self._repo.models
        self.footprint: Footprint | None = None  # measured where a memory limit bounds the process (memory_fit)
        self._decoders = Decoders(self.models, core.ledger, self._decode_engine, max_waiting=config.queue_limit)
        # every setting and the repository are valid; before any model loads, since only
        # later allocations follow the fixed thresholds
        self.freed_memory = _set_freed_memory(freed_memory_mode(config.return_freed_memory))
        self._front = JobFrontEnd(
            core,
            self._repo,
            config,
            retire_network=self._retire_network_locked,
            on_exit=self._thread_exits_locked,
            on_crash=self._crash,
        )
        self._worker_pool = WorkerPool(
            core,
            self._front,
            config,
            freed_memory=self.freed_memory,
            current_pool=self._cached_pool,
            on_exit=self._thread_exits_locked,
            on_crash=self._crash,
        )
        self._threads_running = config.workers + 1  # workers and timer; the last out closes the pools
        if config.load:
            for name in list(self.models):
                with contextlib.suppress(LayerfitError):  # recorded as UNAVAILABLE with the reason
                    self.load_model(name)
        self._threads = [
            *self._worker_pool.make_threads(),
            threading.Thread(target=self._front.run_timer, name="layerfit-timer", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _cached_pool(self, task: Task) -> EnginePool | None:
        """What the weight cache keys ``task``'s unit by: its model's engine pool, while
        that is the model's current one (lock held)."""
        run = self._core.jobs.get(task.job)
        return None if run is None else self._repo.current_pool(run, task.network)

    def _retire_network_locked(self, net: NetworkRun) -> None:
        """The front end resolved ``net``'s job: the worker pool forgets it once it has left."""
        self._worker_pool.retire_network_locked(net)

    # --- the repository ---------------------------------------------------------------

    def index(self) -> list[dict[str, str]]:
        """Every model folder of the repository: ``name``, ``state`` (READY/UNAVAILABLE), ``reason``.

        Folders added since the runtime started are listed too (UNAVAILABLE until loaded).
        """
        return self._repo.index()

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
        info = self._repo.load_model(name, within_budget=within_budget)
        self._decoders.retire(name, info.manifest)  # a loop of the version replaced ends
        return info

    def mark_unavailable(self, name: str, reason: str) -> None:
        """Take model ``name`` out of service (UNAVAILABLE, ``reason``) until it is loaded
        again, as when its weights fail verification: new jobs naming it are refused,
        jobs already accepted end, and its engines close when the last of them ends."""
        self._repo.mark_unavailable(name, reason)
        self._decoders.retire(name)

    def unload_model(self, name: str) -> None:
        """Stop serving model ``name``: new jobs naming it are refused; jobs already accepted
        (running or queued) finish, and its engines close when the last of them ends."""
        self._repo.unload_model(name)
        self._decoders.retire(name)

    def required_budget(self, name: str) -> int:
        """The least memory budget under which jobs of model ``name`` are not rejected:
        its largest task as the scheduler is told it (profile × ``estimate_factor``)."""
        return self._repo.required_budget(name)

    def profile_set(self, *, ready_only: bool = True) -> ProfileSet:
        """The scheduler's profiles of the loaded models (for workloads and the simulator);
        with ``ready_only=False`` also of models unloaded since (e.g. after shutdown)."""
        return self._repo.profile_set(ready_only=ready_only)

    def example_input(self, name: str, seed: int | None = None) -> torch.Tensor | dict[str, torch.Tensor]:
        """A deterministic input of the shape and dtype model ``name`` was prepared for, as
        :meth:`infer` takes it: a tensor, or for a model prepared from keyword arguments
        a dict of them."""
        return self._repo.example_input(name, seed)

    # --- submitting -------------------------------------------------------------------

    def submit(self, job: InferenceJob) -> Future:
        """Queue ``job``; the future resolves to ``{model name: output}``.

        Raises at once for bad requests (unknown or unloaded model, wrong input, full
        queue, shut down); a job too large for the budget resolves with
        :class:`~layerfit.errors.JobRejectedError`, one whose task raised with that error.
        """
        return self._front.submit(job, unwrap=None)

    def infer(self, model: str, x: Any, *, timeout: float | None = None) -> Future:
        """One network on one input; the future resolves to that model's output."""
        return self._front.submit(InferenceJob((model,), x, timeout=timeout), unwrap=model)

    # --- decoding (schedule/runtime/decoders.py) --------------------------------------

    def configure_decoding(self, *, max_waiting: int | None = None, kept_share: float | None = None,
                           prompt_lookup: PromptLookup | None = None, drafts: Mapping[str, str] | None = None,
                           draft_tokens: int | None = None) -> None:
        """The decode loops opened from now on: at most ``max_waiting`` sequences of a model
        waiting for memory (default: the queue limit), ``kept_share`` of the budget for the
        weights a loop's engine keeps while it decodes (default 0: every unit streamed),
        ``prompt_lookup`` the tokens each model's greedy sequences propose per step
        (default none), ``drafts`` each model's draft model (another of the repository,
        resident, proposing ``draft_tokens`` per step)."""
        self._decoders.configure(max_waiting=max_waiting, kept_share=kept_share, prompt_lookup=prompt_lookup,
                                 drafts=drafts, draft_tokens=draft_tokens)

    def cannot_generate(self, name: str) -> str | None:
        """Why model ``name`` cannot generate text (one line), or None when it can
        (:func:`~layerfit.schedule.decoding.rules.refusal`)."""
        return self._decoders.cannot_generate(name)

    def decoder(self, name: str) -> LanguageModel:
        """The decode loop, tokenizer and prompt checks of READY language model ``name``,
        opened on first use; it decodes every sequence of the model in flight together,
        its KV caches held in :attr:`ledger`, and retires with its model's version."""
        return self._decoders.decoder(name)

    def open_decoder(self, name: str) -> LanguageModel | None:
        """:meth:`decoder` if it is open for the version of ``name`` READY now, else None
        (never blocks: a request's fast path)."""
        return self._decoders.current(name)

    def generate(self, name: str, prompt: list[int] | tuple[int, ...] | str, max_tokens: int = 16,
                 sampling: Sampling | None = None, *, timeout: float | None = None,
                 prompt_lookup: int | None = None, draft: bool | None = None) -> list[int]:
        """The new token ids of ``prompt`` (token ids, or text for the model's tokenizer),
        at most ``max_tokens``, greedy unless ``sampling`` says otherwise; decoded beside
        every other sequence of the model, proposing up to ``prompt_lookup`` tokens a step
        when greedy, or the model's draft's (``draft``; None: the model's settings; the
        tokens are the same); blocks; the end token is not included)."""
        from layerfit.schedule.decoding.sampling import Sampling

        model = self.decoder(name)
        ids = model.encode(prompt) if isinstance(prompt, str) else prompt
        return generate_tokens(model, ids, max_tokens, sampling or Sampling(), timeout, prompt_lookup, draft)[0]

    def decoding_stats(self, name: str) -> dict[str, int]:
        """Model ``name``'s decode loop: steps, tokens, sequences in flight and waiting,
        bytes held (all 0 before its first request)."""
        return self._decoders.stats(name)

    def stop_decoding(self) -> None:
        """Close every decode loop now: sequences in flight end cancelled, their memory
        returns; loops open again on the next request (until :meth:`shutdown`)."""
        self._decoders.close()

    def _decode_engine(self, directory: Path) -> DecodeEngine:
        """A decode loop's own engine: the whole model, streamed (``async``)."""
        from layerfit.engine.engine import Engine

        config = self.config
        return Engine(directory, pipeline="async", direct_io=config.direct_io, verify=config.verify,
                      dequantize=config.dequantize)

    # --- memory held outside tasks ----------------------------------------------------

    @property
    def ledger(self) -> MemoryLedger:
        """The memory ledger every task reserves in under the runtime's lock; rooms beside
        the task graph (the decode loops of :mod:`layerfit.schedule.decoding.batching`) hold their
        weight buffers and KV caches in it too, and wait on its condition."""
        return self._core.ledger

    # --- observing --------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The ledger, the tasks started by kind, the progress rule, the queue, the jobs, the
        unit buffers (the weight cache's included) and the bytes read, and the weight cache
        (``None`` without one)."""
        core, pool = self._core, self._worker_pool
        ledger, cache = core.ledger, core.cache
        decoding = self._decoders.all_stats()
        with core.lock:
            return {
                "decoding": decoding,
                "policy": self.policy,
                "gated": core.policy.gated,
                "workers": self.workers,
                "budget_bytes": ledger.budget,
                "in_use_bytes": ledger.used,
                "peak_bytes": ledger.peak,
                "free_bytes": ledger.free,
                "progress_rule_fired": ledger.progress_count,
                "overcommits": ledger.overcommit_count,
                "tasks_started": {kind.name.lower(): n for kind, n in pool.started.items()},
                "tasks_running": len(core.dispatcher.running),
                "tasks_ready": len(core.policy),
                "queue_length": len(core.jobs),
                "queue_limit": self.queue_limit,
                "jobs": dict(self._front.outcomes),
                "networks_in_flight": len(pool.nets),
                "unit_buffer_bytes": pool.buffer_bytes_locked(),
                "weight_cache": None if cache is None else cache.stats(),
                "unit_buffer_peak_bytes": pool.peak_buffers,
                "unit_bytes_read": pool.bytes_read,
                "estimates": self.estimates,
                "estimate_factor": core.dispatcher.estimate_factor,
                "returns_freed_memory": self.freed_memory != "never",
                "freed_memory": self.freed_memory,
                "compute_threads": torch.get_num_threads(),
                "process_memory": asdict(process_memory()),
                "memory_limit": None if self.footprint is None else self.footprint.to_dict(),
            }

    def release_cached_weights(self) -> int:
        """Free every unit the weight cache holds now (the application needs the memory for
        a while); returns the bytes freed. Later jobs read their units again and cache them
        anew. Without ``cache_weights``, nothing to free: 0."""
        with self._core.lock:
            return 0 if self._core.cache is None else self._core.cache.evict_all()

    def clear_trace(self) -> None:
        """Forget the tasks, jobs, ledger history and counters recorded so far (after a
        warm-up), keeping what is reserved now."""
        core = self._core
        with core.lock:
            self._worker_pool.reset_counters()
            self._front.clear_trace()
            if core.cache is not None:
                core.cache.reset_counters()
            core.ledger.reset_history()

    def check_ledger(self) -> None:
        """Raise if the ledger ever exceeded the budget outside the progress rule (needs ``trace``)."""
        if not self.trace:
            raise ScheduleError("check_ledger() needs a Runtime created with trace=True")
        with self._core.lock:
            self._core.ledger.check()

    def run_report(self, workload: str = "") -> RunReport:
        """What the run so far looks like in the simulator's terms (needs ``trace=True``)."""
        if not self.trace:
            raise ScheduleError("run_report() needs a Runtime created with trace=True")
        core, pool = self._core, self._worker_pool
        ledger = core.ledger
        with core.lock:
            history = list(ledger.history)
            return RunReport(
                policy=self.policy,
                workers=self.workers,
                budget=ledger.budget,
                physical_memory=ledger.budget,
                executor="real",
                jobs=sorted(self._front.results, key=lambda j: (j.arrival, j.id)),
                tasks=list(pool.records),
                memory=[(s.time, s.used) for s in history],
                busy_time=list(pool.busy),
                progress_count=ledger.progress_count,
                overcommit_count=ledger.overcommit_count,
                peak_memory=ledger.peak,
                peak_resident=pool.peak_buffers,
                estimate_factor=core.dispatcher.estimate_factor,
                workload=workload,
                ledger_history=history,
            )

    # --- shutting down ----------------------------------------------------------------

    def _crash(self, exc: BaseException) -> None:
        """An internal error stopped a runtime thread: fail every job instead of hanging."""
        error = ScheduleError(f"the runtime stopped after an internal error: {type(exc).__name__}: {exc}")
        error.__cause__ = exc
        core = self._core
        with core.lock:
            core.crashed = error
            core.closing = True
            deliveries = self._front.fail_all_locked(error)
            core.notify_all()
        deliver(deliveries)

    def shutdown(self, wait: bool = True, cancel_pending: bool = False) -> None:
        """Take no new jobs; finish (or, with ``cancel_pending``, cancel) the ones queued.

        With ``wait`` this returns when every future is resolved and every thread of the
        runtime has ended; without it, the threads end by themselves once the last job
        is resolved, and the last one closes the models' engines. Called on one of the
        runtime's own threads (a future's callback), it does not wait: that thread may
        be the one the remaining jobs need.
        """
        core = self._core
        with core.lock:
            core.closing = True
            futures = self._front.futures()
            core.notify_all()
        if cancel_pending:
            for future in futures:
                future.cancel()
            self._decoders.close(final=True)
        me = threading.current_thread()
        with core.lock:
            own = me in self._threads or self._worker_pool.runs_on(me)
        if not wait or own:
            return
        with core.lock:
            core.work.wait_for(lambda: not core.jobs)
            forward = list(self._worker_pool.forward_threads)
        for thread in [*self._threads, *forward]:
            thread.join()
        self._decoders.close(final=True)  # sequences still decoding end cancelled
        with core.lock:
            self._repo.close_all_locked()

    def _thread_exits_locked(self) -> None:
        """A worker or the timer leaves for good; the last one closes the engines."""
        self._threads_running -= 1
        if self._threads_running == 0:
            self._repo.close_all_locked()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown(wait=True, cancel_pending=exc[0] is not None)


def _set_freed_memory(mode: str) -> str:
    """Set when the scratch that executions free leaves the process (glibc; the whole
    process's allocator thresholds and heaps); the mode in effect: ``mode``, or
    ``"never"`` when asked or where the C library is not glibc."""
    if mode != "never" and return_large_frees_to_os(
        trim_threshold_bytes=HEAP_TRIM_THRESHOLD if mode == "eagerly" else AFTER_PASS_TRIM_THRESHOLD
    ):
        limit_heap_arenas(max(os.cpu_count() or 1, 2))  # forward threads share few heaps
        return mode
    return "never"  # asked for, or not glibc


__all__ = ["InferenceJob", "Job", "Runtime", "RuntimeConfig"]
