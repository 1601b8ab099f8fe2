"""The streaming state machine: a pass's threads, their shared state, and the order units run in.

During a pass the reader thread (:mod:`layerfit.engine.reader`) reads units in order as
the policy and the read buffer allow; with a copy stage (three stages) the copy thread
(:mod:`layerfit.engine.copier`) moves each read unit into the device buffer. The
executing thread (the model's forward, through the hooks of
:mod:`layerfit.engine.hooks`) waits for each unit, runs it and gives its buffer back.
All three share one :class:`~layerfit.engine.pass_state.PassState` under one lock, with
a condition per waiter: the reader waits on ``room``, the executing thread on ``ready``,
the copy thread on ``copyable``; each is woken only when what it waits for has happened.
Nothing spins.

A pass begins at the first unit it runs and may skip units (a cached decoder step skips
its cross-attention projections): what was read of them is given back, oldest first,
and the next such pass does not read them; a unit that runs after all rewinds the reader.
When a pass has read its last unit and given it back, the next one's first units are read
ahead (:mod:`layerfit.engine.read_ahead`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from layerfit.engine.binding import Binder
from layerfit.engine.buffers import WeightBuffers
from layerfit.engine.copier import CopyStage
from layerfit.engine.device import Device
from layerfit.engine.expert_cache import ExpertCache
from layerfit.engine.expert_guess import ExpertMemory, GuessCount
from layerfit.engine.expert_places import ExpertPlace
from layerfit.engine.experts import ExpertTable
from layerfit.engine.gather import RowTable
from layerfit.engine.pass_state import PassState
from layerfit.engine.policies import Policy
from layerfit.engine.read_ahead import NextPass, ReadAhead, ReadAheadReader, Start
from layerfit.engine.reader import ReadStage
from layerfit.engine.ring import RingBuffer
from layerfit.engine.skeleton import Binding
from layerfit.engine.unit_reader import UnitReader
from layerfit.engine.units import Block
from layerfit.errors import LayerfitError

OTHER_PATH = (
    "the model's control flow differs from the one captured at prepare (a branch or loop "
    "that depends on the input, or another input shape), so its weights cannot stream in "
    "the prepared order: prepare it with an input that takes this path, or load it with "
    "pipeline='preload'"
)


class UnitStream:
    """Streams the units of one configuration through the buffers; owns the pass state."""

    def __init__(self, device: Device, units: UnitReader, buffers: WeightBuffers, binder: Binder,
                 coalesce_bytes: int, trace: bool, read_ahead: bool = False) -> None:
        self.device = device
        self.units = units
        self.buffers = buffers
        self.binder = binder
        self.coalesce_bytes = coalesce_bytes
        self.trace = trace
        self.state = threading.Lock()
        self.room = threading.Condition(self.state)  # the reader waits for room or its gate
        self.ready = threading.Condition(self.state)  # the executing thread waits for a unit
        self.copyable = threading.Condition(self.state)  # the copy thread (three stages)
        self.run: PassState | None = None  # the pass under way
        self.policy: Policy | None = None
        self.blocks: Sequence[Block] = ()
        self.bindings: Sequence[list[Binding]] = ()
        self.kept: frozenset[int] = frozenset()  # units bound for good beside the ring (auto)
        self.gathered: dict[int, RowTable | ExpertTable] = {}  # units read by rows or experts when they run
        self.expert_cache: ExpertCache | None = None  # single experts kept as they are used (auto)
        self.compact_units: frozenset[int] = frozenset()  # routed units bound compact (expert_places)
        self.guessed_units: frozenset[int] = frozenset()  # of them, those whose guess the reader reads ahead
        self.guesses = GuessCount()  # experts read ahead, and of them chosen, over the configuration
        # The units the last pass that began at a unit skipped, by where it began and
        # where the pass before it began: the next such pass does not read them. A cached
        # decoder step skips what the step before it skipped; the first step after the
        # encoder's pass skips nothing.
        self.skips_seen: dict[tuple, frozenset[int]] = {}
        self.last_start: Start | None = None  # (part start, stop, first unit run)
        self.reader = ReadStage(self)
        self.copier = CopyStage(self)
        self.read_ahead_on = read_ahead
        self.read_ahead = ReadAheadReader(self.state, units)

    def configure(self, policy: Policy, blocks: Sequence[Block], bindings: Sequence[list[Binding]],
                  kept: frozenset[int], gathered: dict[int, RowTable | ExpertTable],
                  experts: ExpertMemory | None = None) -> None:
        """Stream ``blocks`` under ``policy`` from now on; what passes skipped is forgotten
        (and the routed experts' cache and counts of the last configuration, whose units
        were numbered otherwise)."""
        self.policy, self.blocks, self.bindings = policy, blocks, bindings
        self.kept, self.gathered = kept, gathered
        experts = experts or ExpertMemory()
        self.expert_cache, self.compact_units = experts.cache, experts.compact
        self.guessed_units = frozenset(guess.unit for _, guess in experts.guesses)
        self.guesses = GuessCount()
        self.skips_seen, self.last_start = {}, None
        self.read_ahead.forget()

    @property
    def ring(self) -> RingBuffer | None:
        return self.buffers.ring

    @property
    def device_ring(self) -> RingBuffer | None:
        return self.buffers.device_ring

    # --- a pass's threads ---------------------------------------------------------------

    def start_threads(self, run: PassState, ahead: ReadAhead | None = None) -> list[threading.Thread]:
        """Start the reader (and copy) thread of ``run``; ``ahead``: what was read for it
        after the last pass (``read_ahead.take()``), adopted when it begins as expected."""
        if ahead is not None and self.device_ring is None:
            self.ring.restart_ledger()  # it holds what was read ahead, and nothing else
            run.ahead = ahead
        else:
            if ahead is not None:
                ahead.join()
            self.ring.reset()
        if self.read_ahead_on:  # where the read-ahead may start (read_next_early)
            run.last_unkept = max((k for k in run.units if k not in self.kept), default=None)
        threads = [threading.Thread(target=self.reader.loop, args=(run,), name="layerfit-reader", daemon=True)]
        if self.device_ring is not None:
            self.device_ring.reset()
            threads.append(threading.Thread(target=self.copier.loop, args=(run,), name="layerfit-copier", daemon=True))
        for thread in threads:
            thread.start()
        return threads

    def stop_threads(self, run: PassState, threads: list[threading.Thread]) -> None:
        """Cancel and join ``run``'s threads; unbind what the pass left bound."""
        for ring in self.buffers.streaming_rings:
            ring.cancel()
        for thread in threads:
            thread.join()
        if run.ahead is not None:  # a pass that never began did not wait for it
            run.ahead.join()
        for i in list(run.bound):
            if i in run.gathered:
                self.end_gather(run, i)
            elif i not in self.kept:
                self.binder.unbind(self.bindings[i])
        run.bound.clear()

    def end_gather(self, run: PassState, i: int) -> None:
        """Put the meta tensors back in place of the rows or experts read (and what the
        table changed of its module for the pass)."""
        self.gathered[i].restore(run.gathered.pop(i))

    def record_skips(self, run: PassState) -> None:
        """After a streamed pass: the units it did not run after its last (read for
        nothing if read), and what it skipped, which the next such pass will not read."""
        if run.begin is None or not run.ordered:
            return
        if run.done != run.units.stop:  # it ended before its last units
            with self.state:
                for k in range(run.done, run.units.stop):
                    run.skipped_units.add(k)
                    if run.ready[k] is not None:
                        run.read_for_nothing += self.blocks[k].nbytes
        self._learn(run)

    def _learn(self, run: PassState) -> None:
        """Remember how ``run`` began and what it skipped, for the passes after it to
        expect; once per pass, by its end or, before the read-ahead starts at its tail
        (:meth:`read_next_early`), when every unit after the last it ran is kept (a kept
        unit is never expected to be skipped, so what it skipped is known then)."""
        if run.source is not None or run.learned:
            return
        run.learned = True
        start = (run.units.start, run.units.stop, run.begin)
        self.skips_seen[(start, self.last_start)] = frozenset(run.skipped_units)
        self.read_ahead.followed(self.last_start, start)
        self.last_start = start

    # --- the order units run in ---------------------------------------------------------

    def out_of_order(self, i: int, what: str) -> LayerfitError:
        """The error for unit ``i`` running out of the prepared order."""
        name = self.blocks[i].name or "<root>"
        return LayerfitError(f"unit {i} ({name}) {what}: {OTHER_PATH}")

    def check_order(self, run: PassState, i: int) -> None:
        """Streamed units run once each, in the prepared order: a unit run again, or
        inside another, would use released bytes or wait for a read that never comes.
        The pass begins at the first unit it runs, which the reader waits to know, and
        may skip units (see :meth:`_skip`)."""
        if not run.ordered:
            return
        if i not in run.units:
            part = f"units {run.units.start}-{run.units.stop - 1}" if len(run.units) else "no units"
            raise self.out_of_order(i, f"runs, but this pass streams {part}")
        if run.begin is None:
            self._begin(run, i)
        if run.bound:
            running = self.blocks[next(iter(run.bound))].name or "<root>"
            raise self.out_of_order(i, f"runs inside unit {next(iter(run.bound))} ({running})")
        if i < run.done:
            raise self.out_of_order(i, "runs a second time")
        if i > run.done:
            if run.source is not None:
                skipped = self.blocks[run.done].name or "<root>"
                raise self.out_of_order(i, f"runs, but unit {run.done} ({skipped}) before it did not")
            self._skip(run, i)
        if i in run.expect_skipped:
            self._rewind(run, i)

    def _begin(self, run: PassState, i: int) -> None:
        """The pass begins at unit ``i``: the reader and copier may go."""
        with self.state:
            run.begin = run.started = run.done = i
            # The reader expects skips on two stages (with a copy stage it is not rewound).
            if run.source is None and self.device_ring is None:
                run.expect_skipped = set(self._expected_skips((run.units.start, run.units.stop, i), self.last_start))
            if run.ahead is not None:
                began = NextPass(run.units, i, frozenset(run.expect_skipped))
                run.ahead.adopt(run, began, self.ring, self.blocks, self.trace)
            self.room.notify()
            self.copyable.notify()

    def _expected_skips(self, start: Start, before: Start | None) -> frozenset[int]:
        """The units the reader expects a pass that begins as ``start`` after one that
        began as ``before`` to skip: those the last pass so placed skipped, but a table
        read by rows when it runs or a kept unit (neither is read ahead)."""
        seen = self.skips_seen.get((start, before), frozenset())
        return frozenset(seen - set(self.gathered) - self.kept)

    # --- what was read ahead for the pass --------------------------------------------------

    def read_next(self, run: PassState) -> None:
        """``run`` ended well: read the first units of the next pass as far as the read
        buffer has room, unless that began at the pass's tail (:meth:`read_next_early`).
        The next pass is expected to begin as the passes that followed one beginning as
        ``run`` did began most often (as ``run`` at first). Two stages, async only: the
        other policies read as their gates say, and a copy stage is not read ahead."""
        if not self._reads_next(run) or self.read_ahead.current is not None:
            return
        self.ring.reset()  # what the pass left read for nothing
        self._start_read_ahead(run)

    def read_next_early(self, run: PassState, i: int) -> None:
        """Unit ``i`` of ``run`` gave its place in the read buffer back: if it was the
        pass's last unit not kept and the buffer is empty, the next pass's first units are
        read now, while the kept units after it (a decoder's head) run, rather than once
        the pass ends. Every unit after ``i`` is kept and the units before it can no longer
        run, so the pass's reader reads nothing more: the buffer is the read-ahead's, and
        the budget holds as when the pass has ended. (A read of a skipped unit still under
        way holds its place until it ends: then the buffer is not empty, and the
        read-ahead waits for the pass's end as before.)"""
        if i != run.last_unkept or not self._reads_next(run):
            return
        with self.state:
            if self.ring.in_use or self.read_ahead.current is not None:
                return
        self._learn(run)  # the next pass is expected as after the pass ended
        self._start_read_ahead(run)

    def _reads_next(self, run: PassState) -> bool:
        """Whether the next pass is read ahead after ``run`` (see :meth:`read_next`)."""
        return (
            self.read_ahead_on and self.device_ring is None and self.ring is not None
            and self.policy.runs_ahead and run.begin is not None and run.source is None
        )

    def _start_read_ahead(self, run: PassState) -> None:
        """Start reading what the pass after ``run`` is expected to begin with."""
        start = (run.units.start, run.units.stop, run.begin)
        after = self.read_ahead.after(start)
        expected = NextPass(range(after[0], after[1]), after[2], self._expected_skips(after, start))
        chunk = min(self.coalesce_bytes, self.ring.capacity // 2)
        self.read_ahead.start(expected, self.ring, self.blocks, self.kept, self.gathered, chunk)

    def drop_read_ahead(self) -> None:
        """Stop the read-ahead and wait for its read under way: the buffer is the caller's."""
        ahead = self.read_ahead.take()
        if ahead is not None:
            ahead.join()

    def _skip(self, run: PassState, i: int) -> None:
        """Unit ``i`` runs and the units between the last one that ran and it do not: a
        decoder step whose cross-attention keys and values are cached skips their
        projections. What was read (or copied) of them is given back and no more of them
        is read (bytes read ahead for nothing, but the output is the model's: a skipped
        unit is never bound). Each buffer is given back oldest first: here what is ready
        for the kernels; a read or copy under way by its thread when it ends; with a copy
        stage, the read buffer by the copier, in order."""
        three = self.device_ring is not None
        slots, ring = (run.on_device, self.device_ring) if three else (run.ready, self.ring)
        with self.state:
            for k in range(run.done, i):
                if slots[k] is not None:  # ready for the kernels: the oldest bytes in its ring
                    ring.release_locked(slots[k])
                    slots[k] = None
                    place = run.ahead_places.pop(k, None)  # (experts read into a compact place: its bytes)
                    run.read_for_nothing += self.blocks[k].nbytes if place is None else self._place_bytes(k, place)
                elif k in run.reserved:  # rows' place reserved ahead, in its turn
                    ring.release_locked(run.reserved.pop(k)[0])
            run.skipped_units.update(range(run.done, i))
            run.done = run.started = i
            self.wake_reader(run)
            if three:
                self.wake_copier(run)

    def _rewind(self, run: PassState, i: int) -> None:
        """Unit ``i`` runs, though the last such pass skipped it and so the reader did not
        read it: what the reader read ahead of it is discarded (the oldest bytes in the
        ring, in order; a read under way is discarded by the reader when it ends) and the
        reader goes back to ``i``. Bytes read twice, never a wrong one."""
        with self.state:
            run.expect_skipped.discard(i)
            for k in range(i + 1, run.units.stop):
                if run.ready[k] is not None:
                    self.ring.release_locked(run.ready[k])
                    run.ready[k] = None
                    place = run.ahead_places.pop(k, None)
                    run.read_for_nothing += self.blocks[k].nbytes if place is None else self._place_bytes(k, place)
                elif k in run.reserved:  # rows' place reserved ahead, in its turn
                    self.ring.release_locked(run.reserved.pop(k)[0])
            run.epoch += 1
            run.rewind_to = i
            self.room.notify()

    def _place_bytes(self, k: int, place: ExpertPlace) -> int:
        """The bytes read into unit ``k``'s compact place (its experts' slots)."""
        return sum(e is not None for e in place.slots) * self.gathered[k].slot_bytes

    # --- wake-ups (lock held) -------------------------------------------------------------

    def wake_reader(self, run: PassState) -> None:
        """Wake the reader if what it waits for has happened (lock held)."""
        self.reader.wake(run)

    def wake_copier(self, run: PassState) -> None:
        """Wake the copy thread if what it waits for has happened (lock held)."""
        self.copier.wake(run)

    def wake_after_kernel(self, run: PassState) -> None:
        """A kernel started or ended: the reader (and copier) may go (lock held)."""
        self.wake_reader(run)
        if self.device_ring is not None:
            self.wake_copier(run)


__all__ = ["OTHER_PATH", "UnitStream"]
