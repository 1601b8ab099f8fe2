"""The streaming state machine: a pass's stages, their threads, and what passes taught it.

During a pass the reader thread (:mod:`layerfit.engine.reader`) reads units in order as
the policy and the read buffer allow; with a copy stage (three stages) the copy thread
(:mod:`layerfit.engine.copier`) moves each read unit into the device buffer. The
executing thread (the model's forward, through the hooks of
:mod:`layerfit.engine.hooks`) asks the kernel stage (:mod:`layerfit.engine.kernels`) to
wait for each unit, bind it, and give its buffer back once it ran. Each stage owns its
state for the pass and changes another's only through its methods; what they share is
the small :class:`~layerfit.engine.pass_state.PassState` (where the kernels stand, the
reader's failure), each field with one writer. One lock guards them all, with a
condition per waiter: the reader waits on ``room``, the executing thread on ``ready``,
the copy thread on ``copyable``; each is woken only when what it waits for has happened.
Nothing spins. The stream holds the configuration the stages read (policy, units, kept
units, tables read when they run), starts and ends a pass (:meth:`UnitStream.begin_pass`,
:meth:`UnitStream.end_pass`), and learns from each pass what the next will skip.

A pass begins at the first unit it runs and may skip units (a cached decoder step skips
its cross-attention projections): what was read of them is given back, oldest first,
and the next such pass does not read them; a unit that runs after all rewinds the reader.
When a pass has read its last unit and given it back, the next one's first units are read
ahead (:mod:`layerfit.engine.read_ahead`); when that last unit is one weight multiplied by
rows (:class:`~layerfit.engine.int4_packed.BlockRows`, or a Q6_K weight's stripes,
:class:`~layerfit.engine.q6k_packed.Q6KStripes`), it gives its place back page by
page as its product uses its rows, and the read-ahead reads into them meanwhile
(:meth:`UnitStream.release_rows_as_used`). Such a unit is also handed to the kernels as it
is read, once verified: its product runs on the rows that have arrived while the rest is
read (:meth:`UnitStream.compute_rows_as_read`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence

from layerfit.engine.binding import Binder
from layerfit.engine.buffers import WeightBuffers
from layerfit.engine.copier import CopyStage
from layerfit.engine.device import Device
from layerfit.engine.expert_cache import ExpertCache
from layerfit.engine.expert_guess import ExpertMemory, GuessCount, PassGuesses
from layerfit.engine.experts import ExpertTable
from layerfit.engine.gather import RowTable
from layerfit.engine.int4_packed import ROWS_OPERANDS, BlockRows, streams_as_rows
from layerfit.engine.kernels import KernelStage, raise_failure
from layerfit.engine.pass_state import PassState
from layerfit.engine.policies import Policy
from layerfit.engine.q6k_packed import Q6KStripes
from layerfit.engine.read_ahead import NextPass, ReadAhead, ReadAheadReader, Start
from layerfit.engine.reader import ReadStage
from layerfit.engine.ring import RingBuffer
from layerfit.engine.skeleton import Binding, unbind
from layerfit.engine.trace import Event
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
    """Streams the units of one configuration through the buffers: holds what the stages
    read of the configuration, the stages themselves, the pass under way (``run``) and
    what passes taught it."""

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
        self.read_ahead_on = read_ahead
        self.read_ahead = ReadAheadReader(self.room, units)
        # The stages, each with its own state for the pass under way.
        self.reader = ReadStage(self)
        self.copier = CopyStage(self)
        self.kernels = KernelStage(self)
        self.guesses_made = PassGuesses()  # the experts' guesses made in the pass, and layers read
        self.last_unkept: int | None = None  # the pass's last unit not kept (the read-ahead may start once it ends)
        self.releasing: int | None = None  # that unit, while it gives its place back as its rows are used
        self.rows_arrive: int | None = None  # the pass's last streamed unit, if multiplied by rows as they are read
        self.learned = False  # how the pass began and what it skipped are remembered (_learn)

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

    def unconfigure(self, unbind_all: bool) -> None:
        """Forget the configuration: stop the read-ahead (the buffer takes its next shape)
        and unbind what stays bound between passes, the kept units (every unit, when
        ``unbind_all``: preload)."""
        self.drop_read_ahead()
        self.expert_cache = None
        # (bound by the buffers for good, not by the binder: see WeightBuffers.keep)
        if unbind_all:
            for unit in self.bindings:
                unbind(unit)
        for i in self.kept:
            unbind(self.bindings[i])
        self.kept, self.gathered = frozenset(), {}

    @property
    def kept_units(self) -> tuple[int, ...]:
        """The units kept resident beside the buffer, in order."""
        return tuple(sorted(self.kept))

    @property
    def rows_units(self) -> tuple[int, ...]:
        """The units read by the rows or experts they use when they run, in order."""
        return tuple(sorted(self.gathered))

    def guess_counts(self) -> dict[str, int]:
        """The routed units whose experts are guessed and read ahead, the experts so
        read over this configuration, and how many of them their layer chose."""
        return {"units": len(self.guessed_units), "read_ahead": self.guesses.read, "chosen": self.guesses.chosen}

    @property
    def ring(self) -> RingBuffer | None:
        return self.buffers.ring

    @property
    def device_ring(self) -> RingBuffer | None:
        return self.buffers.device_ring

    # --- a pass ----------------------------------------------------------------------------

    def begin_pass(self, run: PassState, ahead: ReadAhead | None, streaming: bool) -> list[threading.Thread]:
        """``run`` begins: each stage's state is set up for it, and when ``streaming`` its
        reader (and copy) thread started; ``ahead``: what was read for it after the last
        pass (``read_ahead.take()``), adopted when it begins as expected (else, once its
        read under way ended, the buffer starts afresh)."""
        kept_ahead = None
        if streaming:
            if ahead is not None and self.device_ring is None:
                self.ring.restart_ledger()  # it holds what was read ahead, and nothing else
                kept_ahead = ahead
            else:
                if ahead is not None:
                    ahead.join()
                self.ring.reset()
        nblocks = len(self.blocks)
        self.reader.begin_pass(nblocks, kept_ahead)
        self.copier.begin_pass(nblocks)
        self.kernels.begin_pass()
        self.guesses_made = PassGuesses()
        self.learned = False
        self.last_unkept = self.rows_arrive = None
        self.run = run
        if not streaming:
            if ahead is not None:  # (the next streamed pass starts afresh)
                ahead.join()
            return []
        last = max((k for k in run.units if k not in self.kept), default=None)
        if self.read_ahead_on:  # where the read-ahead may start (read_next_early)
            self.last_unkept = last
        if (last is not None and self.device_ring is None and run.source is None
                and self.policy.runs_ahead and _binds_rows(self.bindings[last])):
            self.rows_arrive = last
        threads = [threading.Thread(target=self.reader.loop, args=(run,), name="layerfit-reader", daemon=True)]
        if self.device_ring is not None:
            self.device_ring.reset()
            threads.append(threading.Thread(target=self.copier.loop, args=(run,), name="layerfit-copier", daemon=True))
        for thread in threads:
            thread.start()
        return threads

    def end_pass(self, run: PassState, threads: list[threading.Thread], streaming: bool) -> None:
        """Cancel and join ``run``'s threads; unbind what the pass left bound."""
        if streaming:
            for ring in self.buffers.streaming_rings:
                ring.cancel()
            for thread in threads:
                thread.join()
            self.reader.output.join_ahead()  # a pass that never began did not wait for it
        if self.releasing is not None and self.releasing in self.kernels.bound:
            self.drop_read_ahead()  # it failed midway: the next pass starts with an empty buffer
        self.releasing = None
        self.kernels.unbind_left(run, streaming)
        self.run = None

    def fail(self, run: PassState, i: int, exc: BaseException) -> None:
        """The reader or copy thread failed at unit ``i``: the executing thread raises
        ``exc`` when it next waits."""
        with self.state:
            run.error = (i, exc)
            self.ready.notify()

    def outcome(self) -> tuple[list[Event], int, int, int]:
        """What the last pass did, once it ended: its timeline's events (unsorted), the
        units it skipped after its first, the bytes read or copied for nothing, and the
        bytes of units it adopted from the read-ahead."""
        read, copier, kernels = self.reader.output, self.copier, self.kernels
        events = read.events + copier.events + kernels.events
        return events, len(kernels.skipped), read.read_for_nothing + copier.read_for_nothing, read.read_ahead_bytes

    def record_skips(self, run: PassState) -> None:
        """After a streamed pass: the units it did not run after its last (read for
        nothing if read), and what it skipped, which the next such pass will not read."""
        if run.begin is None or not run.ordered:
            return
        self.kernels.ended_short(run)
        self._learn(run)

    def _learn(self, run: PassState) -> None:
        """Remember how ``run`` began and what it skipped, for the passes after it to
        expect; once per pass, by its end or, before the read-ahead starts at its tail
        (:meth:`read_next_early`), when every unit after the last it ran is kept (a kept
        unit is never expected to be skipped, so what it skipped is known then)."""
        if run.source is not None or self.learned:
            return
        self.learned = True
        start = (run.units.start, run.units.stop, run.begin)
        self.skips_seen[(start, self.last_start)] = frozenset(self.kernels.skipped)
        self.read_ahead.followed(self.last_start, start)
        self.last_start = start

    def out_of_order(self, i: int, what: str) -> LayerfitError:
        """The error for unit ``i`` running out of the prepared order."""
        name = self.blocks[i].name or "<root>"
        return LayerfitError(f"unit {i} ({name}) {what}: {OTHER_PATH}")

    def expected_skips(self, start: Start, before: Start | None) -> frozenset[int]:
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
        if i != self.last_unkept or not self._reads_next(run):
            return
        with self.state:
            if self.ring.in_use or self.read_ahead.current is not None:
                return
        self._learn(run)  # the next pass is expected as after the pass ended
        self._start_read_ahead(run)

    def release_rows_as_used(self, run: PassState, i: int, off: int) -> None:
        """Unit ``i`` of ``run`` was bound at ``off`` of the read buffer. When it is the pass's
        last unit not kept and its one tensor is a weight multiplied by rows from the unit's
        start (:class:`BlockRows`, a weight the packed mode computes in bf16, or
        :class:`Q6KStripes`, such as the Q6_K output layer of a Q4 file), each page of its
        rows is given back once its product has used it, and the read-ahead of the next
        pass begins with the first: it reads into the buffer while the product runs,
        instead of once the unit has given its whole place back (in a buffer hardly larger
        than the unit, as at the least budget, that is when the pass ends). The pass's
        reader reads nothing more then, as for :meth:`read_next_early`."""
        if i != self.last_unkept or not self._reads_next(run):
            return
        operand = _rows_operand(self.bindings[i])
        if operand is not None:
            self.releasing = i
            operand.used = functools.partial(self._rows_used, run, i, off)

    def _rows_used(self, run: PassState, i: int, base: int, nbytes: int) -> None:
        """The product of unit ``i`` (bound at ``base``) has used its first ``nbytes``: their
        whole pages go back (once the device has run what it was given: on a GPU the
        product may still read them); with the first, the read-ahead starts."""
        self.device.finish_kernels()
        if self.kernels.give_back_used(i, base, nbytes) and self.read_ahead.current is None:
            self._learn(run)
            self._start_read_ahead(run)

    def reads_in_parts(self, i: int) -> bool:
        """Whether the reader hands unit ``i`` to the kernels part by part as it reads it:
        the pass's last streamed unit, one weight multiplied by rows from its start
        (:class:`BlockRows`, :class:`Q6KStripes`), once its SHA-256 was verified (a unit
        still to check is bound only when it is whole and checked). The kernels then wait
        for no more than the rows they multiply next, so at the least budget, where the
        buffer holds little more than that unit (the Q6_K output layer of a Q4 file), its
        product no longer waits for the whole read before it starts."""
        return i == self.rows_arrive and not self.units.needs_check(i)

    def compute_rows_as_read(self, run: PassState, i: int) -> None:
        """Unit ``i`` was just bound: if the reader is still reading it (:meth:`reads_in_parts`),
        its product waits, step by step, for the rows it multiplies."""
        operand = _rows_operand(self.bindings[i])
        with self.state:
            if self.reader.output.arriving_unit() != i:
                return
            if operand is None:  # bound otherwise than predicted: its kernel waits for the whole unit
                self.await_whole(run, i)
                if self.reader.output.arriving_unit() == i:
                    raise_failure(run)
                return
        operand.arrived = functools.partial(self._await_rows, run, i)

    def _await_rows(self, run: PassState, i: int, nbytes: int) -> None:
        """Wait until the first ``nbytes`` of unit ``i`` have been read (or the reader failed)."""
        with self.state:
            while not self.reader.output.has_arrived(i, nbytes) and run.error is None:
                self.ready.wait()
            if not self.reader.output.has_arrived(i, nbytes):
                raise_failure(run)

    def await_whole(self, run: PassState, i: int) -> None:
        """Wait until unit ``i`` has been read to its end (lock held): its place may be given
        back only then, though its kernel may not have multiplied every row (its module did
        not run the product)."""
        while self.reader.output.arriving_unit() == i and run.error is None:
            self.ready.wait()

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
        expected = NextPass(range(after[0], after[1]), after[2], self.expected_skips(after, start))
        chunk = min(self.coalesce_bytes, self.ring.capacity // 2)
        self.read_ahead.start(expected, self.ring, self.blocks, self.kept, self.gathered, chunk)

    def drop_read_ahead(self) -> None:
        """Stop the read-ahead and wait for its read under way: the buffer is the caller's."""
        ahead = self.read_ahead.take()
        if ahead is not None:
            ahead.join()


def _binds_rows(bindings: list[Binding]) -> bool:
    """Whether a unit is one tensor, at its start, that a streamed binding leaves as an
    operand multiplied by rows from its start (:func:`~layerfit.engine.int4_packed.streams_as_rows`):
    a packed weight computed in bf16 in its GGML blocks, or a Q6_K weight's form (not a table)."""
    if len(bindings) != 1 or bindings[0].offset != 0:
        return False
    b = bindings[0]
    return (b.packed and b.encoding is not None and not b.table
            and streams_as_rows(b.encoding.ggml, b.shape, b.encoding.int4_rows))


def _rows_operand(bindings: list[Binding]) -> BlockRows | Q6KStripes | None:
    """The operand of a unit whose one tensor, at its start, is bound as an operand
    multiplied by rows from its start (``ROWS_OPERANDS``); None for any other unit."""
    if len(bindings) != 1 or bindings[0].offset != 0:
        return None
    binding = bindings[0]
    operand = getattr(binding.module._parameters.get(binding.attr), "operand", None)
    return operand if isinstance(operand, ROWS_OPERANDS) else None


__all__ = ["OTHER_PATH", "UnitStream"]
