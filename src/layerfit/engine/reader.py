"""The read stage: the reader thread that reads a pass's streamed units into the ring.

The reader reads units in the prepared order, as the policy's gate and the read buffer
allow (Algorithm 1's read constraints), merging adjacent units into one request where
reads may run ahead (async), and hands each unit to the kernels (or, with a copy stage,
to the copier). It passes over kept units, tables read by rows when they run, and units
the pass is expected to skip; the kernels may rewind it to one of those
(:meth:`~layerfit.engine.kernels.KernelStage.check_order`). It waits on the
:class:`~layerfit.engine.stream.UnitStream`'s ``room`` condition, under the stream's lock.

The stage owns its state for a pass (:meth:`ReadStage.begin_pass` sets it up): its own
epoch, what it waits for, and the units whose layer takes its own place (its thread's
side); and a :class:`ReadUnits`, what it read: where each unit lies in the ring
(``ready``, the stage's output, which the kernels or the copier take), the places of
experts read ahead on a guess, what it adopted of the read-ahead. The other stages change
either only through their methods: the kernels give back what they skip or rewind
(:meth:`ReadUnits.give_back`), the copier what the kernels skipped
(:meth:`ReadUnits.release_skipped`); a layer that takes its own place lets the reader pass over
it (:meth:`ReadStage.pass_over`). It reads the pass's shared
:class:`~layerfit.engine.pass_state.PassState`, which it never writes.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, NamedTuple

from layerfit.engine.expert_places import ExpertPlace, ahead_layout
from layerfit.engine.read_ahead import NextPass, ReadAhead
from layerfit.engine.ring import Cancelled
from layerfit.engine.trace import Event, split_read

if TYPE_CHECKING:
    from layerfit.engine.pass_state import PassState
    from layerfit.engine.stream import UnitStream


#: a part of a unit read as it is handed over: a few of its row steps, one request each
PART_BYTES = 4 << 20


class Claim(NamedTuple):
    """Units ``first..stop-1`` the reader reads next, at ``offset`` of the ring (``nbytes``)."""

    first: int
    stop: int
    offset: int
    nbytes: int


class ReadStage:
    """The reader thread of ``stream``."""

    def __init__(self, stream: UnitStream) -> None:
        self.stream = stream
        self.begin_pass(0, None)

    def begin_pass(self, nblocks: int, ahead: ReadAhead | None) -> None:
        """A pass of ``nblocks`` units begins (before its threads start); ``ahead``: what
        was read for it after the last pass, adopted when it begins as expected."""
        self.output = ReadUnits(self.stream, nblocks, ahead)  # what it reads, the kernels' (or copier's) input
        self.epoch = 0  # the pass's rewind epoch the reader works in
        self.waits = False  # it waits for room or its policy's gate
        self.wants: tuple[int, int, int | None] = (0, 0, None)  # (unit, bytes of room, its place) it waits for
        self.awaits_guess: int | None = None  # the unit whose experts' guess it waits for
        self.not_read: set[int] = set()  # skipped units it passed over (the copier's cue)
        self.placed: set[int] = set()  # units read when they run whose layer took (or takes) its place

    # --- wake-up predicates (lock held) --------------------------------------------------

    def may_go(self, run: PassState, i: int, want: int, place: int | None = None) -> bool:
        """The reader's wake-up predicate for unit ``i`` (lock held); ``place``: the bytes
        it takes in the ring, when not the unit's (a compact place of experts)."""
        stream = self.stream
        if i < run.done or run.epoch != self.epoch:  # skipped, or rewound: go on
            return True
        if not stream.policy.read_may_start(i, run.started, run.done, stream.device.stages):
            return False
        if not stream.ring.fits(stream.blocks[i].nbytes if place is None else place):
            return False
        # Hysteresis: while the kernels have other units to run, wait for room for a
        # whole batch (``want`` bytes) instead of waking for every small unit released.
        # The unit the next kernel needs is read at once, and alone.
        return self.kernel_needs(run, i) or stream.ring.fits(want)

    @staticmethod
    def kernel_needs(run: PassState, i: int) -> bool:
        """Whether the executing thread waits (or will next) for the read of unit ``i``.
        ``main_waits`` is cleared only once that thread runs again, so a unit it waited
        for that has already arrived must not count: on a loaded machine it may not run
        for a while, and meanwhile the reader would read every unit alone."""
        return run.main_waits == i or i == run.started

    def wake(self, run: PassState) -> None:
        """Wake the reader if what it waits for has happened (lock held)."""
        if self.waits and (self.stream.ring.cancelled or self.may_go(run, *self.wants)):
            self.stream.room.notify()

    # --- the thread ----------------------------------------------------------------------

    def loop(self, run: PassState) -> None:
        """Read the pass's units in order, as the policy and the buffer allow."""
        stream = self.stream
        ring, room = stream.ring, stream.room
        # Coalescing and batch-sized wake-ups only where reads may run ahead (async):
        # sequential and sync read each unit as soon as their gate opens, as the paper.
        chunk = min(stream.coalesce_bytes, ring.capacity // 2) if stream.policy.runs_ahead else 0
        i = 0
        try:
            with room:
                while run.begin is None:  # the pass has not run its first unit yet
                    if ring.cancelled:
                        return
                    room.wait()
                i, n = run.begin, run.units.stop
            if self.output.ahead is not None:
                self._settle_read_ahead(run)
            ready = self.output.ready
            while True:
                if run.epoch != self.epoch:  # the kernels ran a unit it passed over
                    with room:
                        self.epoch, i = run.epoch, run.rewind_to
                    continue
                if i >= n:  # all read, but for units it passed over: one may run yet
                    if self._done(run):
                        return
                    continue
                if i in stream.kept or i in run.expect_skipped or ready[i] is not None:  # (read ahead)
                    i += 1
                    continue
                if i in stream.guessed_units:  # routed experts: their guess is read ahead
                    step = self._read_guess(run, i)
                    if step is None:  # cancelled
                        return
                    i = step
                    continue
                if i in stream.gathered:  # read by rows when it runs: wait until they have their place
                    if not self._await_rows_placed(run, i):
                        return
                    i += 1
                    continue
                claim = self._claim(run, i, chunk)
                if claim is None:  # cancelled
                    return
                if isinstance(claim, int):  # go on from there
                    i = claim
                    continue
                if claim.stop == claim.first + 1 and stream.reads_in_parts(claim.first):
                    self._read_in_parts(run, claim)
                    i = claim.stop
                    continue
                t0 = time.perf_counter()
                sizes = stream.units.read_units(claim.first, claim.stop, ring.view[claim.offset :])
                self._deliver(run, claim, t0, time.perf_counter(), sizes)
                i = claim.stop
        except Cancelled:
            return
        except BaseException as exc:  # handed to the executing thread, which raises it
            stream.fail(run, i, exc)

    def _done(self, run: PassState) -> bool:
        """Every unit is read, but for units passed over: wait while one may run yet.
        True when the reader is done; False when it was rewound."""
        room, ring = self.stream.room, self.stream.ring
        with room:
            while run.expect_skipped and run.epoch == self.epoch and not ring.cancelled:
                room.wait()
            return run.epoch == self.epoch

    def _await_rows_placed(self, run: PassState, i: int) -> bool:
        """Wait until the rows of table ``i`` have their place in the ring (or the table
        was skipped, or the reader rewound); False when cancelled."""
        room, ring = self.stream.room, self.stream.ring
        with room:
            while i not in self.placed and i >= run.done and run.epoch == self.epoch:
                if ring.cancelled:
                    return False
                room.wait()
        return True

    def _read_guess(self, run: PassState, i: int) -> int | None:
        """Routed experts unit ``i``: once the experts guessed for it may be read (their
        guess made, and the layer before's own experts read), take a compact place for it
        and read them there (:mod:`layerfit.engine.expert_guess`); the unit to go on from,
        or None when cancelled. Where its layer runs first, it takes its place itself."""
        stream = self.stream
        ring, room, table = stream.ring, stream.room, stream.gathered[i]
        with room:
            while True:
                if ring.cancelled:
                    return None
                if run.epoch != self.epoch:
                    return i  # the loop goes back
                if i < run.done or i in self.placed:  # skipped, or its layer took its place
                    return i + 1
                guess = stream.guesses_made.readable(i)
                if guess is not None:
                    break
                self.awaits_guess = i
                room.wait()
            self.awaits_guess = None
            # The ranks of guesses right often enough (a token's first choice, mostly).
            picked = sorted(e for e, r in zip(guess.experts, guess.ranks, strict=True)
                            if stream.guesses.worth_reading(r))
            layout = ahead_layout(picked, guess.tokens, guess.top_k, table.count)
            nbytes = len(layout) * table.slot_bytes
            if not picked or nbytes > ring.capacity:  # nothing worth it, or no room: its layer places it
                while i not in self.placed and i >= run.done and run.epoch == self.epoch:
                    if ring.cancelled:
                        return None
                    room.wait()
                return i + 1 if run.epoch == self.epoch else i
            while i not in self.placed and not self.may_go(run, i, nbytes, nbytes):
                if ring.cancelled:
                    return None
                self.waits, self.wants = True, (i, nbytes, nbytes)
                room.wait()
            self.waits = False
            if i < run.done or i in self.placed or run.epoch != self.epoch:
                return i
            off = ring.allocate_locked(nbytes)
            self.output.ahead_places[i] = ExpertPlace(off, layout)
        t0, read = time.perf_counter(), 0
        what = f"unit {table.segment.index} ({table.name}), its guessed experts"
        for s, expert in enumerate(layout):
            if expert is None:
                continue
            at = off + s * table.slot_bytes
            read += table.read_slot(stream.units.reader, expert, ring.view[at : at + table.slot_bytes], what)
        t1 = time.perf_counter()
        with room:
            if i < run.done or run.epoch != self.epoch:  # skipped or rewound meanwhile: the oldest bytes
                ring.release_locked(off)
                self.output.ahead_places.pop(i, None)
                self.output.read_for_nothing += read
            else:
                self.output.ready[i] = off
                if stream.trace:
                    self.output.events.append(Event(i, stream.blocks[i].name, "read", t0 - run.t0, t1 - run.t0, read))
            stream.ready.notify()
        return i + 1

    def _claim(self, run: PassState, i: int, chunk: int) -> Claim | int | None:
        """Wait until unit ``i`` may be read and take its room in the ring, with the
        units that join its read. None when cancelled; the unit to go on from instead
        when the kernels skipped ``i`` or the reader was rewound meanwhile."""
        stream = self.stream
        ring, room = stream.ring, stream.room
        first = stream.blocks[i].nbytes
        with room:
            if ring.cancelled:
                return None
            if run.epoch != self.epoch:
                return i
            if i < run.done:  # the kernels skipped it
                self.not_read.update(range(i, run.done))
                if stream.device_ring is not None:
                    stream.copier.wake(run)
                return run.done
            want = self._batch(run, i, chunk)
            while not self.may_go(run, i, want):
                if ring.cancelled:
                    return None
                self.waits, self.wants = True, (i, want, None)
                room.wait()
            self.waits = False
            if i < run.done or run.epoch != self.epoch:
                return i
            if self.kernel_needs(run, i):
                want = first  # read it alone, the kernel waits for it
            off = ring.allocate_locked(first)
            stop, total = self._coalesce(run, i, off, first, want)
        return Claim(i, stop, off, total)

    def _batch(self, run: PassState, i: int, chunk: int) -> int:
        """The bytes of the read the reader waits for room for at unit ``i`` (lock held):
        ``i`` and the units after it that could join its read (streamed, adjacent in the
        file, not read yet), up to ``chunk`` bytes. Not ``chunk`` itself: a unit that no
        other can join, between two kept ones, would wait for room it can never use, and
        with a ring two such units large that room exists only once the ring is empty
        (the reader then idled while the kernels ran each pair of units)."""
        blocks, n = self.stream.blocks, run.units.stop
        total, k = blocks[i].nbytes, i + 1
        while k < n and self._may_join(run, k) and total + blocks[k].nbytes <= chunk:
            total += blocks[k].nbytes
            k += 1
        return total

    def _may_join(self, run: PassState, k: int) -> bool:
        """Whether unit ``k`` may join the read of the unit before it (lock held): it is
        streamed, not read by rows or experts, not expected to be skipped, not read yet."""
        stream = self.stream
        return (
            k not in stream.kept and k not in stream.gathered and k not in run.expect_skipped
            and self.output.ready[k] is None
        )

    def _coalesce(self, run: PassState, i: int, off: int, total: int, want: int) -> tuple[int, int]:
        """The units after ``i`` that join its read while they are allowed to start,
        land right after it in the ring and the read stays within ``want`` bytes (their
        room taken, lock held): the read's end and bytes."""
        stream = self.stream
        ring, blocks, n = stream.ring, stream.blocks, run.units.stop
        stop = i + 1
        while (
            stop < n
            and self._may_join(run, stop)
            and total + blocks[stop].nbytes <= want
            and stream.policy.read_may_start(stop, run.started, run.done, stream.device.stages)
            and ring.next_offset(blocks[stop].nbytes) == off + total
        ):
            ring.allocate_locked(blocks[stop].nbytes)
            total += blocks[stop].nbytes
            stop += 1
        return stop, total

    def _read_in_parts(self, run: PassState, claim: Claim) -> None:
        """Read unit ``claim.first`` part by part (:meth:`~layerfit.engine.stream.UnitStream.reads_in_parts`):
        handed to the kernels after its first part, each later one counted as arrived
        (``ReadUnits.arriving``), which its product waits for. Given back, read for
        nothing, if it was skipped before its first part arrived, or rewound meanwhile."""
        stream, out = self.stream, self.output
        ring, i, off = stream.ring, claim.first, claim.offset
        nbytes, view = stream.units.read_nbytes(i), ring.view[off:]
        t0, start = time.perf_counter(), 0
        while start < nbytes:
            stop = min(nbytes, start + PART_BYTES)
            stream.units.read_part(i, start, stop, view)
            with stream.room:
                if ring.cancelled:  # the pass ended (its executing thread raised): nothing waits
                    out.arriving = None
                    return
                # After its first part, a unit rewound meanwhile was given back to the reader
                # (ReadUnits.give_back); before it, the kernels may have skipped it.
                given_back = out.ready[i] is None if start else (i < run.done or run.epoch != self.epoch)
                if given_back:
                    out.arriving = None  # the oldest bytes
                    ring.release_locked(off)
                    out.read_for_nothing += stop
                    stream.ready.notify_all()
                    return
                out.ready[i] = off
                out.arriving = (i, stop) if stop < nbytes else None
                if out.arriving is None and stream.trace:
                    out.events.append(Event(i, stream.blocks[i].name, "read", t0 - run.t0, time.perf_counter() - run.t0, nbytes))
                stream.ready.notify_all()
            start = stop

    def _deliver(self, run: PassState, claim: Claim, t0: float, t1: float, sizes: list[int]) -> None:
        """The read of ``claim`` ended (``sizes``: the bytes it read of each unit): hand each
        unit to the kernels (or the copier); give back what was skipped or rewound
        meanwhile, the oldest bytes in the ring."""
        with self.stream.room:
            self._deliver_locked(run, claim, t0, t1, sizes)

    def _deliver_locked(self, run: PassState, claim: Claim, t0: float, t1: float, sizes: list[int]) -> None:
        """:meth:`_deliver` with the lock held."""
        stream, out = self.stream, self.output
        ring, blocks = stream.ring, stream.blocks
        i, stop, off, _ = claim
        if run.epoch != self.epoch:  # rewound while it read: the oldest bytes
            for k in range(i, stop):
                ring.release_locked(off + blocks[k].offset - blocks[i].offset)
                out.read_for_nothing += sizes[k - i]
            stream.ready.notify()
            return
        times = split_read(t0, t1, sizes) if stream.trace else None
        for k in range(i, stop):
            # Skipped while it was read: the oldest bytes in the ring (with a copy
            # stage, the copier gives read bytes back, in order).
            if k < run.done and stream.device_ring is None:
                ring.release_locked(off + blocks[k].offset - blocks[i].offset)
                out.read_for_nothing += sizes[k - i]
                stream.ready.notify()  # rows may wait for the room
                continue
            out.ready[k] = off + blocks[k].offset - blocks[i].offset
            if times is not None:
                at, end = times[k - i]
                out.events.append(Event(k, blocks[k].name, "read", at - run.t0, end - run.t0, sizes[k - i]))
        if stream.device_ring is not None:
            stream.copier.wake(run)
        elif run.main_waits is not None and run.main_waits < stop:
            stream.ready.notify()

    # --- what was read ahead for the pass (:mod:`layerfit.engine.read_ahead`) -------------

    def _settle_read_ahead(self, run: PassState) -> None:
        """The reader's first step in a pass given a read-ahead: wait for its read under
        way, then hand those units to the kernels (read again if the read failed), or
        give them back (:meth:`~layerfit.engine.read_ahead.ReadAhead.settle_late`)."""
        stream = self.stream
        ahead, ring = self.output.ahead, stream.ring
        ahead.join()
        with stream.room:
            late, lost = ahead.settle_late(ring, stream.blocks)
            for k in lost:
                self.output.read_for_nothing += stream.blocks[k].nbytes
            if late is None:
                stream.ready.notify()  # rows may wait for the room given back
                return
            units, off, total, times = late
            claim = Claim(units[0], units[-1] + 1, off, total)
            if times is not None:
                self.output.read_ahead_bytes += sum(times[2])
                self._deliver_locked(run, claim, *times)
                return
        t0 = time.perf_counter()  # it failed: read again, into its place
        sizes = stream.units.read_units(claim.first, claim.stop, ring.view[off:])
        t1 = time.perf_counter()
        with stream.room:
            if ahead.keeps(claim.first):
                self._deliver_locked(run, claim, t0, t1, sizes)
            else:
                ahead.release_failed(ring, stream.blocks)
                stream.ready.notify()

    # --- what the other stages ask of it (lock held) --------------------------------------

    def pass_over(self, i: int) -> None:
        """Unit ``i``'s layer takes its own place in the ring (rows, or experts not read
        ahead): the reader goes on past it (the caller wakes it)."""
        self.placed.add(i)

    def guess_made(self, unit: int) -> None:
        """The experts of ``unit`` were guessed: wake the reader if it waits for that."""
        if self.awaits_guess == unit:
            self.stream.room.notify()

    def layer_read(self, i: int) -> None:
        """MoE layer ``i`` read its own experts: wake the reader if the guess it waits
        to read was held until then."""
        if self.awaits_guess is not None:
            held = self.stream.guesses_made.guessed.get(self.awaits_guess)
            if held is not None and held.hold == i:
                self.stream.room.notify()


class ReadUnits:
    """What the reader read for one pass: where each unit lies in the ring (``ready``,
    the read stage's output, which the kernels or the copier take), the compact places
    it read guessed experts into, what it adopted of the read-ahead, and the bytes read
    for nothing. The reader thread fills it; the other stages give back through its
    methods (lock held), never by writing it."""

    def __init__(self, stream: UnitStream, nblocks: int, ahead: ReadAhead | None) -> None:
        self.stream = stream
        self.ready: list[int | None] = [None] * nblocks  # ring offset per unit read
        self.ahead_places: dict[int, ExpertPlace] = {}  # the compact place a guess was read into
        self.ahead = ahead  # what was read for the pass after the last one
        self.reserved: dict[int, tuple[int, int]] = {}  # rows' places reserved by the read-ahead
        self.read_ahead_bytes = 0  # bytes of the units adopted from the read-ahead
        self.read_for_nothing = 0  # bytes read that no kernel used (skipped, rewound, given back)
        self.events: list[Event] = []  # the reads, when tracing
        self.arriving: tuple[int, int] | None = None  # (unit, bytes read) handed over before its read ended

    def arriving_unit(self) -> int | None:
        """The unit handed to the kernels while it is still being read, if any (lock held)."""
        return None if self.arriving is None else self.arriving[0]

    def has_arrived(self, i: int, nbytes: int) -> bool:
        """Whether the first ``nbytes`` of unit ``i``, handed over, have been read (lock held)."""
        return self.arriving is None or self.arriving[0] != i or self.arriving[1] >= nbytes

    def adopt(self, run: PassState) -> None:
        """The pass began (lock held, the kernels at its first unit): what was read ahead
        for it, if anything, is ready for the kernels and the rows' places reserved, when
        it began as expected; else what was read is given back, read for nothing. A read
        under way is settled by the reader's first step (:meth:`ReadStage._settle_read_ahead`)."""
        ahead, blocks = self.ahead, self.stream.blocks
        if ahead is None:
            return
        began = NextPass(run.units, run.begin, frozenset(run.expect_skipped))
        lost = ahead.adopt(began, self.stream.ring)
        if ahead.adopted is None:
            for k in lost:
                self.read_for_nothing += blocks[k].nbytes
            return
        self.reserved = dict(ahead.reserved)
        for k in ahead.adopted:
            self.ready[k] = ahead.read[k]
            t0, t1, nbytes = ahead.times[k]
            self.read_ahead_bytes += nbytes
            if self.stream.trace:
                self.events.append(Event(k, blocks[k].name, "read", t0 - run.t0, t1 - run.t0, nbytes))

    def take_reserved(self, run: PassState, i: int, nbytes: int) -> int | None:
        """The place the read-ahead reserved for unit ``i``'s rows, if it holds ``nbytes``
        (lock held); else None, and what was read ahead after it is given back, oldest
        first, for the reader to read again in its turn."""
        reserved = self.reserved.pop(i, None)
        if reserved is None:
            return None
        if nbytes <= reserved[1]:
            return reserved[0]
        blocks = self.stream.blocks
        for k in self.ahead.give_back_from(i, run.units.stop, self.stream.ring):
            self.ready[k] = None
            self.read_for_nothing += blocks[k].nbytes
        self.reserved = {k: r for k, r in self.reserved.items() if k < i}
        return None

    def join_ahead(self) -> None:
        """Wait for the read-ahead's read under way (a pass that never began did not)."""
        if self.ahead is not None:
            self.ahead.join()

    def give_back(self, units: range) -> None:
        """The kernels skipped ``units`` (two stages), or rewound the reader to the unit
        before them: what was read of them goes back, the oldest bytes in the ring, read
        for nothing, and the rows' places reserved among them. A read under way is given
        back by the reader when it ends."""
        ring, blocks, ready = self.stream.ring, self.stream.blocks, self.ready
        for k in units:
            if ready[k] is not None and self.arriving_unit() == k:  # still read: the reader gives it back
                ready[k] = None
            elif ready[k] is not None:  # ready for the kernels: the oldest bytes in the ring
                ring.release_locked(ready[k])
                ready[k] = None
                place = self.ahead_places.pop(k, None)  # (experts read into a compact place: its bytes)
                self.read_for_nothing += blocks[k].nbytes if place is None else self.place_bytes(k, place)
            elif k in self.reserved:  # rows' place reserved ahead, in its turn
                ring.release_locked(self.reserved.pop(k)[0])

    def release_skipped(self, j: int) -> bool:
        """The copier gives back what was read of unit ``j``, which the kernels skipped,
        in order; whether anything was read of it."""
        if self.ready[j] is None:
            return False
        self.stream.ring.release_locked(self.ready[j])
        self.ready[j] = None
        self.read_for_nothing += self.stream.blocks[j].nbytes
        return True

    def unrun(self, units: range) -> None:
        """The pass ended before ``units``: what was read of them was read for nothing."""
        for k in units:
            if self.ready[k] is not None:
                self.read_for_nothing += self.stream.blocks[k].nbytes

    def guessed_place(self, i: int) -> ExpertPlace | None:
        """The compact place the reader took to read unit ``i``'s guessed experts into."""
        return self.ahead_places.get(i)

    def take_guessed_place(self, i: int) -> ExpertPlace:
        """Unit ``i``'s layer binds the place its guess was read into: no longer the reader's."""
        return self.ahead_places.pop(i)

    def place_bytes(self, k: int, place: ExpertPlace) -> int:
        """The bytes read into unit ``k``'s compact place (its experts' slots)."""
        return sum(e is not None for e in place.slots) * self.stream.gathered[k].slot_bytes


__all__ = ["Claim", "ReadStage", "ReadUnits"]
