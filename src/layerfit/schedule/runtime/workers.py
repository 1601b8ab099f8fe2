"""The runtime's worker pool: the threads that execute tasks.

``workers`` threads each take the task the policy picks for them, with its memory
reserved in the ledger (:meth:`~layerfit.schedule.dispatch.Dispatcher.assign`), and run it:

- **init** checks an engine of the model out of its pool (a meta-device skeleton; no
  weights) and starts the network's forward thread, which runs the model's own
  ``forward`` through :meth:`layerfit.engine.Engine.run_from` with a
  :class:`~layerfit.schedule.runtime.network_run.NetworkRun` as its unit source;
- **load** reads one unit through the engine's reader into a buffer of exactly the
  unit's bytes — the bytes the ledger reserved for it — or takes it from the weight cache;
- **execute** lets the forward thread run that unit and holds the worker until it has,
  so at most ``workers`` tasks run at any moment;
- **unload** frees the buffer, or hands it to the weight cache.

The pool also counts what ran (tasks by kind, busy time per worker, bytes read, the
unit buffers' peak) and, with ``trace``, records every task (:meth:`TaskRecord.of
<layerfit.schedule.report.TaskRecord.of>`, as the simulator does).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from layerfit.engine.osmem import trim_heap
from layerfit.errors import LayerfitError
from layerfit.schedule.report import TaskRecord
from layerfit.schedule.runtime.core import Delivery, deliver
from layerfit.schedule.runtime.network_run import Abandoned, NetworkRun
from layerfit.schedule.tasks import TaskKind

if TYPE_CHECKING:
    from layerfit.schedule.runtime.config import RuntimeConfig
    from layerfit.schedule.runtime.core import RuntimeCore
    from layerfit.schedule.runtime.frontend import JobFrontEnd
    from layerfit.schedule.runtime.repository import EnginePool
    from layerfit.schedule.tasks import Task


class WorkerPool:
    """``workers`` threads executing the dispatcher's tasks, and the networks in flight.

    ``front`` settles a job when its task ends; ``current_pool(task)`` is the engine
    pool the weight cache keys ``task``'s unit by (``None``: not to be cached);
    ``freed_memory`` is the runtime's mode (``after-pass`` trims the C heap as each
    forward pass ends); ``on_exit`` and ``on_crash`` are the runtime's, called by a
    worker as it leaves for good or after an internal error.
    """

    def __init__(
        self,
        core: RuntimeCore,
        front: JobFrontEnd,
        config: RuntimeConfig,
        *,
        freed_memory: str,
        current_pool: Callable[[Task], EnginePool | None],
        on_exit: Callable[[], None],
        on_crash: Callable[[BaseException], None],
    ) -> None:
        self._core = core
        self._front = front
        self.count = config.workers
        self._trace = config.trace
        self._freed_memory = freed_memory
        self._current_pool = current_pool
        self._on_exit = on_exit
        self._on_crash = on_crash
        self.nets: dict[str, NetworkRun] = {}  # networks with a forward thread or buffers
        self._net_pools: dict[str, EnginePool] = {}
        self.threads: list[threading.Thread] = []
        self.forward_threads: list[threading.Thread] = []
        self.records: list[TaskRecord] = []
        self.reset_counters()

    def reset_counters(self) -> None:
        """Forget the tasks recorded and counted so far (lock held, or before any runs)."""
        self.records.clear()
        self.busy = [0.0] * self.count
        self.started = dict.fromkeys(TaskKind, 0)
        self.peak_buffers = self.buffer_bytes_locked()
        self.bytes_read = 0  # unit bytes load tasks read from storage

    def make_threads(self) -> list[threading.Thread]:
        """The worker threads, not started yet."""
        self.threads = [
            threading.Thread(target=self._worker_loop, args=(i,), name=f"layerfit-worker-{i}", daemon=True)
            for i in range(self.count)
        ]
        return self.threads

    def runs_on(self, thread: threading.Thread) -> bool:
        """Whether ``thread`` is one of the pool's workers or forward threads (lock held)."""
        return thread in self.threads or thread in self.forward_threads

    def buffer_bytes_locked(self) -> int:
        """The bytes of every unit buffer: the networks' and the weight cache's (lock held)."""
        cache = self._core.cache
        cached = 0 if cache is None else cache.nbytes
        return cached + sum(net.held_bytes for net in self.nets.values())

    def retire_network_locked(self, net: NetworkRun) -> None:
        """Forget a network once its job is over and its forward thread has left the model."""
        if net.exited and net.job_id not in self._core.jobs:
            net.free_all()
            self.nets.pop(net.uid, None)

    # --- the workers ---------------------------------------------------------------------

    def _worker_loop(self, index: int) -> None:
        core = self._core
        try:
            while True:
                with core.lock:
                    while True:
                        if core.closing and not core.jobs:
                            self._on_exit()
                            return
                        assignment = core.dispatcher.assign(index, core.clock())
                        if assignment is not None:
                            break
                        core.work.wait()
                    task, admission = assignment
                    self.started[task.kind] += 1
                    start = core.clock()
                    self._front.started_locked(task.job, start)
                error: BaseException | None = None
                try:
                    self._execute(task)
                except BaseException as exc:  # the task's job fails with it
                    error = exc
                deliveries: list[Delivery] = []
                with core.lock:
                    end = core.clock()
                    if error is None:
                        core.dispatcher.complete(task, end)
                    else:
                        core.dispatcher.fail(task, error, end)
                    self.busy[index] += end - start
                    if self._trace:
                        self.records.append(TaskRecord.of(task, index, start, end, admission))
                    deliveries.append(self._front.task_ended_locked(task.job))
                deliver(deliveries)
        except BaseException as exc:  # a bug in the scheduling core: fail every job, loudly
            self._on_crash(exc)

    def _execute(self, task: Any) -> None:
        """Run one task on the calling worker thread (outside the lock)."""
        if task.kind is TaskKind.INIT:
            self._init_network(task)
            return
        core = self._core
        with core.lock:
            net = self.nets.get(task.network)
            cached = core.cache.take(task.id) if core.cache is not None and task.kind is TaskKind.LOAD else None
        if net is None:
            if cached is not None:
                cached.free()
            raise Abandoned(f"network {task.network} is gone (its job ended)")
        if task.kind is TaskKind.LOAD:
            nbytes = net.load(task.layer, cached)
            with core.lock:
                if cached is None:
                    self.bytes_read += nbytes
                self.peak_buffers = max(self.peak_buffers, self.buffer_bytes_locked())
        elif task.kind is TaskKind.EXEC:
            net.execute(task.layer)
        elif not self._cache_unit(task, net):
            net.unload(task.layer)

    def _init_network(self, task: Any) -> None:
        core = self._core
        with core.lock:
            run = core.jobs.get(task.job)
            if run is None or run.resolved:
                raise Abandoned(f"job {task.job} ended before network {task.network} started")
            model = run.models[task.network]
            pool = run.pools[task.network]
            args, keywords = run.inputs.pop(task.network)
        engine = pool.checkout()
        net = NetworkRun(task.network, task.job, model, engine, args, core.lock, self._network_exited, keywords)
        with core.lock:
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
            self.nets[net.uid] = net
            self._net_pools[net.uid] = pool
            run.networks.append(net)
            self.forward_threads = [t for t in self.forward_threads if t.is_alive()]
            self.forward_threads.append(net.thread)

    def _network_exited(self, net: NetworkRun) -> None:
        """Called by a forward thread as it leaves: return the engine, fail the job on error."""
        deliveries: list[Delivery] = []
        with self._core.lock:
            net.exited = True
            pool = self._net_pools.pop(net.uid, None)
            if net.error is not None and not isinstance(net.error, Abandoned):
                deliveries.append(self._front.fail_locked(net.job_id, net.error))
            self.retire_network_locked(net)
        if pool is not None:
            pool.checkin(net.engine)
        deliver(deliveries)
        if self._freed_memory == "after-pass":
            trim_heap()  # what the pass freed leaves the process (on this thread, after delivery)

    def _cache_unit(self, task: Any, net: NetworkRun) -> bool:
        """Hand an unload task's unit to the weight cache, with the ledger reservation its
        load retained; ``False`` (nothing done) when there is no cache or no such unit."""
        cache = self._core.cache
        if cache is None:
            return False
        with self._core.lock:
            pool = self._current_pool(task)
            unit = net.take_unit(task.layer) if pool is not None else None
            if unit is None:
                return False
            if not cache.put(pool, task.layer, unit, task.releases[0]):
                unit.free()
            return True


__all__ = ["WorkerPool"]
