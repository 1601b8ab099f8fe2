"""The state of one pass (one inference) shared by the executing, reader and copy threads.

A :class:`PassState` is created for each pass and owned by the
:class:`~layerfit.engine.stream.UnitStream` while the pass runs; every field is read and
written under the stream's lock.
"""

from __future__ import annotations

import time

from layerfit.engine.expert_guess import Guessed
from layerfit.engine.expert_places import ExpertPlace
from layerfit.engine.read_ahead import ReadAhead
from layerfit.engine.source import UnitSource
from layerfit.engine.trace import Event


class PassState:
    """Where one pass stands: which units are read, copied, bound, running and done."""

    def __init__(self, nblocks: int, units: range | None = None) -> None:
        # The units this pass may run (all, or one part's). A pass begins at the first
        # unit it runs: units before it are not read (a decoder step given the encoder's
        # output runs none of the encoder's), and runs each after it, in order.
        self.units = range(nblocks) if units is None else units
        self.begin: int | None = None  # set by the first unit that runs
        self.skipped_units: set[int] = set()  # units after it that did not run (the next such pass expects them)
        self.read_for_nothing = 0  # bytes the reader read of them, or read ahead and discarded
        # Units the reader does not read, expecting the pass to skip them as the last did;
        # one that runs after all rewinds the reader to it (a new epoch).
        self.expect_skipped: set[int] = set()
        self.not_read: set[int] = set()  # skipped units the reader passed over (the copier's cue)
        self.epoch = 0
        self.reader_epoch = 0  # the epoch the reader works in
        self.rewind_to = 0
        self.ready: list[int | None] = [None] * nblocks  # read buffer offset per unit
        self.on_device: list[int | None] = [None] * nblocks  # device buffer offset (copy stage)
        self.started = 0
        self.done = 0
        self.error: tuple[int, BaseException] | None = None
        self.bound: dict[int, int] = {}  # block index -> ring offset
        self.t0 = time.perf_counter()
        self.events: list[Event] = []
        self.kernel_start: dict[int, float] = {}
        self.source: UnitSource | None = None  # supplies the units instead of the reader thread
        self.ordered = True  # units must run once each, in the prepared order (all but plain preload)
        self.main_waits: int | None = None  # the unit the executing thread waits for
        self.reader_waits = False  # the reader waits for room or its policy's gate
        self.reader_wants: tuple[int, int, int | None] = (0, 0, None)  # (unit, bytes of room, its place) it waits for
        self.copier_waits: int | None = None  # the unit the copy thread waits to copy
        self.gathered: dict[int, int | None] = {}  # embeddings bound to rows -> their padding_idx
        self.placed: set[int] = set()  # embeddings whose rows have their place in the ring
        # Read for this pass after the last one ended (:mod:`layerfit.engine.read_ahead`):
        # adopted when the pass begins as expected, else given back.
        self.ahead: ReadAhead | None = None
        self.reserved: dict[int, tuple[int, int]] = {}  # embeddings -> (offset, room) reserved for their rows
        self.read_ahead_bytes = 0  # bytes of the units it adopted
        self.last_unkept: int | None = None  # its last unit not kept (the read-ahead may start once it ends)
        self.learned = False  # how it began and what it skipped are remembered (UnitStream._learn)
        # Routed experts (:mod:`layerfit.engine.expert_guess`): the guess made for a unit,
        # the compact place the reader took and read it into, the units whose own experts
        # are read (a guess held for one is read then), and the unit whose guess the
        # reader waits for.
        self.guessed: dict[int, Guessed] = {}
        self.ahead_places: dict[int, ExpertPlace] = {}
        self.experts_done: set[int] = set()
        self.reader_awaits_guess: int | None = None

    def now(self) -> float:
        """Seconds since the pass began (the timeline's clock)."""
        return time.perf_counter() - self.t0


__all__ = ["PassState"]
