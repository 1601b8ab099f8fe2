"""A circular weight buffer whose total size is the budget, with its ledger.

Units are placed one after another in one pre-allocated, pre-faulted aligned buffer and
released in the order they were placed (Demand Layering's circular buffer). A unit never
straddles the end: if it does not fit in the tail, it starts again at offset 0, and the
skipped tail is counted as in use until the unit before it is released. ``allocate``
blocks on a condition until there is room; nothing spins, and a release wakes the
waiting allocator only once its request fits (a thread woken for nothing costs a
context switch that, on a small board, preempts the kernel's own threads).

The engine passes its own condition (the one its reader waits on for room) and calls the
``*_locked`` methods while holding it, so one acquisition covers a release and the
progress it signals.
"""

from __future__ import annotations

import contextlib
import mmap
import threading
import time
from collections import deque

import torch

from layerfit.errors import BudgetError
from layerfit.sizes import format_bytes_exact
from layerfit.store.reader import aligned_buffer


class Cancelled(Exception):
    """Raised in a waiting thread when the inference it serves was abandoned."""


class RingBuffer:
    """FIFO allocator over one aligned buffer; tracks bytes in use and their peak."""

    def __init__(
        self,
        capacity: int,
        condition: threading.Condition | None = None,
        storage: torch.Tensor | None = None,
    ) -> None:
        self.capacity = capacity
        if storage is None:  # host memory the reader reads into with direct I/O
            self.mmap: mmap.mmap | None = aligned_buffer(capacity)
            self.mapped = len(self.mmap)
            self.view: memoryview | None = memoryview(self.mmap)
            self.bytes = torch.frombuffer(memoryview(self.mmap), dtype=torch.uint8)
        else:  # device memory (a copy stage's target): only the allocator is shared
            self.mmap, self.view = None, None
            self.mapped = storage.numel()
            self.bytes = storage
        self._cond = condition or threading.Condition()
        self._waiting_for: list[int] = []  # bytes each blocked ``allocate`` asks for
        self.record_history = True  # occupancy over time (for timelines)
        self._live: deque[tuple[int, int]] = deque()  # (start, end incl. skipped tail)
        self._head = 0  # next free offset
        self.in_use = 0
        self.peak = 0
        self.history: list[tuple[float, int]] = []  # (perf_counter, bytes in use)
        self.cancelled = False

    @property
    def condition(self) -> threading.Condition:
        return self._cond

    def _fits(self, nbytes: int) -> int | None:
        if not self._live:
            return 0
        tail_start = self._live[0][0]
        if self._head > tail_start or (self._head == tail_start and not self._live):
            if self.capacity - self._head >= nbytes:
                return self._head
            if tail_start >= nbytes:
                return 0
            return None
        if tail_start - self._head >= nbytes:
            return self._head
        return None

    def fits(self, nbytes: int) -> bool:
        """Would ``nbytes`` fit now? (Caller holds the lock.)"""
        return self._fits(nbytes) is not None

    def next_offset(self, nbytes: int) -> int | None:
        """Where ``nbytes`` would be placed now, or None if they do not fit (lock held)."""
        return self._fits(nbytes)

    def allocate(self, nbytes: int) -> int:
        """Offset of ``nbytes`` contiguous bytes; waits for earlier units to be released."""
        self._check_size(nbytes)
        with self._cond:
            while True:
                if self.cancelled:
                    raise Cancelled
                start = self._fits(nbytes)
                if start is not None:
                    break
                self._waiting_for.append(nbytes)
                try:
                    self._cond.wait()
                finally:
                    self._waiting_for.remove(nbytes)
            return self._place(start, nbytes)

    def allocate_locked(self, nbytes: int) -> int | None:
        """Offset of ``nbytes`` contiguous bytes, or None if they do not fit now; never
        waits. The caller holds the lock."""
        self._check_size(nbytes)
        start = self._fits(nbytes)
        return None if start is None else self._place(start, nbytes)

    def _check_size(self, nbytes: int) -> None:
        if nbytes > self.capacity:
            raise BudgetError(
                f"a unit of {format_bytes_exact(nbytes)} cannot fit a buffer of {format_bytes_exact(self.capacity)}"
            )

    def _place(self, start: int, nbytes: int) -> int:
        skipped = 0
        if self._live and start == 0 and self._head != 0:
            # Wrapped: the tail [head, capacity) stays unusable until its left
            # neighbour is released; charge it to the previous allocation.
            prev_start, _ = self._live[-1]
            skipped = self.capacity - self._head
            self._live[-1] = (prev_start, self.capacity)
        self._live.append((start, start + nbytes))
        self._head = start + nbytes
        self.in_use += nbytes + skipped
        self._record()
        return start

    def release(self, start: int) -> None:
        """Release the oldest allocation, which must start at ``start`` (FIFO order)."""
        with self._cond:
            self.release_locked(start)
            if any(self._fits(n) is not None for n in self._waiting_for):
                self._cond.notify_all()

    def release_locked(self, start: int) -> None:
        """``release`` for a caller that holds the lock and wakes its own waiters."""
        first, end = self._live.popleft()
        if first != start:
            self._live.appendleft((first, end))
            raise RuntimeError(f"ring released out of order: {start} is not the oldest ({first})")
        self.in_use -= end - first
        if not self._live:
            self._head = 0
            self.in_use = 0
        self._record()

    def release_front_locked(self, start: int, new_start: int) -> None:
        """Give back the first bytes, ``start`` up to ``new_start``, of the oldest allocation,
        which then begins at ``new_start`` (a unit whose first bytes its kernel has used
        and will not read again); released later as ``new_start``. Lock held; the caller
        wakes its own waiters."""
        first, end = self._live[0] if self._live else (None, None)
        if first != start or not start < new_start < end:
            raise RuntimeError(f"ring front {start}..{new_start} is not inside the oldest allocation ({first}..{end})")
        self._live[0] = (new_start, end)
        self.in_use -= new_start - start
        self._record()

    def oldest_starts_at(self, start: int) -> bool:
        """Whether the oldest allocation begins at ``start`` (lock held)."""
        return bool(self._live) and self._live[0][0] == start

    def holds_only(self, start: int) -> bool:
        """Whether the buffer holds one allocation, the one beginning at ``start`` (lock held)."""
        return len(self._live) == 1 and self._live[0][0] == start

    def _record(self) -> None:
        self.peak = max(self.peak, self.in_use)
        if self.record_history:
            self.history.append((time.perf_counter(), self.in_use))

    def reset(self) -> None:
        """Forget every allocation (after an aborted inference) and clear cancellation."""
        with self._cond:
            self._live.clear()
            self._head = 0
            self.in_use = 0
            self.cancelled = False
            self.history.clear()
            self.peak = 0
            self._cond.notify_all()

    def restart_ledger(self) -> None:
        """Begin a new pass's ledger with what the buffer holds now (units read ahead for
        that pass, :mod:`layerfit.engine.read_ahead`) and clear cancellation."""
        with self._cond:
            self.cancelled = False
            self.history.clear()
            self.peak = self.in_use
            self._record()

    def reshape(self, capacity: int) -> bool:
        """Change the capacity in place when it fits the mapping; False if it does not.

        Shrinking gives the pages beyond the new capacity back to the kernel
        (``MADV_DONTNEED``), so memory really shrinks; growing within the mapping
        pre-faults the pages it adds. Reusing the mapping makes run-time re-budgeting
        cost microseconds instead of mapping and zeroing a new buffer. Only call between
        inferences.
        """
        if self.mmap is None or capacity > self.mapped or capacity <= 0:
            return False
        with self._cond:
            page = mmap.PAGESIZE
            new_end = -(-capacity // page) * page
            old_end = -(-self.capacity // page) * page
            if new_end < old_end:
                self.mmap.madvise(mmap.MADV_DONTNEED, new_end, old_end - new_end)
            elif new_end > old_end:
                self.bytes[old_end:new_end:page] = 0  # touch each added page once
            self.capacity = capacity
        self.reset()
        return True

    def cancel(self) -> None:
        with self._cond:
            self.cancelled = True
            self._cond.notify_all()

    def close(self) -> None:
        del self.bytes
        if self.mmap is None:
            return
        self.view.release()
        with contextlib.suppress(BufferError):  # a view is still alive: freed with it
            self.mmap.close()
