"""What the stages of one pass (one inference) share: where the kernels stand, and a failure.

Each stage owns its own state for a pass and changes another's only through its methods:
the reader (:class:`~layerfit.engine.reader.ReadStage`: where each unit read lies, what
it adopted of the read-ahead, what it waits for), the copier
(:class:`~layerfit.engine.copier.CopyStage`: where each unit copied lies), the kernels
(:class:`~layerfit.engine.kernels.KernelStage`: what is bound, when each kernel started,
what was skipped) and the experts' guesses (:class:`~layerfit.engine.expert_guess.PassGuesses`).
A :class:`PassState` holds only what several of them read, each field with one writer:

================ ========================================== =================================
field            what                                       written by
================ ========================================== =================================
units            the units the pass may run                 its creator (``Engine.run_pass``)
source           the unit source, if one supplies them      its creator
ordered          units run once each, in order              its creator
t0               when it began (the timeline's clock)       its creator
begin            the first unit it ran                      the kernel stage (``kernels.py``)
started          kernels started (one past the last)        the kernel stage
done             kernels done (one past the last)           the kernel stage
epoch            times a unit passed over rewound reads     the kernel stage
rewind_to        the unit the reader goes back to           the kernel stage
expect_skipped   units the reader does not read             the kernel stage
main_waits       the unit the executing thread waits for    the kernel stage
gathered         units bound to rows or experts -> what     the kernel stage
                 their table restores after the pass
error            a reader or copy thread's failure          the stream (``UnitStream.fail``)
================ ========================================== =================================

"Its creator" sets a field once, when the pass is made; the others are written after
that by the one module named, always under the stream's lock (``tests/engine/
test_pass_state.py`` checks both). The readers: the reader thread reads where the
kernels stand (its gates, its rewinds, the skips it expects); the copy thread reads
``started``, ``done``, ``main_waits`` and ``gathered``; the executing thread reads
``error`` while it waits.
"""

from __future__ import annotations

import time

from layerfit.engine.source import UnitSource


class PassState:
    """Where one pass stands, as its stages share it; see the module docstring."""

    def __init__(self, nblocks: int, units: range | None = None, source: UnitSource | None = None,
                 ordered: bool = True) -> None:
        # Set once here. The units this pass may run (all, or one part's): a pass begins
        # at the first unit it runs (a decoder step given the encoder's output runs none
        # of the encoder's), and runs each after it, in order, but for those it skips.
        self.units = range(nblocks) if units is None else units
        self.source = source  # supplies the units instead of the reader thread
        self.ordered = ordered  # units must run once each, in the prepared order (all but plain preload)
        self.t0 = time.perf_counter()
        # Written by the kernel stage alone (layerfit.engine.kernels).
        self.begin: int | None = 0 if source is not None else None  # set by the first unit that runs
        self.started = 0
        self.done = 0
        # A unit the reader passed over, expecting it skipped, runs after all: the reader
        # goes back to it (a new epoch).
        self.epoch = 0
        self.rewind_to = 0
        self.expect_skipped: set[int] = set()
        self.main_waits: int | None = None  # the unit the executing thread waits for
        self.gathered: dict[int, object] = {}  # bound to rows or experts -> what their table restores
        # Written by the stream alone (UnitStream.fail).
        self.error: tuple[int, BaseException] | None = None

    def now(self) -> float:
        """Seconds since the pass began (the timeline's clock)."""
        return time.perf_counter() - self.t0


__all__ = ["PassState"]
