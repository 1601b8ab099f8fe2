"""The memory ledger: one budget, reservations against it, and the progress rule.

Every task reserves its memory when it starts (:meth:`MemoryLedger.acquire`). When it
finishes (:meth:`MemoryLedger.finish`) the part it *retains* stays reserved (a load's
weights, an init's structure) until a later task releases it
(:meth:`MemoryLedger.release`) or its owner — the job — is done
(:meth:`MemoryLedger.release_owner`).

**Progress rule.** A reservation is admitted when it fits (``used + bytes <= budget``;
zero bytes always fit). When it does not fit, it is admitted anyway if *no task is
running* — the smallest ready task may run alone so the system cannot stall while
retained memory fills the budget (MASA, thesis §6.3.3). Such admissions are counted in
:attr:`progress_count`. Because every other admission must fit, the bytes held by
reservations that were *not* admitted by the rule never exceed the budget; the ledger
is above budget only while a progress reservation is held. :meth:`check` verifies this
over the whole recorded history.

**Over-commit.** A policy that is told to ignore the budget (the thesis's unmanaged
baselines) reserves with ``allow_overcommit=True``; a reservation of such a policy that
does not fit is an over-commit even when nothing else runs (it did not wait for the
budget, so no progress rule was involved). Over-commits are counted separately and
excluded from the invariant in the same way.

Thread-safe: every method holds :attr:`condition`'s lock, and every change notifies it,
so worker threads wait on the condition instead of polling.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass
from typing import NamedTuple

from layerfit.backports import StrEnum
from layerfit.errors import ScheduleError
from layerfit.sizes import format_bytes


class Admission(StrEnum):
    """Why a reservation was admitted."""

    FIT = "fit"
    PROGRESS = "progress"
    OVERCOMMIT = "overcommit"


class MemorySample(NamedTuple):
    """The ledger after a change: bytes reserved, of those admitted by the progress rule
    or over-committed, and how many tasks were running."""

    time: float
    used: int
    progress_held: int
    overcommit_held: int
    running: int


@dataclass
class _Reservation:
    owner: Hashable
    nbytes: int
    admission: Admission


class MemoryLedger:
    """Reservations against a byte budget, with the progress rule and a recorded history."""

    def __init__(
        self,
        budget: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        record: bool = True,
        lock: threading.RLock | None = None,
    ) -> None:
        if budget <= 0:
            raise ScheduleError(f"a memory budget must be positive, got {budget} bytes")
        self.budget = int(budget)
        self.clock = clock
        self._record = record
        self.condition = threading.Condition(lock or threading.RLock())
        self._reservations: dict[Hashable, _Reservation] = {}
        self._held = {Admission.FIT: 0, Admission.PROGRESS: 0, Admission.OVERCOMMIT: 0}
        self.used = 0
        self.running = 0
        self.peak = 0
        self.progress_count = 0
        self.overcommit_count = 0
        self.history: list[MemorySample] = []
        self._sample()

    # --- queries --------------------------------------------------------------------

    @property
    def free(self) -> int:
        """Budget minus reserved bytes; negative while over budget."""
        return self.budget - self.used

    def fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` fits now (zero bytes always does)."""
        return nbytes == 0 or self.used + nbytes <= self.budget

    def classify(self, nbytes: int) -> Admission | None:
        """How a reservation of ``nbytes`` would be admitted now, or ``None`` if not at all."""
        with self.condition:
            if self.fits(nbytes):
                return Admission.FIT
            if self.running == 0:
                return Admission.PROGRESS
            return None

    def held(self, key: Hashable) -> int:
        with self.condition:
            reservation = self._reservations.get(key)
            return reservation.nbytes if reservation else 0

    # --- changes --------------------------------------------------------------------

    def acquire(
        self, key: Hashable, nbytes: int, *, owner: Hashable = None, allow_overcommit: bool = False
    ) -> Admission:
        """Reserve ``nbytes`` for a task that starts now; raise if it may not start.

        The task counts as running until :meth:`finish`.
        """
        if nbytes < 0:
            raise ScheduleError(f"cannot reserve a negative number of bytes ({nbytes})")
        with self.condition:
            if key in self._reservations:
                raise ScheduleError(f"{key!r} already holds memory in the ledger")
            admission = self.classify(nbytes)
            if allow_overcommit and admission is Admission.PROGRESS:
                admission = None
            if admission is None:
                if not allow_overcommit:
                    raise ScheduleError(
                        f"{key!r} needs {format_bytes(nbytes)} but only {format_bytes(self.free)} of "
                        f"{format_bytes(self.budget)} are free "
                        f"and {self.running} task(s) are running"
                    )
                admission = Admission.OVERCOMMIT
            if admission is Admission.PROGRESS:
                self.progress_count += 1
            elif admission is Admission.OVERCOMMIT:
                self.overcommit_count += 1
            self._reservations[key] = _Reservation(owner, nbytes, admission)
            self._held[admission] += nbytes
            self.used += nbytes
            self.running += 1
            self.peak = max(self.peak, self.used)
            self._changed()
            return admission

    def finish(self, key: Hashable, keep: int = 0) -> None:
        """The task ``key`` ended: keep ``keep`` of its bytes reserved, free the rest."""
        with self.condition:
            reservation = self._reservations.get(key)
            if reservation is None:
                raise ScheduleError(f"{key!r} holds no memory in the ledger")
            keep = min(max(keep, 0), reservation.nbytes)
            freed = reservation.nbytes - keep
            self._held[reservation.admission] -= freed
            self.used -= freed
            if keep:
                reservation.nbytes = keep
            else:
                del self._reservations[key]
            self.running -= 1
            self._changed()

    def release(self, key: Hashable) -> int:
        """Free what ``key`` still holds (no-op when it holds nothing); returns the bytes."""
        with self.condition:
            reservation = self._reservations.pop(key, None)
            if reservation is None:
                return 0
            self._held[reservation.admission] -= reservation.nbytes
            self.used -= reservation.nbytes
            self._changed()
            return reservation.nbytes

    def transfer(self, key: Hashable, new_key: Hashable, *, owner: Hashable = None) -> Admission | None:
        """Hand what ``key`` holds to ``new_key`` and ``owner``, bytes and admission
        unchanged; returns the admission, or ``None`` (changing nothing) when ``key`` holds
        nothing. For the retained bytes of a task that has finished (not a running one)."""
        with self.condition:
            reservation = self._reservations.get(key)
            if reservation is None:
                return None
            if new_key in self._reservations:
                raise ScheduleError(f"{new_key!r} already holds memory in the ledger")
            del self._reservations[key]
            reservation.owner = owner
            self._reservations[new_key] = reservation
            self._changed()
            return reservation.admission

    def release_owner(self, owner: Hashable, *, keep: Collection[Hashable] = ()) -> int:
        """Free every reservation of ``owner`` (a finished or failed network) except ``keep``
        (tasks still running, which return their memory when they finish)."""
        with self.condition:
            keys = [k for k, r in self._reservations.items() if r.owner == owner and k not in keep]
            return sum(self.release(k) for k in keys)

    def hold(self, key: Hashable, nbytes: int, *, owner: Hashable = None) -> bool:
        """Make ``key`` hold ``nbytes`` that no running task owns (a decode loop's KV
        caches and weight buffers), growing or shrinking what it holds; False, changing
        nothing, when the growth does not fit now. Never by the progress rule: memory
        held between tasks must fit, or it could keep the budget exceeded for good."""
        if nbytes < 0:
            raise ScheduleError(f"cannot hold a negative number of bytes ({nbytes})")
        with self.condition:
            reservation = self._reservations.get(key)
            before = 0 if reservation is None else reservation.nbytes
            if nbytes > before and not self.fits(nbytes - before):
                return False
            if reservation is None:
                reservation = self._reservations[key] = _Reservation(owner, 0, Admission.FIT)
            self._held[reservation.admission] += nbytes - before
            self.used += nbytes - before
            reservation.nbytes = nbytes
            self.peak = max(self.peak, self.used)
            self._changed()
            return True

    def wait(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        """Block until ``predicate()`` holds (evaluated under the lock after every change)."""
        with self.condition:
            return self.condition.wait_for(predicate, timeout)

    # --- history --------------------------------------------------------------------

    def _changed(self) -> None:
        self._sample()
        self.condition.notify_all()

    def _sample(self) -> None:
        if self._record:
            self.history.append(
                MemorySample(
                    self.clock(),
                    self.used,
                    self._held[Admission.PROGRESS],
                    self._held[Admission.OVERCOMMIT],
                    self.running,
                )
            )

    def reset_history(self) -> None:
        """Start the history, the peak and the counters afresh from what is reserved now
        (the real executor after a warm-up job)."""
        with self.condition:
            self.progress_count = self.overcommit_count = 0
            self.peak = self.used
            self.history.clear()
            self._sample()

    def check(self) -> None:
        """Raise if the ledger was ever above budget without a progress/over-commit reservation."""
        for sample in self.history:
            if sample.used - sample.progress_held - sample.overcommit_held > self.budget:
                raise ScheduleError(
                    f"ledger invariant broken at t={sample.time:g}: {sample.used} bytes used, "
                    f"{sample.progress_held} by the progress rule, budget {self.budget}"
                )
