"""The copy stage of the three-stage pipeline (read, copy, kernel; always on CUDA).

The copy thread moves each unit the reader has read into the device buffer, in order,
as Algorithm 1's copy constraints allow (the unit was read, its policy's gate is open,
it has room in the device buffer), and gives the read buffer back once the copy is
complete. It works under the :class:`~layerfit.engine.stream.UnitStream`'s lock and
waits on its ``copyable`` condition.

The stage owns where each unit copied lies in the device buffer (``on_device``, its
output, which the kernels read) and the unit it waits for; it takes its input from the
reader's output (``ReadStage.ready``) and gives the read buffer back through the
reader (:meth:`~layerfit.engine.reader.ReadUnits.release_skipped`). The kernels give back what
they skip through :meth:`CopyStage.give_back`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from layerfit.engine.ring import Cancelled
from layerfit.engine.trace import Event
from layerfit.errors import LayerfitError

if TYPE_CHECKING:
    from layerfit.engine.pass_state import PassState
    from layerfit.engine.stream import UnitStream


class CopyStage:
    """The copy thread of ``stream``."""

    def __init__(self, stream: UnitStream) -> None:
        self.stream = stream
        self.begin_pass(0)

    def begin_pass(self, nblocks: int) -> None:
        """A pass of ``nblocks`` units begins (before its threads start)."""
        self.on_device: list[int | None] = [None] * nblocks  # device buffer offset per unit (its output)
        self.waits: int | None = None  # the unit it waits to copy
        self.read_for_nothing = 0  # bytes it copied that no kernel used
        self.events: list[Event] = []  # its copies, when tracing

    def may_go(self, run: PassState, j: int) -> bool:
        """The copy thread's wake-up predicate for unit ``j`` (lock held): Algorithm 1's
        copy constraints — the unit was read, and it has room in the device buffer. A unit
        read after an embedding looked up on the host waits for that lookup's end: its
        read buffer goes back after the rows' place, which is older (the ring gives back
        oldest first)."""
        stream = self.stream
        if any(g < j for g in run.gathered):
            return False
        ready = stream.reader.output.ready
        if j < run.done:  # skipped: once the reader read it or passed it over
            return ready[j] is not None or j in stream.reader.not_read
        return (
            ready[j] is not None
            and stream.policy.copy_may_start(j, run.started, run.done)
            and stream.device_ring.fits(stream.blocks[j].nbytes)
        )

    def wake(self, run: PassState) -> None:
        """Wake the copy thread if what it waits for has happened (lock held)."""
        stream = self.stream
        j = self.waits
        if j is not None and (stream.device_ring.cancelled or self.may_go(run, j)):
            stream.copyable.notify()

    def loop(self, run: PassState) -> None:
        """The copy stage: move each read unit into the device buffer, in order, and
        give its read buffer back once the copy is complete."""
        stream = self.stream
        dev, cond = stream.device_ring, stream.copyable
        j = 0
        try:
            with cond:
                while run.begin is None and not dev.cancelled:
                    cond.wait()
                if dev.cancelled:
                    return
                first, stop = run.begin, run.units.stop
            for j in range(first, stop):
                if j in stream.kept:  # already on the device, for good
                    continue
                if j in stream.gathered:  # an embedding looked up on the host: nothing to copy
                    continue
                if not self._copy(run, j):
                    return
        except Cancelled:
            return
        except BaseException as exc:  # handed to the executing thread, which raises it
            name = stream.blocks[j].name or "<root>"
            stream.fail(run, j, LayerfitError(f"copying unit {j} ({name}) to {stream.device.torch_device} failed: {exc}"))

    def _copy(self, run: PassState, j: int) -> bool:
        """Copy unit ``j`` once it may go (or give back what was read of it if the
        kernels skipped it); False when cancelled."""
        stream = self.stream
        host, dev, cond, blk = stream.ring, stream.device_ring, stream.copyable, stream.blocks[j]
        with cond:
            while not dev.cancelled and not self.may_go(run, j):
                self.waits = j
                cond.wait()
            self.waits = None
            if dev.cancelled:
                return False
            if j < run.done:  # the kernels skipped it: give back what was read, in order
                if stream.reader.output.release_skipped(j):
                    self._read_buffer_freed(run, j)
                return True
            src = stream.reader.output.ready[j]
            dst = dev.allocate_locked(blk.nbytes)
        t0 = time.perf_counter()
        stream.device.copy(dev.bytes[dst : dst + blk.nbytes], host.bytes[src : src + blk.nbytes])
        t1 = time.perf_counter()
        with cond:
            host.release_locked(src)
            if j < run.done:  # skipped while it was copied: the oldest on the device
                dev.release_locked(dst)
                self.read_for_nothing += blk.nbytes
                self._read_buffer_freed(run, j)
                return True
            self.on_device[j] = dst
            if stream.trace:
                self.events.append(Event(j, blk.name, "copy", t0 - run.t0, t1 - run.t0, blk.nbytes))
            self._read_buffer_freed(run, j)
        return True

    def _read_buffer_freed(self, run: PassState, j: int) -> None:
        """Unit ``j``'s read buffer went back (lock held): the reader may go on, and the
        executing thread, if it waits for ``j`` on the device or for an empty read buffer
        to place an embedding's rows in (``PartialReadHook.place``)."""
        stream = self.stream
        if run.main_waits == j or not stream.ring.in_use:
            stream.ready.notify()
        stream.reader.wake(run)

    def give_back(self, units: range) -> None:
        """The kernels skipped ``units`` (lock held): what was copied of them goes back,
        the oldest bytes in the device buffer, copied for nothing. A copy under way is
        given back by the copy thread when it ends, and what was read by it, in order."""
        dev, blocks, on_device = self.stream.device_ring, self.stream.blocks, self.on_device
        for k in units:
            if on_device[k] is not None:
                dev.release_locked(on_device[k])
                on_device[k] = None
                self.read_for_nothing += blocks[k].nbytes


__all__ = ["CopyStage"]
