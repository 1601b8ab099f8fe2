"""The streaming engine: one prepared model executed under a weight-memory budget.

:class:`Engine` is the facade a user calls like the model. It loads a prepared folder,
builds the model's skeleton (every weight on device meta), reads the resident tensors,
and configures itself from a :class:`~layerfit.engine.config.EngineConfig`: the pure
plan (:mod:`layerfit.engine.plan`) says what it holds and streams, the buffers
(:mod:`layerfit.engine.buffers`) hold it, the stream (:mod:`layerfit.engine.stream`)
runs a pass's stages (reader, copier, kernels) and hooks (:mod:`layerfit.engine.hooks`)
tie the model's own ``forward`` to the kernel stage. A pass of a part of the model
(:mod:`layerfit.engine.parts`) and Hugging Face's ``generate``
(:mod:`layerfit.engine.generation`) run through :meth:`Engine.run_pass`.

Full SHA-256 verification happens on the first read of each unit; every inference
starts with a cheap check that the weights file was not replaced or modified.
"""

from __future__ import annotations

import dataclasses
import mmap
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from layerfit.capture.units import storage_address
from layerfit.engine.arena import PlannedActivations, make_activations
from layerfit.engine.binding import Binder, get_binder
from layerfit.engine.buffers import WeightBuffers
from layerfit.engine.config import EngineConfig
from layerfit.engine.device import Device, get_device
from layerfit.engine.expert_guess import ExpertMemory, expert_memory
from layerfit.engine.experts import experts_segment
from layerfit.engine.fit_memory import MemoryRoom, within
from layerfit.engine.gather import table_of
from layerfit.engine.generation import generate
from layerfit.engine.hooks import install_hooks
from layerfit.engine.parts import Part
from layerfit.engine.pass_state import PassState
from layerfit.engine.plan import EnginePlan, MemoryPlan, plan
from layerfit.engine.policies import Policy
from layerfit.engine.positions import check_call
from layerfit.engine.ring import RingBuffer
from layerfit.engine.skeleton import (
    Binding,
    bind,
    build_skeleton,
    read_extent,
    report_device,
    segment_bindings,
)
from layerfit.engine.source import UnitSource
from layerfit.engine.stream import OTHER_PATH, UnitStream
from layerfit.engine.trace import Timeline
from layerfit.engine.unit_reader import UnitReader
from layerfit.engine.units import Block
from layerfit.errors import BudgetError, CorruptStoreError, LayerfitError
from layerfit.memory_limit import Footprint
from layerfit.sizes import Budget
from layerfit.store.manifest import Manifest, read_manifest
from layerfit.store.reader import SegmentReader, aligned_buffer, verify_segment
from layerfit.store.trust import trust_factories

_UNBOUND_READ = (
    "the forward pass read a weight outside the module that owns it while it was not loaded "
    "(on a path the example input did not take at prepare, or in a model prepared by an "
    "older layerfit); prepare the model again, with an input that takes this path"
)


class Engine:
    """A prepared model you call like the model, executed within a weight budget.

    Settings are an :class:`~layerfit.engine.config.EngineConfig` (``config``), or its
    fields as keyword arguments read as the Python API reads them
    (:meth:`EngineConfig.parse <layerfit.engine.config.EngineConfig.parse>`):
    ``budget`` in bytes, a size (``"24MB"``) or a share of the weights (``"50%"``);
    ``pipeline`` (``auto`` by default: ``preload`` when the budget holds every weight
    or none is given, else ``async`` keeping units resident with the room beyond its
    buffer); ``units``; ``coalesce``; ``device`` and ``stages``; and the rest. The
    budget counts weight buffers (resident tensors plus the unit buffers); it must be
    at least the resident tensors plus the largest unit. ``pipeline`` keeps what was
    asked, ``policy`` says what runs and ``kept_units`` what stays.
    """

    def __init__(self, directory: str | Path, config: EngineConfig | None = None, **options: Any) -> None:
        if config is not None and options:
            raise LayerfitError(f"give an EngineConfig or keyword options, not both ({', '.join(options)})")
        self.config: EngineConfig = config if config is not None else EngineConfig.parse(**options)
        cfg = self.config
        self.directory = Path(directory)
        self.device: Device = get_device(cfg.device, cfg.stages)
        self.manifest: Manifest = read_manifest(self.directory)
        self.binder: Binder = get_binder(cfg.binding, counts_made=self.manifest.quantized)
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
            self.directory / self.manifest.weights_file, self.manifest.weights_size, direct=cfg.direct_io
        )
        self.units = UnitReader(self.reader, cfg.verify)
        self.buffers = WeightBuffers(self.device, cfg.trace)
        self.stream = UnitStream(self.device, self.units, self.buffers, self.binder, cfg.coalesce_bytes, cfg.trace,
                                 cfg.read_ahead)
        self._lock = threading.Lock()  # one inference at a time per engine
        self.pass_thread: int | None = None  # the thread running a pass, while one runs
        self.generating = threading.Lock()  # one generate() at a time (it overrides forward)
        self.last_timeline: Timeline | None = None
        # The last pass's units that did not run (after its first), and the bytes the
        # reader had read of them for nothing.
        self.last_skipped: tuple[int, int] = (0, 0)
        self.last_read_ahead = 0  # bytes of units the last pass adopted, read before it began
        self.last_weights_peak = 0
        self.plan: EnginePlan | None = None
        self._hooks: list = []
        self._experts = ExpertMemory()  # the expert cache and what reads ahead into it
        self._resident_buf: mmap.mmap | None = None
        self._preloaded = False  # every unit bound for good (preload policy)
        self._lost: str | None = None  # why the configuration was lost (a failed re-read)
        self._closed = False
        self.arena: PlannedActivations | None = None  # activations="planned": one arena
        self.footprint: Footprint | None = None  # measured where a memory limit bounds the process
        try:
            self.arena = make_activations(cfg.activations, self.manifest)
            room = None if cfg.memory_limit is None else MemoryRoom(self, cfg)  # refused before a weight is read
            self._resident_buf = read_resident(self.manifest, self.reader, self.model, self.device, cfg.verify,
                                               packed=not cfg.dequantize)  # a GGUF model's linears run packed
            if room is None:
                self._configure(cfg)
            else:
                self.footprint = room.fit()
        except BaseException:
            self.close()
            raise

    # --- configuration ------------------------------------------------------------------

    def _bindings_of(self, blocks: tuple[Block, ...], config: EngineConfig) -> list[list[Binding]]:
        """Where each unit's tensors are bound in the skeleton (its own meta tensors as
        the ones unbinding restores, whatever another configuration has bound)."""
        skeleton, packed = self._skeleton_tensors, not config.dequantize
        return [
            [
                dataclasses.replace(b, meta=skeleton.get((id(b.module), b.attr), b.meta))
                for seg in block.segments
                for b in segment_bindings(self.model, seg, seg.offset - block.offset, self._modules, packed=packed)
            ]
            for block in blocks
        ]

    def _configure(self, config: EngineConfig) -> None:
        """Plan ``config``, size the buffers for it, install the hooks, read what stays."""
        new = plan(self.manifest, config, self.model)
        bindings = self._bindings_of(new.blocks, config)
        tables = {i: table_of(new.blocks[i].segments[0], bindings[i]) for i in new.weights.gathered}
        # Everything is validated: replace the old configuration, reusing the buffer's
        # mapping when the new capacity fits it.
        self._release_configuration(keep_ring=True)
        self.config, self.plan = config, new
        self.units.configure(new.blocks, {i: read_extent(bindings[i], block.nbytes)
                                          for i, block in enumerate(new.blocks) if i not in new.weights.gathered})
        weights = new.weights
        self.buffers.resize(weights.buffer_bytes, weights.device_buffer_bytes, self.stream.room, self.stream.copyable)
        experts = [u.name for u in self.manifest.units if experts_segment(u)]
        self._experts = expert_memory(weights.expert_cache_bytes, tables, self._modules, experts,
                                      read_ahead=config.expert_prefetch, compact=self.binder.name == "reference")
        self.stream.configure(weights.policy, new.blocks, bindings, weights.kept, tables, self._experts)
        self._hooks = install_hooks(self.stream, self._modules, self.manifest.graph.unused, self._experts.guesses)
        self._preloaded = weights.policy.resident
        try:
            if self._preloaded:
                self.buffers.preload(range(len(new.blocks)), self.units, bindings)
            if weights.kept:
                self.buffers.keep(weights.kept_bytes, sorted(weights.kept), self.units, bindings)
        except BaseException as exc:
            # The old configuration is gone and the new one incomplete: hold nothing,
            # and refuse to run until a configuration succeeds.
            self._release_configuration()
            self._lost = f"reading its weights for the new configuration failed ({exc})"
            raise
        self._lost = None

    def reconfigure(
        self,
        config: EngineConfig | None = None,
        *,
        budget: Budget | int | str | None = None,
        units: str | list[int] | None = None,
        pipeline: str | None = None,
    ) -> float:
        """Apply a new budget, unit partition and/or pipeline between inferences; seconds.

        Either a whole ``config`` that differs from the current one only in those three,
        or the three as keywords (a budget not given is none: the pipeline's own size).
        The model is not reloaded: only the buffer and the unit grouping change. A
        budget below the minimum, or beyond what a memory limit leaves (the budget it
        leaves is the one not given then), is refused and the old configuration keeps running.
        """
        t0 = time.perf_counter()
        with self._lock:
            self._check_open()
            if config is None:
                changes: dict[str, Any] = {"budget": None if budget is None else Budget.parse(budget)}
                if units is not None:
                    changes["units"] = units if isinstance(units, str) else tuple(units)
                if pipeline is not None:
                    changes["pipeline"] = pipeline
                config = self.config.replace(**changes)  # checked before anything changes
            else:
                self._check_reconfigurable(config)
            self._configure(config if self.footprint is None else within(self.footprint, config, self.manifest))
        return time.perf_counter() - t0

    def _check_reconfigurable(self, config: EngineConfig) -> None:
        """Refuse a config that changes more than the budget, units and pipeline."""
        kept = self.config.replace(budget=config.budget, units=config.units, pipeline=config.pipeline)
        changed = [f.name for f in dataclasses.fields(config) if getattr(config, f.name) != getattr(kept, f.name)]
        if changed:
            raise LayerfitError(
                f"reconfigure changes the budget, units and pipeline only; {', '.join(changed)} need a new load"
            )

    def _release_configuration(self, keep_ring: bool = False) -> None:
        self.stream.unconfigure(unbind_all=self._preloaded)  # its read-ahead stopped, nothing bound
        self._preloaded = False
        self._experts.close()
        self._experts = ExpertMemory()
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        self.buffers.release_kept()
        if not keep_ring:
            self.buffers.close()

    # --- inference ----------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the model on ``args``; the engine's reader thread supplies the units."""
        return self.run_from(None, *args, **kwargs)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """The model's own ``generate`` (Hugging Face's), every forward pass it makes
        streamed by this engine; see :mod:`layerfit.engine.generation`. A prompt longer
        than the model's positions is refused before the first pass."""
        check_call(self.manifest, self.model, args, {k: v for k, v in kwargs.items() if k == "input_ids"})
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
        An input longer than the model's positions is refused here, in one line
        (:class:`~layerfit.errors.RequestTooLargeError`), before the pass begins.
        """
        check_call(self.manifest, self.model, args, kwargs)
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
        if source is None and self.policy.external:
            raise LayerfitError(
                "this engine has pipeline 'external': it runs only with a unit source "
                "(Engine.run_from); load it with another pipeline to call it directly"
            )
        if source is not None and self.buffers.device_ring is not None:
            raise LayerfitError("a unit source supplies host memory: run it on an engine with stages=2 on cpu")
        with self._lock:
            self._check_open()
            if self._lost is not None:
                raise LayerfitError(f"this engine cannot run: {self._lost}; reconfigure it or load the model again")
            self.reader.check_unchanged()
            ahead = self.stream.read_ahead.take()  # read for this pass after the last one
            self.pass_thread = threading.get_ident()
            run = PassState(len(self.blocks), units, source, ordered=source is not None or not self.policy.resident)
            self.binder.reset()
            # Nothing to read ahead when every streamed unit is an embedding read by rows.
            streaming = source is None and not self.policy.resident and self.buffers.ring is not None
            threads = self.stream.begin_pass(run, ahead, streaming)
            try:
                out = self._forward(forward, args, kwargs)
                if run.done != run.units.stop and source is not None:
                    # it supplies every unit, and waits for each to run
                    ran = "none" if run.begin is None else f"units {run.begin}-{run.done - 1}"
                    raise LayerfitError(
                        f"the forward pass ran {ran} of units {run.units.start}-{run.units.stop - 1}, "
                        f"stopping short of the last: {OTHER_PATH}"
                    )
                self.stream.record_skips(run)
                check_output(out, self.buffers.streamed_addresses())
            finally:
                end = time.perf_counter()
                self.stream.end_pass(run, threads, streaming)
                self.pass_thread = None
            self._account(run, end)
            if streaming:
                self.stream.read_next(run)  # while the caller works until the next pass
            return out

    def _forward(self, forward: Any, args: tuple, kwargs: dict) -> Any:
        """Call the forward pass (in the planned arena, if any), then wait for its kernels."""
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
        return out

    def _account(self, run: PassState, end: float) -> None:
        """What the pass held and skipped, and its timeline when tracing."""
        memory = self.memory
        events, skipped, read_for_nothing, read_ahead = self.stream.outcome()
        if self.config.trace:
            self.last_timeline = Timeline(
                self.policy.name,
                memory.weight_bytes,
                sorted(events, key=lambda e: (e.start, e.stage)),
                self.buffers.occupancy(run.t0, memory.kept_bytes),
                end - run.t0,
            )
        rings = [r.peak for r in self.buffers.streaming_rings]
        cached = self._experts.cache.capacity if self._experts.cache is not None else 0  # its slots, pre-faulted
        self.last_weights_peak = memory.resident_bytes + memory.kept_bytes + sum(rings) + self.binder.peak_bytes + cached
        self.last_skipped = (skipped, read_for_nothing)
        self.last_read_ahead = read_ahead

    # --- reading units for a unit source --------------------------------------------------

    def read_unit(self, i: int, into: memoryview) -> None:
        """Read unit ``i`` into ``into``; see :meth:`UnitReader.read_unit`."""
        self.units.read_unit(i, into)

    def read_unit_buffer(self, i: int) -> mmap.mmap:
        """Unit ``i`` in a fresh buffer of its own; see :meth:`UnitReader.read_unit_buffer`."""
        return self.units.read_unit_buffer(i)

    def share_verification(self, other: Engine) -> None:
        """Trust the units ``other`` has verified when both read the same weights file in
        the same units: a pool of engines of one model checks each unit once."""
        self.units.share_verification(other.units)

    # --- what it is configured as ---------------------------------------------------------

    @property
    def blocks(self) -> tuple[Block, ...]:
        """The streamed units of the current configuration, in order."""
        return self.plan.blocks

    @property
    def memory(self) -> MemoryPlan:
        """What the engine holds for weights."""
        return self.plan.memory

    @property
    def policy(self) -> Policy:
        """The policy that runs (``auto`` picks one per budget)."""
        return self.plan.weights.policy

    @property
    def pipeline(self) -> str:
        """The pipeline as asked."""
        return self.config.pipeline

    @property
    def trace(self) -> bool:
        """Whether each pass records a timeline (``last_timeline``)."""
        return self.config.trace

    @trace.setter
    def trace(self, on: bool) -> None:
        """Record a timeline of each pass from the next one on (or stop): a traced run
        followed by untraced ones for timing needs no second load."""
        self.config = self.config.replace(trace=on)
        self.stream.trace = self.buffers.trace = on
        for ring in self.buffers.streaming_rings:
            ring.record_history = on

    @property
    def bytes_read(self) -> int:
        """Bytes read from storage since the model was loaded."""
        return self.reader.bytes_read

    @property
    def ring(self) -> RingBuffer | None:
        """The read buffer."""
        return self.buffers.ring

    @property
    def expert_cache(self) -> dict[str, float] | None:
        """The expert cache's hits, misses, hit rate and bytes (None: no cache in this
        configuration; see :mod:`layerfit.engine.expert_cache`)."""
        cache = self._experts.cache
        return None if cache is None else cache.stats

    @property
    def expert_guesses(self) -> dict[str, int]:
        """The routed units whose experts are guessed a layer early and read ahead
        (:mod:`layerfit.engine.expert_guess`), the experts so read over this
        configuration, and how many of them their layer chose."""
        return self.stream.guess_counts()

    @property
    def kept_units(self) -> tuple[int, ...]:
        """The units pipeline ``auto`` keeps resident beside the buffer, in order."""
        return self.stream.kept_units

    @property
    def rows_units(self) -> tuple[int, ...]:
        """The units read by the rows their ids look up (embedding tables), in order."""
        return self.stream.rows_units

    @property
    def io_mode(self) -> str:
        """``direct`` (O_DIRECT) or ``buffered`` (fallback with fadvise DONTNEED)."""
        return self.reader.mode

    # --- lifetime -------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise LayerfitError("this engine is closed: load the prepared model again to run it")

    def close(self) -> None:
        """Remove hooks and free the buffers and the file descriptor; calling the engine
        afterwards is a clear error. Closing twice does nothing more."""
        self._closed = True
        if getattr(self, "stream", None) is not None:
            self._release_configuration()
        if getattr(self, "reader", None) is not None:
            self.reader.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_output(out: Any, streamed: set[int]) -> None:
    """Refuse an output that is not the model's: a tensor left unbound (meta), or a
    view of the read (or device) buffer (``streamed``: their storage addresses), whose
    bytes the next units overwrite.

    Capture keeps every weight read outside its module resident, so a model prepared
    by this version never trips either; one prepared by an older version may. A unit
    source's buffers (the scheduler's) are each one unit's own and stay mapped while
    a view lives, so a view of them keeps the model's bytes and needs no check.
    """
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


def read_resident(
    manifest: Manifest, reader: SegmentReader, model: nn.Module, device: Device, verify: str, *, packed: bool = False
) -> mmap.mmap | None:
    """Read ``manifest``'s resident tensors once, verify them unless ``verify`` is
    ``never``, and bind them into ``model`` for good (quantized linear weights packed
    where ``packed``); their buffer (None: none)."""
    if manifest.resident is None:
        return None
    buffer = aligned_buffer(manifest.resident.nbytes)
    view = memoryview(buffer)
    reader.read(manifest.resident, view)
    if verify != "never":
        verify_segment(manifest.resident, view)
    view.release()
    resident = torch.frombuffer(buffer, dtype=torch.uint8)
    if device.name != "cpu":
        resident = resident.to(device.torch_device)  # kept alive by the bound views
    bind(segment_bindings(model, manifest.resident, packed=packed), resident, 0)
    return buffer


def load(
    directory: str | Path,
    config: EngineConfig | None = None,
    *,
    trust_factory: Iterable[str] = (),
    **options: Any,
) -> Engine:
    """Load a prepared model; see :class:`Engine` for ``budget``, ``pipeline``, ``units``.

    ``trust_factory`` names modules whose factories a prepared folder may run (a folder
    prepared from your own ``mypkg.models:build`` needs ``["mypkg"]``); they stay trusted
    for the process, see :mod:`layerfit.store.trust`. Zoo models need none.
    """
    trust_factories([trust_factory] if isinstance(trust_factory, str) else trust_factory)
    return Engine(directory, config, **options)


__all__ = ["BudgetError", "CorruptStoreError", "Engine", "EngineConfig", "MemoryPlan", "load"]
