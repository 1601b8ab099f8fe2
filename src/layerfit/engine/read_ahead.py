"""Reading the next pass's first units while the caller works between two passes.

A generation loop calls the engine once per token, and between two calls the reader has
nothing to do: the caller picks the token, a draft model proposes the next ones, the
server answers. Two passes of one configuration read the same units in the same order,
so when a streamed pass ends the engine may go on reading the next one's first units
into the read buffer, as far as the buffer has room (Demand Layering's reader runs ahead
the same way within a pass); ``EngineConfig.read_ahead`` turns it on. It starts before
the pass ends where it can: once the pass's last unit not kept has given its place back
and the buffer is empty, while the kept units after it (a decoder's head) still run
(:meth:`~layerfit.engine.stream.UnitStream.read_next_early`). The next pass
adopts them when it begins as expected (the same units, from the same first unit,
expecting the same skips as the passes that followed such a pass most often); otherwise
it gives them back, read for nothing. The buffer is the one a pass uses, laid out as
that pass would lay it out, so the budget holds exactly as before.

An embedding read by rows depends on ids not known yet, so its place is reserved in its
turn: room for :data:`RESERVED_ROWS` distinct rows, or for the most its lookups took
(but the scan that verifies it) if that was more. A lookup that needs more still (a
longer prompt, the scan that verifies the table) gives back what was read ahead after
it and takes the buffer as it does without a read-ahead. Routed experts stop the
read-ahead, since what they read depends on the router, and a copy stage (three
stages) does not read ahead.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from layerfit.engine.gather import RowTable
from layerfit.engine.ring import RingBuffer
from layerfit.engine.trace import split_read
from layerfit.engine.unit_reader import UnitReader
from layerfit.engine.units import Block
from layerfit.store.manifest import ALIGN

Start = tuple[int, int, int]
"""How a pass began: its units' start and stop, and the first unit it ran."""

RESERVED_ROWS = 16
"""Distinct ids a decoding step's embedding lookup may have without losing the
read-ahead: one token, a few sequences of a batch, or a draft's proposals and the
token before them."""


def reserved_room(table: RowTable) -> int:
    """The room reserved for ``table``'s rows in the next pass: :data:`RESERVED_ROWS`
    rows, rounded to pages, and the pages they are read from, one by one at worst."""
    rows = -(-(RESERVED_ROWS * table.row_bytes) // ALIGN) * ALIGN
    return rows + rows + 2 * ALIGN


@dataclass(frozen=True)
class NextPass:
    """What the next pass is expected to be: its units, the first it runs, the units it
    is expected to skip (the reader does not read those)."""

    units: range
    begin: int
    skipped: frozenset[int]


@dataclass
class ReadAhead:
    """The units read for the next pass, where they are in the read buffer, and when.

    ``allocations`` lists the buffer's allocations oldest first as ``(offset, unit)``:
    each unit read, and each reserved place of rows (``reserved``), in the pass's order.
    ``pending`` is the read under way when the pass began (``(units, offset, bytes)``);
    it stays there when it failed (``failed``), for the pass's reader to read again.
    """

    expected: NextPass
    allocations: list[tuple[int, int]] = field(default_factory=list)
    read: dict[int, int] = field(default_factory=dict)  # unit -> offset of its bytes
    reserved: dict[int, tuple[int, int]] = field(default_factory=dict)  # unit -> (offset, room)
    times: dict[int, tuple[float, float, int]] = field(default_factory=dict)  # unit -> read t0, t1, bytes
    pending: tuple[list[int], int, int] | None = None
    failed: BaseException | None = None
    adopted: frozenset[int] | None = None  # the units read when the pass adopted it (None: not adopted)
    given_back_from: int | None = None  # units from here on were given back (rows needed more room)
    _stop: bool = False
    _thread: threading.Thread | None = None

    def join(self) -> None:
        """Wait until its read under way has ended (it reads nothing more once stopped)."""
        if self._thread is not None:
            self._thread.join()

    # --- the pass's reader's side (the stream's lock held) --------------------------------

    def adopt(self, began: NextPass, ring: RingBuffer) -> list[int]:
        """The pass began as ``began``: when as expected, what was read is the pass's
        (``adopted``; the reader hands it to the kernels) and nothing is lost; else it is
        given back, and the units read of it are returned (read for nothing). A read
        under way is the pass's reader's to settle (:meth:`settle_late`)."""
        if began != self.expected:
            return give_back(self, ring)
        self.adopted = frozenset(self.read)
        return []

    def keeps(self, unit: int) -> bool:
        """Whether the pass keeps what was read ahead from ``unit`` on."""
        return self.adopted is not None and (self.given_back_from is None or unit < self.given_back_from)

    def give_back_from(self, start: int, stop: int, ring: RingBuffer) -> list[int]:
        """Give back what was read for units ``start..stop-1``, oldest first, for the
        pass's reader to read again in their turn (rows at ``start`` need more than their
        room); the units read of them."""
        lost = give_back(self, ring, range(start, stop))
        self.given_back_from = start  # and a read under way, once it ends
        return lost

    def settle_late(self, ring: RingBuffer, blocks: Sequence[Block]) -> tuple[tuple | None, list[int]]:
        """After :meth:`join`: what the read under way when the pass began comes to, and
        the units given back of it (read for nothing). None when the pass does not keep
        it; else ``(units, offset, bytes, times)`` for the pass's reader to hand to the
        kernels, ``times`` (the read's start and end, the bytes it read of each unit) None
        when the read failed and must be made again into its place."""
        if self.pending is not None:  # it failed
            units, off, total = self.pending
            if self.keeps(units[0]):
                return (units, off, total, None), []
            self.release_failed(ring, blocks)
            return None, []
        units = sorted(k for k in self.read if self.adopted is None or k not in self.adopted)
        if not units:
            return None, []
        if not self.keeps(units[0]):
            return None, give_back(self, ring, range(units[0], units[-1] + 1))
        total = sum(blocks[k].nbytes for k in units)
        sizes = [self.times[k][2] for k in units]  # the bytes read of each
        return (units, self.read[units[0]], total, (self.times[units[0]][0], self.times[units[-1]][1], sizes)), []

    def release_failed(self, ring: RingBuffer, blocks: Sequence[Block]) -> None:
        """Give back the place of the failed read, unit by unit."""
        units, off, _ = self.pending
        for k in units:
            ring.release_locked(off + blocks[k].offset - blocks[units[0]].offset)


class ReadAheadReader:
    """Starts and stops an engine's read-ahead (at most one), and learns what to expect:
    which pass follows which, and how much room each table's rows take."""

    def __init__(self, lock: threading.Condition, units: UnitReader) -> None:
        self.lock = lock  # on the stream's lock, under which the buffer is allocated; notified as room is given back
        self.units = units
        self.current: ReadAhead | None = None
        # How often a pass that began so was followed by one that began so: the next pass
        # is expected to begin as the most frequent (an encoder's pass, then steps, ...).
        self.successors: dict[Start, Counter[Start]] = {}
        self.rows_rooms: dict[int, int] = {}  # the most room each table's rows took

    def forget(self) -> None:
        """A new configuration: its units are numbered otherwise."""
        self.successors, self.rows_rooms = {}, {}

    def followed(self, before: Start | None, start: Start) -> None:
        """A pass began as ``start`` after one that began as ``before``."""
        if before is not None:
            self.successors.setdefault(before, Counter())[start] += 1

    def after(self, start: Start) -> Start:
        """How the pass after one that began as ``start`` is expected to begin."""
        following = self.successors.get(start)
        return following.most_common(1)[0][0] if following else start

    def took(self, unit: int, nbytes: int) -> None:
        """Table ``unit``'s rows took ``nbytes`` of room (not a scan that verifies it)."""
        self.rows_rooms[unit] = max(nbytes, self.rows_rooms.get(unit, 0))

    def start(
        self,
        expected: NextPass,
        ring: RingBuffer,
        blocks: Sequence[Block],
        kept: frozenset[int],
        tables: dict[int, object],
        chunk: int,
    ) -> None:
        """Read ``expected``'s first units into the empty ``ring``, in their order, as far as
        it has room and no routed experts come first; a read merges adjacent units up to
        ``chunk`` bytes. Returns at once: a thread reads."""
        ahead = ReadAhead(expected)
        plan: list[int | tuple[int, int]] = []  # units to read, and (table, room) to reserve
        room = ring.capacity
        for k in range(expected.begin, expected.units.stop) if expected.begin in expected.units else ():
            if k in kept or k in expected.skipped:
                continue
            table = tables.get(k)
            if table is not None and not isinstance(table, RowTable):
                break  # routed experts: what they read depends on the router
            size = blocks[k].nbytes if table is None else max(reserved_room(table), self.rows_rooms.get(k, 0))
            if size > room:
                break
            room -= size
            plan.append((k, size) if table is not None else k)
        if not any(isinstance(p, int) for p in plan):
            return  # nothing to read: every unit kept, or the first ones do not fit
        ahead._thread = threading.Thread(
            target=self._loop, args=(ahead, plan, ring, blocks, chunk), name="layerfit-read-ahead", daemon=True
        )
        self.current = ahead
        ahead._thread.start()

    def _loop(self, ahead: ReadAhead, plan: list, ring: RingBuffer, blocks: Sequence[Block], chunk: int) -> None:
        """Reserve and read ``plan`` in order until stopped; a read merges units adjacent
        in the file and in the buffer."""
        j = 0
        while j < len(plan):
            with self.lock:
                if ahead._stop:
                    return
                if isinstance(plan[j], tuple):  # a place of rows: reserved, not read
                    k, size = plan[j]
                    off = self._room(ahead, ring, size)
                    if off is None:
                        return
                    ahead.reserved[k] = (off, size)
                    ahead.allocations.append((off, k))
                    j += 1
                    continue
                first = plan[j]
                off = self._room(ahead, ring, blocks[first].nbytes)
                if off is None:
                    return
                total, stop = blocks[first].nbytes, j + 1
                while (
                    stop < len(plan)
                    and isinstance(plan[stop], int)
                    and plan[stop] == plan[stop - 1] + 1
                    and total + blocks[plan[stop]].nbytes <= chunk
                    and ring.next_offset(blocks[plan[stop]].nbytes) == off + total
                ):
                    ring.allocate_locked(blocks[plan[stop]].nbytes)
                    total += blocks[plan[stop]].nbytes
                    stop += 1
                units = plan[j:stop]
                ahead.pending = (units, off, total)
            t0 = time.perf_counter()
            try:
                sizes = self.units.read_units(units[0], units[-1] + 1, ring.view[off:])
            except BaseException as exc:  # the pass reads it again, and reports what fails then
                with self.lock:
                    ahead.failed = exc
                return
            t1 = time.perf_counter()
            times = split_read(t0, t1, sizes)
            with self.lock:
                ahead.pending = None
                for k, (at, end), nbytes in zip(units, times, sizes, strict=True):
                    place = off + blocks[k].offset - blocks[units[0]].offset
                    ahead.read[k] = place
                    ahead.allocations.append((place, k))
                    ahead.times[k] = (at, end, nbytes)
            j = stop

    def _room(self, ahead: ReadAhead, ring: RingBuffer, nbytes: int) -> int | None:
        """Where ``nbytes`` are placed in the buffer (lock held): at once when the pass has
        given its place back, else once the pass's last unit has given back enough of it as
        its rows were used (:meth:`~layerfit.engine.stream.UnitStream.release_rows_as_used`);
        None when stopped meanwhile."""
        while not ahead._stop:
            off = ring.allocate_locked(nbytes)
            if off is not None:
                return off
            self.lock.wait()
        return None

    def take(self) -> ReadAhead | None:
        """Stop the read-ahead and hand it over: it reads nothing more, but a read under
        way goes on (:meth:`ReadAhead.join` waits for it). None when none ran."""
        ahead, self.current = self.current, None
        if ahead is not None:
            with self.lock:
                ahead._stop = True
                self.lock.notify_all()  # it may wait for room
        return ahead


def give_back(ahead: ReadAhead, ring: RingBuffer, units: range | None = None) -> list[int]:
    """Give the buffer back of every unit read and place reserved by ``ahead`` (those in
    ``units`` only, when given), oldest first (lock held); the units read of them. Not a
    read under way: it is given back once it ends."""
    lost = []
    keep = []
    for off, k in ahead.allocations:
        if units is not None and k not in units:
            keep.append((off, k))
            continue
        ring.release_locked(off)
        if ahead.read.pop(k, None) is not None:
            lost.append(k)
        ahead.reserved.pop(k, None)
    ahead.allocations = keep
    return lost


__all__ = ["RESERVED_ROWS", "NextPass", "ReadAhead", "ReadAheadReader", "Start", "give_back", "reserved_room"]
