"""The streaming engine: one prepared model executed under a weight-memory budget.

One class runs every pipeline policy (see :mod:`layerfit.engine.policies`). The model's
own ``forward`` runs on a skeleton whose modules have hooks: before a unit's first layer
runs, the hook waits until the reader thread has read the unit and binds its weights by
reference; after its last layer, the hook unbinds them and releases the buffer. The
reader thread reads units in order as the policy and the circular buffer allow. With a
copy stage (``stages=3``, always on CUDA; see :mod:`layerfit.engine.device`), a copy
thread moves each read unit into a second circular buffer on the device, and the hook
binds the device copy. Every thread waits on a condition of one lock; nothing spins.

Full SHA-256 verification happens on the first read of each unit; every inference
starts with a cheap check that the weights file was not replaced or modified.
"""

from __future__ import annotations

import contextlib
import dataclasses
import mmap
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from layerfit.capture.units import storage_address
from layerfit.engine.arena import PlannedActivations, make_activations
from layerfit.engine.binding import Binder, get_binder
from layerfit.engine.device import Device, get_device
from layerfit.engine.gather import RowTable, gathered_units
from layerfit.engine.parts import Part, unit_runs
from layerfit.engine.policies import REQUEST_BYTES, Policy, get_policy, resolve_pipeline
from layerfit.engine.ring import Cancelled, RingBuffer
from layerfit.engine.skeleton import (
    Binding,
    bind,
    build_skeleton,
    report_device,
    segment_bindings,
    unbind,
)
from layerfit.engine.source import UnitSource
from layerfit.engine.trace import Event, Timeline
from layerfit.engine.units import Block, make_blocks
from layerfit.engine.weight_plan import plan_weights
from layerfit.errors import BudgetError, CorruptStoreError, LayerfitError, ReadError
from layerfit.sizes import is_share, parse_budget, parse_bytes
from layerfit.store.manifest import Manifest, read_manifest
from layerfit.store.reader import SegmentReader, aligned_buffer, verify_segment
from layerfit.store.trust import trust_factories
from layerfit.store.verify import VERIFY_MODES


@dataclass(frozen=True)
class MemoryPlan:
    """What the engine holds for weights: resident tensors plus the unit buffers.

    ``buffer_bytes`` is the read (host) buffer; ``device_buffer_bytes`` is the copy
    stage's device buffer (0 without a copy stage); ``kept_bytes`` holds the units
    pipeline ``auto`` keeps resident beside the buffer (0 otherwise).
    """

    resident_bytes: int
    buffer_bytes: int
    largest_unit_bytes: int
    total_weight_bytes: int
    device_buffer_bytes: int = 0
    kept_bytes: int = 0

    @property
    def minimum_budget(self) -> int:
        return self.resident_bytes + self.largest_unit_bytes

    @property
    def weight_bytes(self) -> int:
        """Every byte held for weights: what the budget bounds."""
        return self.resident_bytes + self.kept_bytes + self.buffer_bytes + self.device_buffer_bytes


class _Run:
    """Shared state of one inference between the executing and the reader thread."""

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
        self.reader_wants: tuple[int, int] = (0, 0)  # (unit, bytes of room) it waits for
        self.copier_waits: int | None = None  # the unit the copy thread waits to copy
        self.gathered: dict[int, int | None] = {}  # embeddings bound to rows -> their padding_idx
        self.placed: set[int] = set()  # embeddings whose rows have their place in the ring


_UNBOUND_READ = (
    "the forward pass read a weight outside the module that owns it while it was not loaded "
    "(on a path the example input did not take at prepare, or in a model prepared by an "
    "older layerfit); prepare the model again, with an input that takes this path"
)

_OTHER_PATH = (
    "the model's control flow differs from the one captured at prepare (a branch or loop "
    "that depends on the input, or another input shape), so its weights cannot stream in "
    "the prepared order: prepare it with an input that takes this path, or load it with "
    "pipeline='preload'"
)


class Engine:
    """A prepared model you call like the model, executed within a weight budget.

    ``budget`` counts weight buffers (resident tensors plus the unit buffer); it must be
    at least the resident tensors plus the largest unit. It is bytes, a size (``"24MB"``)
    or a share of the model's weights (``"50%"``). ``pipeline`` is ``preload``,
    ``sequential``, ``sync``, ``async`` or ``auto`` (``preload`` when the budget holds
    every weight or none is given, else ``async`` with the room beyond its buffer
    keeping units resident, see :func:`~layerfit.engine.policies.choose_kept_units`;
    ``pipeline`` keeps what was asked, ``policy`` says what runs and ``kept_units``
    what stays); ``units`` is ``layers``, ``blocks:N``,
    ``merge:SIZE`` or a list of partition points. ``binding`` is ``reference``
    (zero-copy, the default) or one of the ablation modes of
    :mod:`layerfit.engine.binding` (``copy``, ``instantiate``) that measure what binding
    by reference saves. ``activations`` is ``default`` (PyTorch allocates) or
    ``planned`` (one arena laid out by the memory planner, see
    :mod:`layerfit.engine.arena`). ``coalesce`` lets the reader read
    adjacent units with one request of up to that many bytes (at most half the buffer)
    when they fit the buffer together: on a small board each read wakes the reader and
    costs the compute threads a preemption, so fewer, larger reads interfere less. ``0``
    reads one unit per request, as the paper does. ``device`` is ``cpu``, ``cuda`` or
    ``cuda:N``; ``stages`` is 2 (kernels use the read buffer in place, the default on
    CPU) or 3 (a copy stage moves each unit into a device buffer, always on CUDA). With
    three stages the budget is split evenly between the read and the device buffer,
    as the paper's pairs of CPU and GPU buffers; inputs must be on the device.
    ``gather_rows``: when the weights stream, an untied ``nn.Embedding`` table (a language
    model's token embedding) is not streamed whole but read by the rows its ids look up,
    when it runs (see :mod:`layerfit.engine.gather`; CPU with two stages).
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
        device: str = "cpu",
        stages: int | None = None,
        gather_rows: bool = True,
        verify: str = "first",
    ) -> None:
        if verify not in VERIFY_MODES:
            raise LayerfitError(f"verify must be one of {', '.join(VERIFY_MODES)}, not {verify!r}")
        self.verify = verify  # when a unit's SHA-256 is checked: each read, its first, never
        self.directory = Path(directory)
        self.device: Device = get_device(device, stages)
        if self.device.name != "cpu" and activations != "default":
            raise LayerfitError("planned activations are laid out in host memory: use activations='default' on cuda")
        self.coalesce_bytes = parse_bytes(coalesce) if coalesce not in (0, "0") else 0
        self.gather_rows = gather_rows
        self.binder: Binder = get_binder(binding)
        self.manifest: Manifest = read_manifest(self.directory)
        self.pipeline = pipeline  # as asked; ``policy`` is what runs (``auto`` picks per budget)
        self.policy: Policy = get_policy(resolve_pipeline(pipeline, 0, None))  # checks the name
        self.trace = trace
        self.model: nn.Module = build_skeleton(self.manifest, str(self.directory))
        report_device(self.model, self.device.torch_device)  # not meta, between passes
        self._modules: dict[str, nn.Module] = dict(self.model.named_modules(remove_duplicate=False))
        # The skeleton's own (meta) tensors, which unbinding restores: a configuration made
        # while another has weights bound must not take those for the skeleton's.
        self._skeleton_tensors: dict[tuple[int, str], torch.Tensor] = {
            (id(module), attr): t
            for module in self._modules.values()
            for attr, t in [*module._parameters.items(), *module._buffers.items()]
            if t is not None
        }
        self.reader = SegmentReader(
            self.directory / self.manifest.weights_file, self.manifest.weights_size, direct=direct_io
        )
        self._verified: set[int] = set()  # segment indices whose SHA-256 was checked
        self._lock = threading.Lock()  # one inference at a time per engine
        self.pass_thread: int | None = None  # the thread running a pass, while one runs
        self.generating = threading.Lock()  # one generate() at a time (it overrides forward)
        # One lock for the ring and the run's progress, with a condition per waiter: the
        # reader waits on ``_room``, the executing thread on ``_ready``, and each is
        # woken only when what it waits for has happened.
        self._state = threading.Lock()
        self._room = threading.Condition(self._state)
        self._ready = threading.Condition(self._state)
        self._copyable = threading.Condition(self._state)  # the copy thread (three stages)
        self._run: _Run | None = None
        self.last_timeline: Timeline | None = None
        # The last pass's units that did not run (after its first), and the bytes the
        # reader had read of them for nothing.
        self.last_skipped: tuple[int, int] = (0, 0)
        # The units the last pass that began at a unit skipped, by where it began and
        # where the pass before it began: the next such pass does not read them. A cached
        # decoder step skips what the step before it skipped; the first step after the
        # encoder's pass skips nothing.
        self._skips_seen: dict[tuple, frozenset[int]] = {}
        self._last_start: tuple[int, int, int] | None = None  # (part start, stop, first unit run)
        self._hooks: list = []
        self.ring: RingBuffer | None = None  # the read buffer
        self.device_ring: RingBuffer | None = None  # the copy stage's target
        self._pinned: torch.Tensor | None = None  # the read buffer, while pinned
        self._resident_buf = None
        self._bindings: list[list[Binding]] = []
        self._preloaded = False  # every unit bound for good (preload policy)
        self._kept: frozenset[int] = frozenset()  # units bound for good beside the ring (auto)
        self._kept_ring: RingBuffer | None = None  # their memory
        self._gathered: dict[int, RowTable] = {}  # units read by rows when they run
        self._lost: str | None = None  # why the configuration was lost (a failed re-read)
        self._units_spec = units
        self._closed = False
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
            if self.verify != "never":
                verify_segment(m.resident, view)
            view.release()
            resident = torch.frombuffer(self._resident_buf, dtype=torch.uint8)
            if self.device.name != "cpu":
                resident = resident.to(self.device.torch_device)  # kept alive by the bound views
            bind(segment_bindings(self.model, m.resident), resident, 0)
        self._configure(budget, units)

    def _configure(self, budget: int | str | None, units: str | list[int]) -> None:
        """Partition into blocks, size the buffer for the budget, install the hooks."""
        m = self.manifest
        blocks = make_blocks(m.units, units)
        sizes = [b.nbytes for b in blocks]
        resident = m.resident_bytes
        three = self.device.stages == 3
        budget_bytes = None if budget is None else parse_budget(budget, m.total_bytes)
        skeleton = self._skeleton_tensors
        bindings = [
            [
                dataclasses.replace(b, meta=skeleton.get((id(b.module), b.attr), b.meta))
                for seg in blocks[k].segments
                for b in segment_bindings(self.model, seg, seg.offset - blocks[k].offset, self._modules)
            ]
            for k in range(len(blocks))
        ]
        tables: dict[int, RowTable] = {}
        if self.gather_rows and self.device.name == "cpu" and not three and self.arena is None:
            for i in gathered_units(blk.segments for blk in blocks):
                table = RowTable.of(blocks[i].segments[0], bindings[i])
                if table is not None:
                    tables[i] = table
        try:
            floors = {i: t.least_room for i, t in tables.items()}
            runs = unit_runs(self.model, blocks)  # an encoder-decoder's decoder runs per token
            plan = plan_weights(self.pipeline, sizes, resident, budget_bytes, self.device.stages, floors, runs)
        except BudgetError as exc:
            if not is_share(budget):
                raise
            raise BudgetError(f"{exc} ({budget.strip()} of its {m.total_bytes} bytes of weights)") from None
        self.policy = plan.policy
        kept, kept_bytes = plan.kept, plan.kept_bytes
        capacity, device_capacity = plan.buffer_bytes, plan.device_buffer_bytes
        largest = max((tables[i].least_room if i in plan.gathered else n for i, n in enumerate(sizes)), default=0)
        # Everything is validated: replace the old configuration, reusing the buffer's
        # mapping when the new capacity fits it.
        self._release_configuration(keep_ring=True)
        self.blocks: list[Block] = blocks
        self._bindings = bindings
        # units whose SHA-256 needs no check (again): none while verify is "always"
        self._verified_blocks: set[int] = set(range(len(blocks))) if self.verify == "never" else set()
        self.memory = MemoryPlan(resident, capacity, largest, m.total_bytes, device_capacity, kept_bytes)
        self._unpin()
        self.ring = self._resized(self.ring, capacity, self._room, None)
        self.device_ring = self._resized(
            self.device_ring, device_capacity, self._copyable, self.device.device_buffer
        )
        if self.ring is not None and three and self.device.pins_host:
            self._pinned = self.ring.bytes[: self.ring.capacity]  # not the pages given back
            self.device.pin(self._pinned)
        self._gathered = {i: tables[i] for i in plan.gathered}
        self._skips_seen, self._last_start = {}, None
        self._install_hooks()
        self._preloaded = self.policy.name == "preload"
        self._kept = kept
        try:
            if self._preloaded:
                self._preload()
            if kept:
                self._keep_units(kept_bytes)
        except BaseException as exc:
            # The old configuration is gone and the new one incomplete: hold nothing,
            # and refuse to run until a configuration succeeds.
            self._release_configuration()
            self._lost = f"reading its weights for the new configuration failed ({exc})"
            raise
        self._lost = None

    def _resized(self, ring: RingBuffer | None, capacity: int, condition: threading.Condition, storage) -> RingBuffer | None:
        """``ring`` with ``capacity`` (reshaped in place when it can be); None for 0."""
        if ring is not None and capacity and ring.reshape(capacity):
            ring.record_history = self.trace
            return ring
        if ring is not None:
            ring.close()
        if not capacity:
            return None
        ring = RingBuffer(capacity, condition, None if storage is None else storage(capacity))
        ring.record_history = self.trace
        return ring

    def _preload(self) -> None:
        """Read every unit once and bind it for good (the preload policy)."""
        units = list(range(len(self.blocks)))
        if self.device_ring is None:
            self._bind_for_good(units, self.ring)
        else:
            self._bind_for_good(units, self.device_ring, staged=True)

    def _keep_units(self, nbytes: int) -> None:
        """Read the units ``auto`` keeps into their own buffer and bind them for good;
        with a copy stage that buffer is device memory, filled as preload fills it."""
        three = self.device_ring is not None
        self._kept_ring = RingBuffer(nbytes, None, self.device.device_buffer(nbytes) if three else None)
        self._bind_for_good(sorted(self._kept), self._kept_ring, staged=three)

    def _bind_for_good(self, units: list[int], target: RingBuffer, staged: bool = False) -> None:
        """Read ``units`` into ``target`` and bind them there for good. ``staged``: the
        target is device memory, reached through a host staging buffer of the largest of
        them that is freed after."""
        if not units:
            return
        staging = aligned_buffer(max(self.blocks[i].nbytes for i in units)) if staged else None
        view = memoryview(staging) if staged else None
        host = torch.frombuffer(staging, dtype=torch.uint8) if staged else None
        try:
            for i in units:
                n = self.blocks[i].nbytes
                off = target.allocate(n)
                if staged:
                    self.read_unit(i, view[:n])
                    self.device.copy(target.bytes[off : off + n], host[:n])
                else:
                    self.read_unit(i, target.view[off : off + n])
                bind(self._bindings[i], target.bytes, off)
        finally:
            del host
            if staged:
                view.release()
                staging.close()

    def _unpin(self) -> None:
        if self._pinned is not None:
            self.device.unpin(self._pinned)
            self._pinned = None

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
            self._check_open()
            old_pipeline, old_policy = self.pipeline, self.policy
            if pipeline is not None:
                resolve_pipeline(pipeline, 0, None)  # an unknown name changes nothing
                self.pipeline = pipeline
            try:
                self._configure(budget, self._units_spec if units is None else units)
            except BaseException:
                self.pipeline, self.policy = old_pipeline, old_policy
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
        for i in self._kept:
            unbind(self._bindings[i])
        self._kept = frozenset()
        self._gathered = {}
        if self._kept_ring is not None:
            self._kept_ring.close()
            self._kept_ring = None
        if not keep_ring:
            self._unpin()
            for ring in (self.ring, self.device_ring):
                if ring is not None:
                    ring.close()
            self.ring = self.device_ring = None

    def _install_hooks(self) -> None:
        for i, blk in enumerate(self.blocks):
            first = blk.segments[0].name
            last = blk.segments[-1].name
            m_first, m_last = self._modules[first], self._modules[last]
            if i in self._gathered:
                self._hooks.append(m_first.register_forward_pre_hook(self._gather_hook(i), with_kwargs=True))
            else:
                self._hooks.append(m_first.register_forward_pre_hook(self._pre_hook(i)))
            self._hooks.append(m_last.register_forward_hook(self._post_hook(i)))
            for seg in blk.segments[1:]:  # a later layer of the block needs the block bound
                self._hooks.append(self._modules[seg.name].register_forward_pre_hook(self._inner_hook(i, seg.name)))
        # Modules that did not run at prepare have no stored weights: running one now
        # would compute with the skeleton's meta tensors.
        for name in sorted({n.rpartition(".")[0] for n in self.manifest.graph.unused}):
            module = self._modules.get(name)
            if module is not None:
                self._hooks.append(module.register_forward_pre_hook(self._unstored_hook(name)))

    def _unstored_hook(self, name: str):
        def hook(module: nn.Module, args: tuple) -> None:
            if self._run is not None:
                raise LayerfitError(
                    f"module {name or '<root>'} runs, but it did not run on the example input "
                    "at prepare, so its weights were not stored (a branch that depends on the "
                    f"input): prepare the model with an input that runs {name or '<root>'}"
                )

        return hook

    def _inner_hook(self, i: int, name: str):
        def hook(module: nn.Module, args: tuple) -> None:
            run = self._run
            if run is None or i in run.bound or not run.ordered:
                return
            first = self.blocks[i].segments[0].name or "<root>"
            raise self._out_of_order(i, f"runs {name or '<root>'}, but not its first layer {first}")

        return hook

    def _out_of_order(self, i: int, what: str) -> LayerfitError:
        """The error for unit ``i`` running out of the prepared order."""
        name = self.blocks[i].name or "<root>"
        return LayerfitError(f"unit {i} ({name}) {what}: {_OTHER_PATH}")

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

    def read_unit_buffer(self, i: int) -> mmap.mmap:
        """Unit ``i`` read into a fresh aligned buffer of exactly its bytes, owned by the
        caller (a scheduler's load task); freed again if the read fails."""
        buffer = aligned_buffer(self.blocks[i].nbytes)
        view = memoryview(buffer)
        try:
            self.read_unit(i, view)
        except BaseException:
            view.release()
            with contextlib.suppress(BufferError):  # the traceback still holds views: GC frees it
                buffer.close()
            raise
        view.release()
        return buffer

    def _read_range(self, first: int, stop: int, off: int) -> None:
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
        always = self.verify == "always"
        pos = 0
        for seg in self.blocks[i].segments:
            if always or seg.index not in self._verified:
                verify_segment(seg, view[pos : pos + seg.nbytes])
                if not always:
                    self._verified.add(seg.index)
            pos += seg.nbytes
        if not always:
            self._verified_blocks.add(i)

    def _reader_may_go(self, run: _Run, i: int, want: int) -> bool:
        """The reader's wake-up predicate for unit ``i`` (lock held)."""
        if i < run.done or run.epoch != run.reader_epoch:  # skipped, or rewound: go on
            return True
        if not self.policy.read_may_start(i, run.started, run.done, self.device.stages):
            return False
        if not self.ring.fits(self.blocks[i].nbytes):
            return False
        # Hysteresis: while the kernels have other units to run, wait for room for a
        # whole batch (``want`` bytes) instead of waking for every small unit released.
        # The unit the next kernel needs is read at once, and alone.
        return self._kernel_needs(run, i) or self.ring.fits(want)

    @staticmethod
    def _kernel_needs(run: _Run, i: int) -> bool:
        """Whether the executing thread waits (or will next) for the read of unit ``i``.
        ``main_waits`` is cleared only once that thread runs again, so a unit it waited
        for that has already arrived must not count: on a loaded machine it may not run
        for a while, and meanwhile the reader would read every unit alone."""
        return run.main_waits == i or i == run.started

    def _wake_reader(self, run: _Run) -> None:
        """Wake the reader if what it waits for has happened (lock held)."""
        if run.reader_waits and (self.ring.cancelled or self._reader_may_go(run, *run.reader_wants)):
            self._room.notify()

    def _reader_loop(self, run: _Run) -> None:
        policy, ring, room = self.policy, self.ring, self._room
        blocks = self.blocks
        i = 0
        # Coalescing and batch-sized wake-ups only where reads may run ahead (async):
        # sequential and sync read each unit as soon as their gate opens, as the paper.
        chunk = min(self.coalesce_bytes, ring.capacity // 2) if policy.name == "async" else 0
        kept, gathered = self._kept, self._gathered
        try:
            with room:
                while run.begin is None:  # the pass has not run its first unit yet
                    if ring.cancelled:
                        return
                    room.wait()
                i, n = run.begin, run.units.stop
            while True:
                if run.epoch != run.reader_epoch:  # the kernels ran a unit it passed over
                    with room:
                        run.reader_epoch, i = run.epoch, run.rewind_to
                    continue
                if i >= n:  # all read, but for units it passed over: one may run yet
                    with room:
                        while run.expect_skipped and run.epoch == run.reader_epoch and not ring.cancelled:
                            room.wait()
                        if run.epoch == run.reader_epoch:
                            return
                    continue
                if i in kept or i in run.expect_skipped:
                    i += 1
                    continue
                if i in gathered:  # read by rows when it runs: wait until they have their place
                    with room:
                        while i not in run.placed and i >= run.done and run.epoch == run.reader_epoch:
                            if ring.cancelled:
                                return
                            room.wait()
                    i += 1
                    continue
                first = blocks[i].nbytes
                want = max(first, chunk)
                with room:
                    if ring.cancelled:
                        return
                    if run.epoch != run.reader_epoch:
                        continue
                    if i < run.done:  # the kernels skipped it
                        run.not_read.update(range(i, run.done))
                        if self.device_ring is not None:
                            self._wake_copier(run)
                        i = run.done
                        continue
                    while not self._reader_may_go(run, i, want):
                        if ring.cancelled:
                            return
                        run.reader_waits, run.reader_wants = True, (i, want)
                        room.wait()
                    run.reader_waits = False
                    if i < run.done or run.epoch != run.reader_epoch:
                        continue
                    if self._kernel_needs(run, i):
                        want = first  # read it alone, the kernel waits for it
                    off = ring.allocate_locked(first)
                    # Coalesce: the following units join this read while they are
                    # allowed to start, land right after it in the ring and the read
                    # stays within ``want`` bytes.
                    stop, total = i + 1, first
                    while (
                        stop < n
                        and stop not in kept
                        and stop not in gathered
                        and stop not in run.expect_skipped
                        and total + blocks[stop].nbytes <= want
                        and policy.read_may_start(stop, run.started, run.done, self.device.stages)
                        and ring.next_offset(blocks[stop].nbytes) == off + total
                    ):
                        ring.allocate_locked(blocks[stop].nbytes)
                        total += blocks[stop].nbytes
                        stop += 1
                t0 = time.perf_counter()
                self._read_range(i, stop, off)
                t1 = time.perf_counter()
                with room:
                    if run.epoch != run.reader_epoch:  # rewound while it read: the oldest bytes
                        for k in range(i, stop):
                            ring.release_locked(off + blocks[k].offset - blocks[i].offset)
                            run.read_for_nothing += blocks[k].nbytes
                        self._ready.notify()
                        continue
                    at = t0
                    for k in range(i, stop):
                        # Skipped while it was read: the oldest bytes in the ring (with a
                        # copy stage, the copier gives read bytes back, in order).
                        if k < run.done and self.device_ring is None:
                            ring.release_locked(off + blocks[k].offset - blocks[i].offset)
                            run.read_for_nothing += blocks[k].nbytes
                            self._ready.notify()  # rows may wait for the room
                            continue
                        run.ready[k] = off + blocks[k].offset - blocks[i].offset
                        if self.trace:  # a coalesced read is shown split by bytes
                            end = t1 if k == stop - 1 else at + (t1 - t0) * blocks[k].nbytes / total
                            run.events.append(Event(k, blocks[k].name, "read", at - run.t0, end - run.t0, blocks[k].nbytes))
                            at = end
                    if self.device_ring is not None:
                        self._wake_copier(run)
                    elif run.main_waits is not None and run.main_waits < stop:
                        self._ready.notify()
                i = stop
        except Cancelled:
            return
        except BaseException as exc:  # handed to the executing thread, which raises it
            with room:
                run.error = (i, exc)
                self._ready.notify()

    def _copier_may_go(self, run: _Run, j: int) -> bool:
        """The copy thread's wake-up predicate for unit ``j`` (lock held): Algorithm 1's
        copy constraints — the unit was read, and it has room in the device buffer."""
        if j < run.done:  # skipped: once the reader read it or passed it over
            return run.ready[j] is not None or j in run.not_read
        return (
            run.ready[j] is not None
            and self.policy.copy_may_start(j, run.started, run.done)
            and self.device_ring.fits(self.blocks[j].nbytes)
        )

    def _wake_copier(self, run: _Run) -> None:
        """Wake the copy thread if what it waits for has happened (lock held)."""
        j = run.copier_waits
        if j is not None and (self.device_ring.cancelled or self._copier_may_go(run, j)):
            self._copyable.notify()

    def _copier_loop(self, run: _Run) -> None:
        """The copy stage: move each read unit into the device buffer, in order, and
        give its read buffer back once the copy is complete."""
        host, dev, cond = self.ring, self.device_ring, self._copyable
        j = 0
        try:
            with cond:
                while run.begin is None and not dev.cancelled:
                    cond.wait()
                if dev.cancelled:
                    return
                first, stop = run.begin, run.units.stop
            for j in range(first, stop):
                blk = self.blocks[j]
                if j in self._kept:  # already on the device, for good
                    continue
                with cond:
                    while not dev.cancelled and not self._copier_may_go(run, j):
                        run.copier_waits = j
                        cond.wait()
                    run.copier_waits = None
                    if dev.cancelled:
                        return
                    if j < run.done:  # the kernels skipped it: give back what was read, in order
                        if run.ready[j] is not None:
                            host.release_locked(run.ready[j])
                            run.ready[j] = None
                            run.read_for_nothing += blk.nbytes
                            self._wake_reader(run)
                        continue
                    src = run.ready[j]
                    dst = dev.allocate_locked(blk.nbytes)
                t0 = time.perf_counter()
                self.device.copy(dev.bytes[dst : dst + blk.nbytes], host.bytes[src : src + blk.nbytes])
                t1 = time.perf_counter()
                with cond:
                    host.release_locked(src)
                    if j < run.done:  # skipped while it was copied: the oldest on the device
                        dev.release_locked(dst)
                        run.read_for_nothing += blk.nbytes
                        self._wake_reader(run)
                        continue
                    run.on_device[j] = dst
                    if self.trace:
                        run.events.append(Event(j, blk.name, "copy", t0 - run.t0, t1 - run.t0, blk.nbytes))
                    if run.main_waits == j:
                        self._ready.notify()
                    self._wake_reader(run)
        except Cancelled:
            return
        except BaseException as exc:  # handed to the executing thread, which raises it
            with cond:
                name = self.blocks[j].name or "<root>"
                run.error = (j, LayerfitError(f"copying unit {j} ({name}) to {self.device.torch_device} failed: {exc}"))
                self._ready.notify()

    def _check_order(self, run: _Run, i: int) -> None:
        """Streamed units run once each, in the prepared order: a unit run again, or
        inside another, would use released bytes or wait for a read that never comes.
        The pass begins at the first unit it runs, which the reader waits to know, and
        may skip units (see :meth:`_skip`)."""
        if not run.ordered:
            return
        if i not in run.units:
            part = f"units {run.units.start}-{run.units.stop - 1}" if len(run.units) else "no units"
            raise self._out_of_order(i, f"runs, but this pass streams {part}")
        if run.begin is None:
            with self._state:
                run.begin = run.started = run.done = i
                # The reader expects skips on two stages (with a copy stage it is not rewound).
                if run.source is None and self.device_ring is None:
                    seen = self._skips_seen.get(((run.units.start, run.units.stop, i), self._last_start), frozenset())
                    # (not a table read by rows when it runs, nor a kept unit: neither is read ahead)
                    run.expect_skipped = set(seen) - set(self._gathered) - self._kept
                self._room.notify()
                self._copyable.notify()
        if run.bound:
            running = self.blocks[next(iter(run.bound))].name or "<root>"
            raise self._out_of_order(i, f"runs inside unit {next(iter(run.bound))} ({running})")
        if i < run.done:
            raise self._out_of_order(i, "runs a second time")
        if i > run.done:
            if run.source is not None:
                skipped = self.blocks[run.done].name or "<root>"
                raise self._out_of_order(i, f"runs, but unit {run.done} ({skipped}) before it did not")
            self._skip(run, i)
        if i in run.expect_skipped:
            self._rewind(run, i)

    def _skip(self, run: _Run, i: int) -> None:
        """Unit ``i`` runs and the units between the last one that ran and it do not: a
        decoder step whose cross-attention keys and values are cached skips their
        projections. What was read (or copied) of them is given back and no more of them
        is read (bytes read ahead for nothing, but the output is the model's: a skipped
        unit is never bound). Each buffer is given back oldest first: here what is ready
        for the kernels; a read or copy under way by its thread when it ends; with a copy
        stage, the read buffer by the copier, in order."""
        three = self.device_ring is not None
        slots, ring = (run.on_device, self.device_ring) if three else (run.ready, self.ring)
        with self._state:
            for k in range(run.done, i):
                if slots[k] is not None:  # ready for the kernels: the oldest bytes in its ring
                    ring.release_locked(slots[k])
                    slots[k] = None
                    run.read_for_nothing += self.blocks[k].nbytes
            run.skipped_units.update(range(run.done, i))
            run.done = run.started = i
            self._wake_reader(run)
            if three:
                self._wake_copier(run)

    def _rewind(self, run: _Run, i: int) -> None:
        """Unit ``i`` runs, though the last such pass skipped it and so the reader did not
        read it: what the reader read ahead of it is discarded (the oldest bytes in the
        ring, in order; a read under way is discarded by the reader when it ends) and the
        reader goes back to ``i``. Bytes read twice, never a wrong one."""
        with self._state:
            run.expect_skipped.discard(i)
            for k in range(i + 1, run.units.stop):
                if run.ready[k] is not None:
                    self.ring.release_locked(run.ready[k])
                    run.ready[k] = None
                    run.read_for_nothing += self.blocks[k].nbytes
            run.epoch += 1
            run.rewind_to = i
            self._room.notify()

    def _gather_hook(self, i: int):
        """The pre-hook of an embedding read by rows: read the rows its ids look up, bind
        them as its weight and hand it each id's position among them instead of the id."""
        streamed_whole = self._pre_hook(i)  # with a unit source, the source supplies it whole
        table = self._gathered[i]

        def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
            run = self._run
            if run is None or run.source is not None:
                streamed_whole(module, args)
                return None
            self._check_order(run, i)
            ids = args[0] if args else kwargs.get("input")
            table.check_ids(ids)
            ring = self.ring
            # Every earlier unit was released and the reader waits for this one to have
            # its place, so the rows (and their read buffer) may use the whole ring.
            lookup = table.plan(
                ids, room=ring.capacity, verify=i not in self._verified_blocks, request_bytes=REQUEST_BYTES
            )
            with self._state:
                # Empty but for a skipped unit still being read, which the reader gives
                # back when its read ends: the rows wait for that, since placed after it
                # they would be given back first, and the ring gives back oldest first.
                while ring.in_use and run.error is None:
                    self._ready.wait()
                if run.error is not None:
                    raise LayerfitError(f"no room in the unit buffer for the rows of {table.name}")
                off = ring.allocate_locked(lookup.nbytes)  # planned to fit the whole ring
                run.bound[i] = off
                run.gathered[i] = module.padding_idx
                run.placed.add(i)
                self._room.notify()  # the reader may go on past the table
            t0 = time.perf_counter()
            weight = table.read(self.reader, lookup, ring.bytes[off : off + lookup.nbytes], ring.view[off:])
            t1 = time.perf_counter()
            if lookup.verify and self.verify != "always":
                self._verified.add(table.segment.index)
                self._verified_blocks.add(i)
            # padding_idx only shapes the gradient, but F.embedding checks it against the
            # rows bound: it is cleared while they are, and restored with the table.
            module.padding_idx = None
            table.binding.attach(weight)
            with self._state:
                if self.trace:
                    run.events.append(Event(i, self.blocks[i].name, "read", t0 - run.t0, t1 - run.t0, lookup.bytes_read))
                run.kernel_start[i] = t1 - run.t0
                run.started = i + 1
                self._wake_reader(run)
            positions = lookup.positions
            return ((positions, *args[1:]), kwargs) if args else (args, {**kwargs, "input": positions})

        return hook

    def _end_gather(self, run: _Run, i: int) -> None:
        """Put the meta table back in place of the rows (and the module's padding_idx)."""
        unbind(self._bindings[i])
        self._gathered[i].binding.module.padding_idx = run.gathered.pop(i)

    def _pre_hook(self, i: int):
        def hook(module: nn.Module, args: tuple) -> None:
            run = self._run
            if run is None:
                return
            self._check_order(run, i)
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
            if i in self._kept:  # bound for good: nothing to wait for
                run.bound[i] = -1
                with self._state:
                    run.kernel_start[i] = time.perf_counter() - run.t0
                    run.started = i + 1
                    self._wake_reader(run)
                    if self.device_ring is not None:
                        self._wake_copier(run)
                return
            # Without a copy stage the kernel uses the read buffer; with one, the device's.
            slots, ring = (run.ready, self.ring) if self.device_ring is None else (run.on_device, self.device_ring)
            with self._state:
                if slots[i] is None and run.error is None:
                    run.main_waits = i
                    self._wake_reader(run)  # the reader may be holding out for a batch
                    while slots[i] is None and run.error is None:
                        self._ready.wait()
                    run.main_waits = None
                if slots[i] is None:
                    failed, exc = run.error
                    if isinstance(exc, LayerfitError):
                        raise type(exc)(str(exc)) from exc
                    raise ReadError(f"reading unit {failed} failed: {exc}") from exc
                off = slots[i]
                # The kernel starts now (binding is part of it); the sync policy lets
                # the next read (and copy) begin from this moment.
                run.kernel_start[i] = time.perf_counter() - run.t0
                run.started = i + 1
                self._wake_reader(run)
                if self.device_ring is not None:
                    self._wake_copier(run)
            self.binder.bind(self._bindings[i], ring.bytes, off)
            run.bound[i] = off

        return hook

    def _post_hook(self, i: int):
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            run = self._run
            if run is None:
                return
            streaming = run.source is None and self.policy.name != "preload"
            if streaming:  # the unit's buffer may be reused only once its kernels finished
                self.device.finish_kernels()
            if self.trace:
                end = time.perf_counter() - run.t0
                with self._state:
                    run.events.append(
                        Event(i, self.blocks[i].name, "kernel", run.kernel_start[i], end, self.blocks[i].nbytes)
                    )
            if i not in run.bound:
                if not run.ordered:  # preload: every unit stays bound
                    with self._state:
                        run.done = i + 1
                    return
                raise self._out_of_order(i, "ends, but its first layer did not run")
            off = run.bound.pop(i)
            if i in run.gathered:  # and on to release its rows' place in the ring
                self._end_gather(run, i)
            if i in self._kept and run.source is None:
                with self._state:
                    run.done = i + 1
                    self._wake_reader(run)
                    if self.device_ring is not None:
                        self._wake_copier(run)
                return
            if run.source is not None:
                self.binder.unbind(self._bindings[i])
                run.source.release(i)
            elif streaming:
                self.binder.unbind(self._bindings[i])
                with self._state:
                    if self.device_ring is None:
                        self.ring.release_locked(off)
                    else:
                        self.device_ring.release_locked(off)
                        self._wake_copier(run)
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

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """The model's own ``generate`` (Hugging Face's), every forward pass it makes
        streamed by this engine; see :mod:`layerfit.engine.generation`."""
        from layerfit.engine.generation import generate

        return generate(self, *args, **kwargs)

    def part(self, name: str) -> Part:
        """Submodule ``name`` of the model (an encoder-decoder's ``model.encoder``),
        called like it, each call a pass that streams only its units; see
        :mod:`layerfit.engine.parts`."""
        return Part(self, name)

    def run_from(self, source: UnitSource | None, *args: Any, **kwargs: Any) -> Any:
        """Run the model with the units supplied by ``source`` (None: the reader thread).

        The same forward pass and hooks either way; a source (see
        :mod:`layerfit.engine.source`) decides when each unit's bytes are there and when
        its kernel may start — the multi-request scheduler drives engines this way.
        """
        return self.run_pass(source, self.model, args, kwargs)

    @torch.no_grad()
    def run_pass(
        self, source: UnitSource | None, forward: Any, args: tuple, kwargs: dict, units: range | None = None
    ) -> Any:
        """One forward pass of the model made by calling ``forward(*args, **kwargs)``:
        the model itself, (for :meth:`generate`) its ``forward`` method, or a part of it
        whose ``units`` are the only ones the pass may run (see :meth:`part`).

        A pass begins at the first unit it runs, so a decoder step given the encoder's
        output reads only the decoder, and runs the units after it in the prepared order,
        though it may skip some (a cached projection) or end before the
        last: a unit that does not run is never bound, so the output is the model's, and
        what the reader read of it ahead is read for nothing (``last_skipped``). A unit
        source supplies every unit, so a pass it drives runs them all.
        """
        if source is None and self.policy.name == "external":
            raise LayerfitError(
                "this engine has pipeline 'external': it runs only with a unit source "
                "(Engine.run_from); load it with another pipeline to call it directly"
            )
        if source is not None and self.device_ring is not None:
            raise LayerfitError("a unit source supplies host memory: run it on an engine with stages=2 on cpu")
        with self._lock:
            self._check_open()
            if self._lost is not None:
                raise LayerfitError(f"this engine cannot run: {self._lost}; reconfigure it or load the model again")
            self.reader.check_unchanged()
            self.pass_thread = threading.get_ident()
            run = _Run(len(self.blocks), units)
            if source is not None:
                run.begin = 0
            run.source = source
            run.ordered = source is not None or self.policy.name != "preload"
            self._run = run
            self.binder.reset()
            # Nothing to read ahead when every streamed unit is an embedding read by rows.
            streaming = source is None and self.policy.name != "preload" and self.ring is not None
            threads: list[threading.Thread] = []
            if streaming:
                self.ring.reset()
                threads.append(threading.Thread(target=self._reader_loop, args=(run,), name="layerfit-reader", daemon=True))
                if self.device_ring is not None:
                    self.device_ring.reset()
                    threads.append(threading.Thread(target=self._copier_loop, args=(run,), name="layerfit-copier", daemon=True))
                for thread in threads:
                    thread.start()
            try:
                try:
                    if self.arena is None:
                        out = forward(*args, **kwargs)
                    else:
                        out = self.arena.run(self.model, args, kwargs)  # generate() refuses planned mode
                except RuntimeError as exc:
                    if "device meta" not in str(exc):
                        raise
                    raise LayerfitError(f"{_UNBOUND_READ}: {exc}") from exc
                self.device.finish_kernels()  # latency counts the kernels, not their launch
                if run.done != run.units.stop:
                    if source is not None:  # it supplies every unit, and waits for each to run
                        ran = "none" if run.begin is None else f"units {run.begin}-{run.done - 1}"
                        raise LayerfitError(
                            f"the forward pass ran {ran} of units {run.units.start}-{run.units.stop - 1}, "
                            f"stopping short of the last: {_OTHER_PATH}"
                        )
                    if run.begin is not None and run.ordered:  # it ended before its last units
                        with self._state:
                            for k in range(run.done, run.units.stop):
                                run.skipped_units.add(k)
                                if run.ready[k] is not None:
                                    run.read_for_nothing += self.blocks[k].nbytes
                if run.begin is not None and run.ordered and run.source is None:
                    start = (run.units.start, run.units.stop, run.begin)
                    self._skips_seen[(start, self._last_start)] = frozenset(run.skipped_units)
                    self._last_start = start
                self._check_output(out)
            finally:
                end = time.perf_counter()
                if streaming:
                    for ring in (self.ring, self.device_ring):
                        if ring is not None:
                            ring.cancel()
                    for thread in threads:
                        thread.join()
                    for i in list(run.bound):
                        if i in run.gathered:
                            self._end_gather(run, i)
                        elif i not in self._kept:
                            self.binder.unbind(self._bindings[i])
                    run.bound.clear()
                elif source is not None:
                    for i in list(run.bound):
                        self.binder.unbind(self._bindings[i])
                    run.bound.clear()
                for i in list(run.gathered):
                    self._end_gather(run, i)
                self._run = None
                self.pass_thread = None
            if self.trace:
                self.last_timeline = Timeline(
                    self.policy.name,
                    self.memory.weight_bytes,
                    sorted(run.events, key=lambda e: (e.start, e.stage)),
                    self._occupancy(run.t0),
                    end - run.t0,
                )
            rings = [r.peak for r in (self.ring, self.device_ring) if r is not None]
            held = self.memory.resident_bytes + self.memory.kept_bytes
            self.last_weights_peak = held + sum(rings) + self.binder.peak_bytes
            self.last_skipped = (len(run.skipped_units), run.read_for_nothing)
            return out

    def _check_output(self, out: Any) -> None:
        """Refuse an output that is not the model's: a tensor left unbound (meta), or a
        view of the read (or device) buffer, whose bytes the next units overwrite.

        Capture keeps every weight read outside its module resident, so a model prepared
        by this version never trips either; one prepared by an older version may. A unit
        source's buffers (the scheduler's) are each one unit's own and stay mapped while
        a view lives, so a view of them keeps the model's bytes and needs no check.
        """
        streamed = {storage_address(r.bytes) for r in (self.ring, self.device_ring) if r is not None}
        streamed.discard(None)
        for leaf in tree_leaves(out):
            if not isinstance(leaf, torch.Tensor):
                continue
            if leaf.device.type == "meta":
                raise LayerfitError(f"{_UNBOUND_READ} (the output holds a tensor on device meta)")
            if storage_address(leaf) in streamed:
                raise LayerfitError(
                    "the model's output is a view of a streamed weight, whose bytes the engine "
                    "reuses; prepare the model again with this version of layerfit (it keeps "
                    "such weights resident)"
                )

    def _occupancy(self, t0: float) -> list[tuple[float, int]]:
        """Bytes held in the unit buffers over time (read + device buffer), from ``t0``."""
        rings = [r for r in (self.ring, self.device_ring) if r is not None]
        changes = sorted((t, k, b) for k, r in enumerate(rings) for t, b in r.history)
        held = [0] * len(rings)
        out = []
        for t, k, b in changes:
            held[k] = b
            out.append((max(t - t0, 0.0), self.memory.kept_bytes + sum(held)))
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
    def kept_units(self) -> tuple[int, ...]:
        """The units pipeline ``auto`` keeps resident beside the buffer, in order."""
        return tuple(sorted(self._kept))

    @property
    def rows_units(self) -> tuple[int, ...]:
        """The units read by the rows their ids look up (embedding tables), in order."""
        return tuple(sorted(self._gathered))

    @property
    def io_mode(self) -> str:
        """``direct`` (O_DIRECT) or ``buffered`` (fallback with fadvise DONTNEED)."""
        return self.reader.mode

    def _check_open(self) -> None:
        if self._closed:
            raise LayerfitError("this engine is closed: load the prepared model again to run it")

    def close(self) -> None:
        """Remove hooks and free the buffers and the file descriptor; calling the engine
        afterwards is a clear error. Closing twice does nothing more."""
        self._closed = True
        self._release_configuration()
        if getattr(self, "reader", None) is not None:
            self.reader.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(directory: str | Path, *, trust_factory: Iterable[str] = (), **kwargs: Any) -> Engine:
    """Load a prepared model; see :class:`Engine` for ``budget``, ``pipeline``, ``units``.

    ``trust_factory`` names modules whose factories a prepared folder may run (a folder
    prepared from your own ``mypkg.models:build`` needs ``["mypkg"]``); they stay trusted
    for the process, see :mod:`layerfit.store.trust`. Zoo models need none.
    """
    trust_factories([trust_factory] if isinstance(trust_factory, str) else trust_factory)
    return Engine(directory, **kwargs)


__all__ = ["BudgetError", "CorruptStoreError", "Engine", "MemoryPlan", "load"]
