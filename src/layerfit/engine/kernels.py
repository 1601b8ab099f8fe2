"""The kernel stage: the executing thread's side of a pass.

The model's own ``forward`` runs each unit's kernels. The stage's hooks, in the shape
of Accelerate's ``ModelHook`` (an object per unit holding the stage, not a closure), tie
it to that forward: before a unit's first layer its :class:`PreHook` waits for the
unit's bytes and binds it; after its last layer its :class:`PostHook` unbinds it and
gives its buffer back. They are defined here, beside the state they write, and run their
unit's whole step inline (the per-token path of a decoder runs them for every unit). The
hooks of :mod:`layerfit.engine.hooks` for units read in part when they run (rows,
experts) call the stage to take their place (:meth:`KernelStage.place`) and to start once
read (:meth:`KernelStage.started_after_read`).

The stage keeps the order units run in (:meth:`KernelStage.check_order`): a pass begins
at the first unit it runs and runs each after it once, in the prepared order; it may
skip units (a cached decoder step skips its cross-attention projections), whose bytes
the reader or the copier gives back, and a unit the reader passed over, expecting it
skipped, rewinds the reader. It is the one writer of the fields of the pass's
:class:`~layerfit.engine.pass_state.PassState` that say where the kernels stand, and it
owns, per pass, what is bound where (``bound``), when each kernel started, the units
skipped and its share of the timeline. It changes the other stages' state through their
methods only (:class:`~layerfit.engine.reader.ReadStage` and its
:class:`~layerfit.engine.reader.ReadUnits`, :class:`~layerfit.engine.copier.CopyStage`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NoReturn

from torch import nn

from layerfit.engine.expert_places import ExpertPlace
from layerfit.engine.trace import Event
from layerfit.errors import LayerfitError, ReadError
from layerfit.store.manifest import ALIGN

if TYPE_CHECKING:
    from layerfit.engine.pass_state import PassState
    from layerfit.engine.stream import UnitStream


def raise_failure(run: PassState) -> NoReturn:
    """Raise, on the executing thread, what failed on the reader or copy thread."""
    failed, exc = run.error
    if isinstance(exc, LayerfitError):
        raise type(exc)(str(exc)) from exc
    raise ReadError(f"reading unit {failed} failed: {exc}") from exc


class KernelStage:
    """The executing thread's side of ``stream``'s passes."""

    def __init__(self, stream: UnitStream) -> None:
        self.stream = stream
        self.begin_pass()

    def begin_pass(self) -> None:
        """A pass begins: nothing bound, run or skipped yet."""
        self.bound: dict[int, int] = {}  # unit -> its offset in the buffer it is bound over (-1: kept, preload)
        self.kernel_start: dict[int, float] = {}  # unit -> when its kernel started (the timeline's clock)
        self.skipped: set[int] = set()  # units after the first that did not run
        self.events: list[Event] = []  # its kernels, and the reads made on this thread, when tracing
        self.held: range = range(0)  # units bound as one by a run in row stripes (see hold)
        self.holding = False  # hold or let_go is binding or releasing them now

    # --- a unit's end ---------------------------------------------------------------------

    def end_host_lookup(self, run: PassState, i: int) -> None:
        """The end of an embedding looked up on the host with three stages: its rows'
        place in the read buffer goes back, oldest first, as the copier gives back the
        units it copied."""
        stream = self.stream
        off = self.bound.pop(i)
        with stream.state:  # both at once: the copier goes on once the rows' place is back
            stream.ring.release_locked(off)
            self.end_gather(run, i)
            run.done = i + 1
            stream.reader.wake(run)
            stream.copier.wake(run)

    def wake_after_kernel(self, run: PassState) -> None:
        """A kernel started or ended: the reader (and copier) may go (lock held)."""
        self.stream.reader.wake(run)
        if self.stream.device_ring is not None:
            self.stream.copier.wake(run)

    # --- units read in part when they run (rows, experts) -----------------------------------

    def place(self, run: PassState, i: int, nbytes: int, saved: object, what: str) -> int:
        """Take ``nbytes`` of the ring for unit ``i``; ``saved`` is what its table
        restores after the pass. Every earlier unit was released and the reader waits
        for this one to have its place, so it may use the whole ring."""
        stream, ring = self.stream, self.stream.ring
        with stream.state:
            off = stream.reader.output.take_reserved(run, i, nbytes)  # its place, reserved when the pass was read ahead
            if off is None:
                # Empty but for a skipped unit still being read, which the reader gives
                # back when its read ends: this unit waits for that, since placed after
                # it it would be given back first, and the ring gives back oldest first.
                while ring.in_use and run.error is None:
                    stream.ready.wait()
                if run.error is not None:
                    raise LayerfitError(f"no room in the unit buffer for {what}")
                off = ring.allocate_locked(nbytes)  # planned to fit the whole ring
            self.bound[i] = off
            run.gathered[i] = saved
            stream.reader.pass_over(i)
            stream.room.notify()  # the reader may go on past this unit
        return off

    def take_read_ahead(self, run: PassState, i: int) -> ExpertPlace | None:
        """The compact place the reader read unit ``i``'s guessed experts into, once that
        read has ended, now bound; None when it took none (nor will now: the unit takes
        its own place)."""
        stream = self.stream
        reader, read = stream.reader, stream.reader.output
        with stream.state:
            place = read.guessed_place(i)
            if place is None:
                reader.pass_over(i)  # the reader goes on without it
                return None
            run.main_waits = i
            while read.ready[i] is None and run.error is None and read.guessed_place(i) is place:
                stream.ready.wait()
            run.main_waits = None
            if read.ready[i] is None:
                if run.error is not None:
                    raise_failure(run)
                reader.pass_over(i)  # given back meanwhile (a rewind): the unit takes its own place
                return None
            read.take_guessed_place(i)
            self.bound[i] = place.offset
            run.gathered[i] = None
            return place

    def restores(self, run: PassState, i: int, saved: object) -> None:
        """What unit ``i``'s table restores when it ends (lock taken here)."""
        with self.stream.state:
            run.gathered[i] = saved

    def started_after_read(self, run: PassState, i: int, t0: float, t1: float, nbytes: int) -> None:
        """Unit ``i``'s read on this thread (``t0``..``t1``, ``nbytes``) is done and its
        kernels start."""
        stream = self.stream
        with stream.state:
            if stream.trace:
                self.events.append(Event(i, stream.blocks[i].name, "read", t0 - run.t0, t1 - run.t0, nbytes))
            self.kernel_start[i] = t1 - run.t0
            run.started = i + 1
            stream.reader.wake(run)

    def end_gather(self, run: PassState, i: int) -> None:
        """Put the meta tensors back in place of the rows or experts read (and what the
        table changed of its module for the pass)."""
        self.stream.gathered[i].restore(run.gathered.pop(i))

    # --- the order units run in ---------------------------------------------------------

    def check_order(self, run: PassState, i: int) -> None:
        """Streamed units run once each, in the prepared order: a unit run again, or
        inside another, would use released bytes or wait for a read that never comes.
        The pass begins at the first unit it runs, which the reader waits to know, and
        may skip units (see :meth:`_skip`)."""
        if not run.ordered:
            return
        stream = self.stream
        if i not in run.units:
            part = f"units {run.units.start}-{run.units.stop - 1}" if len(run.units) else "no units"
            raise stream.out_of_order(i, f"runs, but this pass streams {part}")
        if run.begin is None:
            self._begin(run, i)
        done = run.done
        if self.bound and i in self.held and all(b in self.held for b in self.bound):
            done = max(self.bound) + 1  # the units held before it are bound, not done
        elif self.bound:
            running = stream.blocks[next(iter(self.bound))].name or "<root>"
            raise stream.out_of_order(i, f"runs inside unit {next(iter(self.bound))} ({running})")
        if i < done:
            raise stream.out_of_order(i, "runs a second time")
        if i > done:
            if run.source is not None:
                skipped = stream.blocks[run.done].name or "<root>"
                raise stream.out_of_order(i, f"runs, but unit {run.done} ({skipped}) before it did not")
            self._skip(run, i)
        if i in run.expect_skipped:
            self._rewind(run, i)

    def _begin(self, run: PassState, i: int) -> None:
        """The pass begins at unit ``i``: the reader and copier may go."""
        stream = self.stream
        with stream.state:
            run.begin = run.started = run.done = i
            # The reader expects skips on two stages (with a copy stage it is not rewound).
            if run.source is None and stream.device_ring is None:
                run.expect_skipped = set(stream.expected_skips((run.units.start, run.units.stop, i), stream.last_start))
            stream.reader.output.adopt(run)  # what was read ahead for it, if anything
            stream.room.notify()
            stream.copyable.notify()

    def _skip(self, run: PassState, i: int) -> None:
        """Unit ``i`` runs and the units between the last one that ran and it do not: a
        decoder step whose cross-attention keys and values are cached skips their
        projections. What was read (or copied) of them is given back and no more of them
        is read (bytes read ahead for nothing, but the output is the model's: a skipped
        unit is never bound). Each buffer is given back oldest first: here what is ready
        for the kernels; a read or copy under way by its thread when it ends; with a copy
        stage, the read buffer by the copier, in order."""
        stream = self.stream
        three = stream.device_ring is not None
        with stream.state:
            skipped = range(run.done, i)
            if three:
                stream.copier.give_back(skipped)
            else:
                stream.reader.output.give_back(skipped)
            self.skipped.update(skipped)
            run.done = run.started = i
            stream.reader.wake(run)
            if three:
                stream.copier.wake(run)

    def _rewind(self, run: PassState, i: int) -> None:
        """Unit ``i`` runs, though the last such pass skipped it and so the reader did not
        read it: what the reader read ahead of it is discarded (the oldest bytes in the
        ring, in order; a read under way is discarded by the reader when it ends) and the
        reader goes back to ``i``. Bytes read twice, never a wrong one."""
        stream = self.stream
        with stream.state:
            run.expect_skipped.discard(i)
            stream.reader.output.give_back(range(i + 1, run.units.stop))
            run.epoch += 1
            run.rewind_to = i
            stream.room.notify()

    def give_back_used(self, i: int, base: int, nbytes: int) -> bool:
        """Unit ``i``, bound at ``base`` of the read buffer and the oldest there, has used its
        first ``nbytes`` for good (:meth:`~layerfit.engine.stream.UnitStream.release_rows_as_used`):
        give their whole pages back (the rest is given back from where they end) and wake
        whoever waits for room. Whether the buffer holds nothing else now."""
        stream = self.stream
        front = base + nbytes // ALIGN * ALIGN
        with stream.state:
            off = self.bound.get(i)
            if off is None or not off < front < base + stream.blocks[i].nbytes or not stream.ring.oldest_starts_at(off):
                return False
            stream.ring.release_front_locked(off, front)
            self.bound[i] = front
            stream.room.notify_all()  # the read-ahead may wait for room
            return stream.ring.holds_only(front)

    # --- units held as one ---------------------------------------------------------------

    def hold(self, units: range) -> None:
        """Bind ``units`` as one unit until :meth:`let_go`: a run in row stripes
        (:mod:`layerfit.engine.stripes`) interleaves the phases of their layers, so each
        runs while the others are bound. Each is waited for and bound in order by its
        :class:`PreHook`, as if its layers ran; their modules' own hooks do nothing meanwhile."""
        self.held, self.holding = units, True
        try:
            for i in units:
                PreHook(self.stream, i)(None, ())
        finally:
            self.holding = False

    def let_go(self) -> None:
        """Release the units :meth:`hold` bound, in order, each by its :class:`PostHook`."""
        self.holding = True
        try:
            for i in self.held:
                PostHook(self.stream, i)(None, (), None)
        finally:
            self.holding, self.held = False, range(0)

    def ended_short(self, run: PassState) -> None:
        """After a streamed pass: the units it did not run after its last are skipped
        too (read for nothing if read)."""
        if run.done != run.units.stop:  # it ended before its last units
            with self.stream.state:
                self.skipped.update(range(run.done, run.units.stop))
                self.stream.reader.output.unrun(range(run.done, run.units.stop))

    def unbind_left(self, run: PassState, streaming: bool) -> None:
        """At the pass's end, its threads stopped: unbind what it left bound (a pass
        that failed midway), and put every table's meta tensors back."""
        stream = self.stream
        if streaming:
            for i in list(self.bound):
                if i in run.gathered:
                    self.end_gather(run, i)
                elif i not in stream.kept:
                    stream.binder.unbind(stream.bindings[i])
            self.bound.clear()
        elif run.source is not None:
            for i in list(self.bound):
                stream.binder.unbind(stream.bindings[i])
            self.bound.clear()
        for i in list(run.gathered):
            self.end_gather(run, i)


class SharedHook:
    """A hook is shared, not copied, by a copy of its module (the ``instantiate``
    binding deep-copies modules), as a function hook is."""

    def __deepcopy__(self, memo: dict) -> SharedHook:
        return self


class UnitHook(SharedHook):
    """A hook of unit ``index`` of ``stream``'s configuration, in the shape of
    Accelerate's ``ModelHook``: its state is explicit (the stream's stages), not a
    closure's."""

    def __init__(self, stream: UnitStream, index: int) -> None:
        self.stream = stream
        self.kernels = stream.kernels
        self.index = index


class PreHook(UnitHook):
    """Before the unit's first layer: wait for its bytes, then bind its weights."""

    def __call__(self, module: nn.Module, args: tuple) -> None:
        stream, kernels, i = self.stream, self.kernels, self.index
        run = stream.run
        if run is None or (i in kernels.held and not kernels.holding):  # bound as one by hold
            return
        kernels.check_order(run, i)
        if run.source is not None:  # the unit source decides when the unit may run
            buffer, off = run.source.acquire(i)
            kernels.kernel_start[i] = run.now()
            stream.binder.bind(stream.bindings[i], buffer, off)
            kernels.bound[i] = off
            return
        if stream.policy.resident:
            kernels.bound[i] = -1
            kernels.kernel_start[i] = run.now()
            return
        if i in stream.kept:  # bound for good: nothing to wait for
            kernels.bound[i] = -1
            with stream.state:
                kernels.kernel_start[i] = run.now()
                run.started = i + 1
                kernels.wake_after_kernel(run)
            return
        # Without a copy stage the kernel uses the read buffer; with one, the device's.
        three = stream.device_ring is not None
        slots, ring = (stream.copier.on_device, stream.device_ring) if three else (stream.reader.output.ready, stream.ring)
        with stream.state:
            if slots[i] is None and run.error is None:
                run.main_waits = i
                stream.reader.wake(run)  # the reader may be holding out for a batch
                while slots[i] is None and run.error is None:
                    stream.ready.wait()
                run.main_waits = None
            if slots[i] is None:
                raise_failure(run)
            off = slots[i]
            # The kernel starts now (binding is part of it); the sync policy lets the
            # next read (and copy) begin from this moment.
            kernels.kernel_start[i] = run.now()
            run.started = i + 1
            kernels.wake_after_kernel(run)
        stream.binder.bind(stream.bindings[i], ring.bytes, off)
        kernels.bound[i] = off
        if not three:
            stream.compute_rows_as_read(run, i)  # the pass's last streamed unit: rows multiplied as read,
            stream.release_rows_as_used(run, i, off)  # and their pages back as used


class PostHook(UnitHook):
    """After the unit's last layer: unbind its weights and give its buffer back (the
    output it returns, when not None, replaces the module's)."""

    def __call__(self, module: nn.Module, args: tuple, output: Any) -> Any:
        stream, kernels, i = self.stream, self.kernels, self.index
        run = stream.run
        if run is None or (i in kernels.held and not kernels.holding):  # released by let_go
            return None
        # An embedding looked up on the host (three stages) ran no device kernel.
        host_lookup = i in run.gathered and stream.device_ring is not None
        streaming = run.source is None and not stream.policy.resident
        if streaming and i not in stream.kept and not host_lookup:  # its buffer may be reused once its kernels finished
            stream.device.finish_kernels()
        if stream.trace:
            end = run.now()
            blk = stream.blocks[i]
            with stream.state:
                kernels.events.append(Event(i, blk.name, "kernel", kernels.kernel_start[i], end, blk.nbytes))
        if host_lookup:  # hand the rest of the model its output on the device
            kernels.end_host_lookup(run, i)
            return stream.device.to_device(output)
        if i not in kernels.bound:
            if not run.ordered:  # preload: every unit stays bound
                with stream.state:
                    run.done = i + 1
                return None
            raise stream.out_of_order(i, "ends, but its first layer did not run")
        off = kernels.bound.pop(i)
        if i in run.gathered:  # and on to release its rows' place in the ring
            kernels.end_gather(run, i)
        if i in stream.kept and run.source is None:
            with stream.state:
                run.done = i + 1
                kernels.wake_after_kernel(run)
            return None
        if run.source is not None:
            stream.binder.unbind(stream.bindings[i])
            run.source.release(i)
        elif streaming:
            stream.binder.unbind(stream.bindings[i])
            with stream.state:
                if stream.device_ring is None:
                    stream.await_whole(run, i)  # (a unit handed over as it was read: until its read ends)
                    stream.ring.release_locked(off)
                    if stream.read_ahead.current is not None:  # begun as its rows were used: room for it
                        stream.room.notify_all()
                else:
                    stream.device_ring.release_locked(off)
                    stream.copier.wake(run)
                run.done = i + 1
                stream.reader.wake(run)
            stream.read_next_early(run, i)  # the pass's last unit not kept: read the next one's
            return None
        with stream.state:
            run.done = i + 1
        return None


__all__ = ["KernelStage", "PostHook", "PreHook", "SharedHook", "UnitHook", "raise_failure"]
