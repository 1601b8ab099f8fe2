"""The streaming engine: one prepared model executed under a weight-memory budget.

One class runs every pipeline policy (see :mod:`layerfit.engine.policies`). The model's
own ``forward`` runs on a skeleton whose modules have hooks: before a unit's first layer
runs, the hook waits until the reader thread has read the unit and binds its weights by
reference; after its last layer, the hook unbinds them and releases the buffer. The
reader thread reads units in order as the policy and the circular buffer allow. Both
threads wait on one condition; nothing spins.

Full SHA-256 verification happens on the first read of each unit; every inference
starts with a cheap check that the weights file was not replaced or modified.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from layerfit.engine.arena import PlannedActivations, make_activations
from layerfit.engine.binding import Binder, get_binder
from layerfit.engine.policies import Policy, get_policy
from layerfit.engine.ring import Cancelled, RingBuffer
from layerfit.engine.skeleton import Binding, bind, build_skeleton, segment_bindings, unbind
from layerfit.engine.source import UnitSource
from layerfit.engine.trace import Event, Timeline
from layerfit.engine.units import Block, make_blocks
from layerfit.errors import BudgetError, CorruptStoreError, LayerfitError, ReadError
from layerfit.sizes import parse_bytes
from layerfit.store.manifest import Manifest, read_manifest
from layerfit.store.reader import SegmentReader, aligned_buffer, verify_segment


@dataclass(frozen=True)
class MemoryPlan:
    """What the engine holds for weights: resident tensors plus the unit buffer."""

    resident_bytes: int
    buffer_bytes: int
    largest_unit_bytes: int
    total_weight_bytes: int

    @property
    def minimum_budget(self) -> int:
        return self.resident_bytes + self.largest_unit_bytes


class _Run:
    """Shared state of one inference between the executing and the reader thread."""

    def __init__(self, nblocks: int) -> None:
        self.ready: list[int | None] = [None] * nblocks
        self.started = 0
        self.done = 0
        self.error: tuple[int, BaseException] | None = None
        self.bound: dict[int, int] = {}  # block index -> ring offset
        self.t0 = time.perf_counter()
        self.events: list[Event] = []
        self.kernel_start: dict[int, float] = {}
        self.source: UnitSource | None = None  # supplies the units instead of the reader thread
        self.main_waits: int | None = None  # the unit the executing thread waits for
        self.reader_waits = False  # the reader waits for room or its policy's gate
        self.reader_wants: tuple[int, int] = (0, 0)  # (unit, bytes of room) it waits for


class Engine:
    """A prepared model you call like the model, executed within a weight budget.

    ``budget`` counts weight buffers (resident tensors plus the unit buffer); it must be
    at least the resident tensors plus the largest unit. ``pipeline`` is ``preload``,
    ``sequential``, ``sync`` or ``async``; ``units`` is ``layers``, ``blocks:N`` or a
    list of partition points. ``binding`` is ``reference`` (zero-copy, the default) or
    one of the ablation modes of :mod:`layerfit.engine.binding` (``copy``,
    ``instantiate``) that measure what binding by reference saves. ``activations`` is
    ``default`` (PyTorch allocates) or ``planned`` (one arena laid out by the memory
    planner, see :mod:`layerfit.engine.arena`). ``coalesce`` lets the reader read
    adjacent units with one request of up to that many bytes (at most half the buffer)
    when they fit the buffer together: on a small board each read wakes the reader and
    costs the compute threads a preemption, so fewer, larger reads interfere less. ``0``
    reads one unit per request, as the paper does.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        budget: int | str | None = None,
        pipeline: str = "async",
        units: str | list[int] = "layers",
        direct_io: bool = True,
        trace: bool = False,
        binding: str = "reference",
        activations: str = "default",
        coalesce: int | str = "4MiB",
    ) -> None:
        self.directory = Path(directory)
        self.coalesce_bytes = parse_bytes(coalesce) if coalesce not in (0, "0") else 0
        self.binder: Binder = get_binder(binding)
        self.manifest: Manifest = read_manifest(self.directory)
        self.policy: Policy = get_policy(pipeline)
        self.trace = trace
        self.model: nn.Module = build_skeleton(self.manifest)
        self._modules: dict[str, nn.Module] = dict(self.model.named_modules(remove_duplicate=False))
        self.reader = SegmentReader(
            self.directory / self.manifest.weights_file, self.manifest.weights_size, direct=direct_io
        )
        self._verified: set[int] = set()  # segment indices whose SHA-256 was checked
        self._lock = threading.Lock()  # one inference at a time per engine
        # One lock for the ring and the run's progress, with a condition per waiter: the
        # reader waits on ``_room``, the executing thread on ``_ready``, and each is
        # woken only when what it waits for has happened.
        self._state = threading.Lock()
        self._room = threading.Condition(self._state)
        self._ready = threading.Condition(self._state)
        self._run: _Run | None = None
        self.last_timeline: Timeline | None = None
        self._hooks: list = []
        self.ring: RingBuffer | None = None
        self._resident_buf = None
        self._bindings: list[list[Binding]] = []
        self._preloaded = False  # every unit bound for good (preload policy)
        self._units_spec = units
        # activations="planned": one pre-allocated arena laid out by the memory planner
        self.arena: PlannedActivations | None = None
        try:
            self.arena = make_activations(activations, self.manifest)
            self._setup(budget, units)
        except BaseException:
            self.close()
            raise

    # --- set-up ------------------------------------------------------------------------

    def _setup(self, budget: int | str | None, units: str | list[int]) -> None:
        m = self.manifest
        if m.resident is not None:
            self._resident_buf = aligned_buffer(m.resident.nbytes)
            view = memoryview(self._resident_buf)
            self.reader.read(m.resident, view)
            verify_segment(m.resident, view)
            view.release()
            bind(
                segment_bindings(self.model, m.resident),
                torch.frombuffer(self._resident_buf, dtype=torch.uint8),
                0,
            )
        self._configure(budget, units)

    def _configure(self, budget: int | str | None, units: str | list[int]) -> None:
        """Partition into blocks, size the buffer for the budget, install the hooks."""
        m = self.manifest
        blocks = make_blocks(m.units, units)
        sizes = [b.nbytes for b in blocks]
        resident = m.resident_bytes
        largest = max(sizes, default=0)
        budget_bytes = None if budget is None else parse_bytes(budget)
        if budget_bytes is not None and budget_bytes < resident + largest:
            raise BudgetError(
                f"budget {budget_bytes} bytes is below the minimum for this model: "
                f"{resident + largest} bytes (largest unit {largest}"
                + (f" + resident tensors {resident}" if resident else "")
                + ")"
            )
        capacity = self.policy.buffer_bytes(sizes, None if budget_bytes is None else budget_bytes - resident)
        bindings = [
            [
                b
                for seg in blk.segments
                for b in segment_bindings(self.model, seg, seg.offset - blk.offset, self._modules)
            ]
            for blk in blocks
        ]
        # Everything is validated: replace the old configuration, reusing the buffer's
        # mapping when the new capacity fits it.
        self._release_configuration(keep_ring=True)
        self.blocks: list[Block] = blocks
        self._bindings = bindings
        self._verified_blocks: set[int] = set()
        self.memory = MemoryPlan(resident, capacity, largest, m.total_bytes)
        if self.ring is None or not self.ring.reshape(capacity):
            if self.ring is not None:
                self.ring.close()
            self.ring = RingBuffer(capacity, self._room) if capacity else None
        if self.ring is not None:
            self.ring.record_history = self.trace
        self._install_hooks()
        self._preloaded = self.policy.name == "preload"
        if self._preloaded:
            for i, blk in enumerate(self.blocks):
                off = self.ring.allocate(blk.nbytes)
                self.read_unit(i, self.ring.view[off : off + blk.nbytes])
                bind(self._bindings[i], self.ring.bytes, off)

    def reconfigure(
        self,
        *,
        budget: int | str | None = None,
        units: str | list[int] | None = None,
        pipeline: str | None = None,
    ) -> float:
        """Apply a new budget, unit partition and/or pipeline between inferences; seconds.

        The model is not reloaded: only the buffer and the unit grouping change. A
        budget below the minimum is refused and the old configuration keeps running.
        """
        t0 = time.perf_counter()
        with self._lock:
            old_policy = self.policy
            if pipeline is not None:
                self.policy = get_policy(pipeline)
            try:
                self._configure(budget, self._units_spec if units is None else units)
            except BaseException:
                self.policy = old_policy
                raise
            if units is not None:
                self._units_spec = units
        return time.perf_counter() - t0

    def _release_configuration(self, keep_ring: bool = False) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        if self._preloaded:
            for bindings in self._bindings:
                unbind(bindings)
            self._preloaded = False
        if self.ring is not None and not keep_ring:
            self.ring.close()
            self.ring = None

    def _install_hooks(self) -> None:
        for i, blk in enumerate(self.blocks):
            first = blk.segments[0].name
            last = blk.segments[-1].name
            m_first, m_last = self._modules[first], self._modules[last]
            self._hooks.append(m_first.register_forward_pre_hook(self._pre_hook(i)))
            self._hooks.append(m_last.register_forward_hook(self._post_hook(i)))

    # --- the two threads ---------------------------------------------------------------

    def read_unit(self, i: int, into: memoryview) -> None:
        """Read unit ``i`` into ``into`` (aligned, at least the unit's bytes) with this
        engine's reader; the first read of a unit verifies its SHA-256. Unit sources
        call it from their own threads, concurrently with the forward pass."""
        blk = self.blocks[i]
        view = into[: blk.nbytes]
        what = f"unit {i} ({blk.name or '<root>'})"
        self.reader.read_range(blk.offset, blk.nbytes, view, what)
        if i not in self._verified_blocks:
            self._verify(i, view)

    def _read_range(self, run: _Run, first: int, stop: int, off: int) -> None:
        """Read units ``first..stop-1`` (adjacent in the file) into the ring at ``off``.

        Several units are read with one request; if that fails, they are read one by one
        so the error names the unit that cannot be read (and a transient error heals).
        """
        blocks = self.blocks
        base = blocks[first].offset
        if stop - first == 1:
            self.read_unit(first, self.ring.view[off : off + blocks[first].nbytes])
            return
        total = blocks[stop - 1].offset + blocks[stop - 1].nbytes - base
        view = self.ring.view[off : off + total]
        try:
            what = f"units {first}-{stop - 1} ({blocks[first].name} .. {blocks[stop - 1].name})"
            self.reader.read_range(base, total, view, what)
        except LayerfitError:
            for k in range(first, stop):
                pos = blocks[k].offset - base
                self.read_unit(k, view[pos : pos + blocks[k].nbytes])
            return
        for k in range(first, stop):
            if k not in self._verified_blocks:
                pos = blocks[k].offset - base
                self._verify(k, view[pos : pos + blocks[k].nbytes])

    def _verify(self, i: int, view: memoryview) -> None:
        pos = 0
        for seg in self.blocks[i].segments:
            if seg.index not in self._verified:
                verify_segment(seg, view[pos : pos + seg.nbytes])
                self._verified.add(seg.index)
            pos += seg.nbytes
        self._verified_blocks.add(i)

    def _reader_may_go(self, run: _Run, i: int, want: int) -> bool:
        """The reader's wake-up predicate for unit ``i`` (lock held)."""
        if not self.policy.read_may_start(i, run.started, run.done):
            return False
        if not self.ring.fits(self.blocks[i].nbytes):
            return False
        # Hysteresis: with the executing thread busy, wait for room for a whole batch
        # (``want`` bytes) instead of waking for every small unit released.
        return run.main_waits is not None or self.ring.fits(want)

    def _wake_reader(self, run: _Run) -> None:
        """Wake the reader if what it waits for has happened (lock held)."""
        if run.reader_waits and (self.ring.cancelled or self._reader_may_go(run, *run.reader_wants)):
            self._room.notify()

    def _reader_loop(self, run: _Run) -> None:
        policy, ring, room = self.policy, self.ring, self._room
        blocks, n = self.blocks, len(self.blocks)
        # Coalescing and batch-sized wake-ups only where reads may run ahead (async):
        # sequential and sync read each unit as soon as their gate opens, as the paper.
        chunk = min(self.coalesce_bytes, ring.capacity // 2) if policy.name == "async" else 0
        i = 0
        try:
            while i < n:
                first = blocks[i].nbytes
                want = max(first, chunk)
                with room:
                    if ring.cancelled:
                        return
                    while not self._reader_may_go(run, i, want):
                        if ring.cancelled:
                            return
                        run.reader_waits, run.reader_wants = True, (i, want)
                        room.wait()
                    run.reader_waits = False
                    if run.main_waits is not None:
                        want = first  # the kernel is stalled on this unit: read it alone
                    off = ring.allocate_locked(first)
                    # Coalesce: the following units join this read while they are
                    # allowed to start, land right after it in the ring and the read
                    # stays within ``want`` bytes.
                    stop, total = i + 1, first
                    while (
                        stop < n
                        and total + blocks[stop].nbytes <= want
                        and policy.read_may_start(stop, run.started, run.done)
                        and ring.next_offset(blocks[stop].nbytes) == off + total
                    ):
                        ring.allocate_locked(blocks[stop].nbytes)
                        total += blocks[stop].nbytes
                        stop += 1
                t0 = time.perf_counter()
                self._read_range(run, i, stop, off)
                t1 = time.perf_counter()
                with room:
                    at = t0
                    for k in range(i, stop):
                        run.ready[k] = off + blocks[k].offset - blocks[i].offset
                        if self.trace:  # a coalesced read is shown split by bytes
                            end = t1 if k == stop - 1 else at + (t1 - t0) * blocks[k].nbytes / total
                            run.events.append(Event(k, blocks[k].name, "read", at - run.t0, end - run.t0, blocks[k].nbytes))
                            at = end
                    if run.main_waits is not None and run.main_waits < stop:
                        self._ready.notify()
                i = stop
        except Cancelled:
            return
        except BaseException as exc:  # handed to the executing thread, which raises it
            with room:
                run.error = (i, exc)
                self._ready.notify()

    def _pre_hook(self, i: int):
        def hook(module: nn.Module, args: tuple) -> None:
            run = self._run
            if run is None:
                return
            if run.source is not None:  # the unit source decides when the unit may run
                buffer, off = run.source.acquire(i)
                run.kernel_start[i] = time.perf_counter() - run.t0
                self.binder.bind(self._bindings[i], buffer, off)
                run.bound[i] = off
                return
            if self.policy.name == "preload":
                run.bound[i] = -1
                run.kernel_start[i] = time.perf_counter() - run.t0
                return
            with self._state:
                if run.ready[i] is None and run.error is None:
                    run.main_waits = i
                    self._wake_reader(run)  # the reader may be holding out for a batch
                    while run.ready[i] is None and run.error is None:
                        self._ready.wait()
                    run.main_waits = None
                if run.ready[i] is None:
                    failed, exc = run.error
                    if isinstance(exc, LayerfitError):
                        raise type(exc)(str(exc)) from exc
                    raise ReadError(f"reading unit {failed} failed: {exc}") from exc
                off = run.ready[i]
                # The kernel starts now (binding is part of it); the sync policy lets
                # the next read begin from this moment.
                run.kernel_start[i] = time.perf_counter() - run.t0
                run.started = i + 1
                self._wake_reader(run)
            self.binder.bind(self._bindings[i], self.ring.bytes, off)
            run.bound[i] = off

        return hook

    def _post_hook(self, i: int):
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            run = self._run
            if run is None:
                return
            if self.trace:
                end = time.perf_counter() - run.t0
                with self._state:
                    run.events.append(
                        Event(i, self.blocks[i].name, "kernel", run.kernel_start[i], end, self.blocks[i].nbytes)
                    )
            off = run.bound.pop(i)
            if run.source is not None:
                self.binder.unbind(self._bindings[i])
                run.source.release(i)
            elif self.policy.name != "preload":
                self.binder.unbind(self._bindings[i])
                with self._state:
                    self.ring.release_locked(off)
                    run.done = i + 1
                    self._wake_reader(run)
                return
            with self._state:
                run.done = i + 1

        return hook

    # --- inference ---------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the model on ``args``; the engine's reader thread supplies the units."""
        return self.run_from(None, *args, **kwargs)

    @torch.no_grad()
    def run_from(self, source: UnitSource | None, *args: Any, **kwargs: Any) -> Any:
        """Run the model with the units supplied by ``source`` (None: the reader thread).

        The same forward pass and hooks either way; a source (see
        :mod:`layerfit.engine.source`) decides when each unit's bytes are there and when
        its kernel may start — the multi-request scheduler drives engines this way.
        """
        if source is None and self.policy.name == "external":
            raise LayerfitError(
                "this engine has pipeline 'external': it runs only with a unit source "
                "(Engine.run_from); load it with another pipeline to call it directly"
            )
        with self._lock:
            self.reader.check_unchanged()
            run = _Run(len(self.blocks))
            run.source = source
            self._run = run
            self.binder.reset()
            streaming = source is None and self.policy.name != "preload" and self.blocks
            thread = None
            if streaming:
                self.ring.reset()
                thread = threading.Thread(target=self._reader_loop, args=(run,), name="layerfit-reader", daemon=True)
                thread.start()
            try:
                if self.arena is None:
                    out = self.model(*args, **kwargs)
                else:
                    out = self.arena.run(self.model, args, kwargs)
                if run.done != len(self.blocks):
                    raise LayerfitError(
                        f"the forward pass ran {run.done} of {len(self.blocks)} units: the model's "
                        "control flow differs from the captured one (prepare it with this input shape)"
                    )
            finally:
                end = time.perf_counter()
                if streaming:
                    self.ring.cancel()
                    thread.join()
                    for i in list(run.bound):
                        self.binder.unbind(self._bindings[i])
                    run.bound.clear()
                elif source is not None:
                    for i in list(run.bound):
                        self.binder.unbind(self._bindings[i])
                    run.bound.clear()
                self._run = None
            if self.trace:
                occupancy = [] if self.ring is None else [(t - run.t0, b) for t, b in self.ring.history]
                self.last_timeline = Timeline(
                    self.policy.name,
                    self.memory.resident_bytes + self.memory.buffer_bytes,
                    sorted(run.events, key=lambda e: (e.start, e.stage)),
                    occupancy,
                    end - run.t0,
                )
            self.last_weights_peak = (
                self.memory.resident_bytes + (self.ring.peak if self.ring else 0) + self.binder.peak_bytes
            )
            return out

    def share_verification(self, other: Engine) -> None:
        """Trust the units ``other`` has verified (and share what either verifies from now
        on) when both read the same weights file — same inode, size and modification
        time — in the same units: a pool of engines of one model checks each unit once."""
        if other.reader.identity == self.reader.identity and [b.offset for b in other.blocks] == [
            b.offset for b in self.blocks
        ]:
            self._verified = other._verified
            self._verified_blocks = other._verified_blocks

    @property
    def io_mode(self) -> str:
        """``direct`` (O_DIRECT) or ``buffered`` (fallback with fadvise DONTNEED)."""
        return self.reader.mode

    def close(self) -> None:
        """Remove hooks and free the buffers and the file descriptor."""
        self._release_configuration()
        if getattr(self, "reader", None) is not None:
            self.reader.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(directory: str | Path, **kwargs: Any) -> Engine:
    """Load a prepared model; see :class:`Engine` for ``budget``, ``pipeline``, ``units``."""
    return Engine(directory, **kwargs)


__all__ = ["BudgetError", "CorruptStoreError", "Engine", "MemoryPlan", "load"]
