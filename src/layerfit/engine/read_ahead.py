"""Reading the next pass's first units while the caller works between two passes.

A generation loop calls the engine once per token, and between two calls the reader has
nothing to do: the caller picks the token, a draft model proposes the next ones, the
server answers. Two passes of one configuration read the same units in the same order,
so when a streamed pass ends the engine may go on reading the next one's first units
into the read buffer, as far as the buffer has room (Demand Layering's reader runs ahead
the same way within a pass); ``EngineConfig.read_ahead`` turns it on. The next pass
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
from collections.abc import Sequence
from dataclasses import dataclass, field

from layerfit.engine.gather import RowTable
from layerfit.engine.ring import RingBuffer
from layerfit.engine.unit_reader import UnitReader
from layerfit.engine.units import Block
from layerfit.store.manifest import ALIGN

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


class ReadAheadReader:
    """Starts and stops an engine's read-ahead; holds at most one."""

    def __init__(self, lock: threading.Lock, units: UnitReader) -> None:
        self.lock = lock  # the stream's lock, under which the buffer is allocated
        self.units = units
        self.current: ReadAhead | None = None

    def start(
        self,
        expected: NextPass,
        ring: RingBuffer,
        blocks: Sequence[Block],
        kept: frozenset[int],
        tables: dict[int, object],
        chunk: int,
        rooms_taken: dict[int, int],
    ) -> None:
        """Read ``expected``'s first units into the empty ``ring``, in their order, as far as
        it has room and no routed experts come first; a read merges adjacent units up to
        ``chunk`` bytes. ``rooms_taken``: the most room each table's rows took. Returns at once: a thread reads."""
        ahead = ReadAhead(expected)
        plan: list[int | tuple[int, int]] = []  # units to read, and (table, room) to reserve
        room = ring.capacity
        for k in expected.units[expected.units.index(expected.begin):] if expected.begin in expected.units else ():
            if k in kept or k in expected.skipped:
                continue
            table = tables.get(k)
            if table is not None and not isinstance(table, RowTable):
                break  # routed experts: what they read depends on the router
            size = blocks[k].nbytes if table is None else max(reserved_room(table), rooms_taken.get(k, 0))
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
                    off = ring.allocate_locked(size)
                    ahead.reserved[k] = (off, size)
                    ahead.allocations.append((off, k))
                    j += 1
                    continue
                first = plan[j]
                off = ring.allocate_locked(blocks[first].nbytes)
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
                self.units.read_units(units[0], units[-1] + 1, ring.view[off:])
            except BaseException as exc:  # the pass reads it again, and reports what fails then
                with self.lock:
                    ahead.failed = exc
                return
            t1 = time.perf_counter()
            with self.lock:
                ahead.pending = None
                at = t0  # a merged read is shown split by bytes, as the pass's reader shows it
                for k in units:
                    place = off + blocks[k].offset - blocks[units[0]].offset
                    ahead.read[k] = place
                    ahead.allocations.append((place, k))
                    end = t1 if k == units[-1] else at + (t1 - t0) * blocks[k].nbytes / total
                    ahead.times[k] = (at, end, blocks[k].nbytes)
                    at = end
            j = stop

    def take(self) -> ReadAhead | None:
        """Stop the read-ahead and hand it over: it reads nothing more, but a read under
        way goes on (:meth:`ReadAhead.join` waits for it). None when none ran."""
        ahead, self.current = self.current, None
        if ahead is not None:
            with self.lock:
                ahead._stop = True
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


__all__ = ["RESERVED_ROWS", "NextPass", "ReadAhead", "ReadAheadReader", "give_back", "reserved_room"]
