"""What the rooms of the runtime share: one lock and what it guards.

The :class:`~layerfit.schedule.runtime.executor.Runtime` is split into a model repository
(:class:`~layerfit.schedule.runtime.repository.ModelRepository`), a job front end
(:class:`~layerfit.schedule.runtime.frontend.JobFrontEnd`) and a worker pool
(:class:`~layerfit.schedule.runtime.workers.WorkerPool`). A job's memory, its tasks, its
model's engines and its future change together, so the rooms keep the one lock the
runtime always had: :class:`RuntimeCore` holds it, the conditions on it, the clock, the
memory ledger, the dispatcher and policy, the weight cache, the unresolved jobs and
whether the runtime is closing. Every thread waits on a condition of this lock; none polls.

Futures are resolved outside the lock (:func:`deliver`): their callbacks may call back in.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import TYPE_CHECKING, Any

from layerfit.errors import ScheduleError
from layerfit.schedule.dispatch import Dispatcher
from layerfit.schedule.ledger import MemoryLedger
from layerfit.schedule.policies import make_policy
from layerfit.schedule.runtime.weight_cache import WeightCache

if TYPE_CHECKING:
    from layerfit.schedule.runtime.config import RuntimeConfig
    from layerfit.schedule.runtime.frontend import JobRun
    from layerfit.schedule.runtime.repository import EnginePool
    from layerfit.schedule.tasks import Task

Delivery = tuple[Future, bool, Any] | None  # (future, is result, value)


class RuntimeCore:
    """The lock of a runtime and the state every room of it reads under that lock.

    ``current_pool(task)`` tells the weight cache what to key ``task``'s unit by (its
    model's engine pool while that is the model's current one); it needs both the jobs
    and the repository, so the runtime that owns both passes it in.
    """

    def __init__(
        self, config: RuntimeConfig, current_pool: Callable[[Task], EnginePool | None]
    ) -> None:
        self.lock = threading.RLock()
        self._t0 = time.monotonic()
        self.ledger = MemoryLedger(config.memory_budget, clock=self.clock, record=config.trace, lock=self.lock)
        self.work = self.ledger.condition  # notified by every ledger and dispatcher change
        self.timer = threading.Condition(self.lock)  # notified when a job's expiry may have changed
        self.policy = make_policy(config.policy, gated=config.gated)
        self.cache = WeightCache(self.ledger, current_pool) if config.cache_weights else None
        self.dispatcher = Dispatcher(
            self.policy,
            self.ledger,
            config.workers,
            estimate_factor=config.estimate_factor,
            reclaimer=self.cache,
        )
        self.jobs: dict[str, JobRun] = {}  # unresolved jobs, by id
        self.closing = False  # shutdown() was called: no new jobs or model loads
        self.crashed: BaseException | None = None  # the internal error that stopped it

    def clock(self) -> float:
        """Seconds since the runtime started (the ledger's, the dispatcher's and the trace's time)."""
        return time.monotonic() - self._t0

    def refuse_if_closing(self, what: str) -> None:
        """Raise if the runtime is shut down, saying ``what`` it no longer does (lock held)."""
        if self.closing:
            if self.crashed is not None:
                raise ScheduleError(f"the runtime is shut down: {self.crashed}") from self.crashed
            raise ScheduleError(f"the runtime is shut down: {what}")

    def notify_all(self) -> None:
        """Wake every worker and the timer: jobs, memory or the closing state changed (lock held)."""
        self.work.notify_all()
        self.timer.notify_all()


def deliver(deliveries: Sequence[Delivery]) -> None:
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


__all__ = ["Delivery", "RuntimeCore", "deliver"]
