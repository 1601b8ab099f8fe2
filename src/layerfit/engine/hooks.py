"""The forward hooks that tie the model's own ``forward`` to the stream.

Before a unit's first layer runs, its :class:`~layerfit.engine.kernels.PreHook` waits
until the unit's bytes are there and binds its weights by reference; after its last
layer, its :class:`~layerfit.engine.kernels.PostHook` unbinds them and gives the buffer
back (both are the kernel stage's, in :mod:`layerfit.engine.kernels`). An embedding table read by rows has a
:class:`GatherHook` instead, which reads the rows its ids look up, and a module of
experts an :class:`ExpertsHook`, which reads the experts its router chose; a router that
guesses the next MoE layer's experts a :class:`GuessHook`. A later layer of a
unit checks that the unit is bound (:class:`InnerHook`); a module that did not run at
prepare, and so has no stored weights, refuses to run (:class:`UnstoredHook`). Each hook
is an object holding its unit's index and the :class:`~layerfit.engine.stream.UnitStream`,
in the shape of Accelerate's ``ModelHook``: state is explicit, not a closure's. The hooks
here write no pass state themselves: they ask the kernel stage to take a unit's place and
start it, and record the experts' guesses and reads in the pass's
:class:`~layerfit.engine.expert_guess.PassGuesses`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from layerfit.engine.expert_guess import Guess, guess
from layerfit.engine.expert_places import ExpertPlace, assign, bind_compact, in_order, renumbered
from layerfit.engine.experts import ROUTED, ExpertTable
from layerfit.engine.kernels import PostHook, PreHook, SharedHook, UnitHook
from layerfit.engine.policies import REQUEST_BYTES
from layerfit.engine.stream import UnitStream
from layerfit.errors import LayerfitError


class PartialReadHook(UnitHook):
    """The pre-hook of a unit read in part when it runs (what its input chooses): it takes
    its place in the ring alone, reads there on the executing thread, then starts."""

    def __init__(self, stream: UnitStream, index: int) -> None:
        super().__init__(stream, index)
        self.whole = PreHook(stream, index)  # with a unit source, the source supplies it whole

    def begin(self, module: nn.Module, args: tuple) -> Any:
        """The pass this unit runs in, its order checked; None when there is nothing to
        read in part (no pass, or a unit source supplies the unit whole)."""
        run = self.stream.run
        if run is None or run.source is not None:
            self.whole(module, args)
            return None
        self.kernels.check_order(run, self.index)
        return run

    def place(self, run: Any, nbytes: int, saved: object, what: str) -> int:
        """Take ``nbytes`` of the ring for this unit (see
        :meth:`~layerfit.engine.kernels.KernelStage.place`)."""
        return self.kernels.place(run, self.index, nbytes, saved, what)

    def started(self, run: Any, t0: float, t1: float, nbytes: int) -> None:
        """The unit's read (``t0``..``t1``, ``nbytes``) is done and its kernels start."""
        self.kernels.started_after_read(run, self.index, t0, t1, nbytes)


class GatherHook(PartialReadHook):
    """The pre-hook of an embedding read by rows: read the rows its ids look up, bind
    them as its weight and hand it each id's position among them instead of the id."""

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        stream, i = self.stream, self.index
        run = self.begin(module, args)
        if run is None:
            return None
        table = stream.gathered[i]
        ids = args[0] if args else kwargs.get("input")
        if stream.device_ring is not None and isinstance(ids, torch.Tensor):
            ids = ids.cpu()  # three stages: the rows are looked up where they were read
        table.check_ids(ids)
        ring = stream.ring
        lookup = table.plan(
            ids, room=ring.capacity, verify=stream.units.needs_check(i), request_bytes=REQUEST_BYTES
        )
        if not lookup.verify:  # (a scan that verifies happens once) the read-ahead reserves as much
            stream.read_ahead.took(i, lookup.nbytes)
        off = self.place(run, lookup.nbytes, module.padding_idx, f"the rows of {table.name}")
        t0 = time.perf_counter()
        weight = table.read(stream.units.reader, lookup, ring.bytes[off : off + lookup.nbytes], ring.view[off:])
        t1 = time.perf_counter()
        if lookup.verify:
            stream.units.mark_verified(i, table.segment.index)
        # padding_idx only shapes the gradient, but F.embedding checks it against the
        # rows bound: it is cleared while they are, and restored with the table.
        module.padding_idx = None
        table.binding.attach(weight)
        self.started(run, t0, t1, lookup.bytes_read)
        positions = lookup.positions
        return ((positions, *args[1:]), kwargs) if args else (args, {**kwargs, "input": positions})


class ExpertsHook(PartialReadHook):
    """The pre-hook of a module of experts read by the experts its router chose. Bound
    compact where it may be (:mod:`layerfit.engine.expert_places`): the chosen experts in
    slots of a place of their own (the one the reader read this layer's guess into, or
    one taken now) and the router's choice renumbered to those slots; otherwise their
    pages read into the unit's whole place and the unit bound there."""

    def __call__(self, module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        stream, i = self.stream, self.index
        run = self.begin(module, args)
        if run is None:
            return None
        table = stream.gathered[i]
        chosen = args[1] if len(args) > 1 else kwargs.get(ROUTED)
        try:
            if i in stream.compact_units and not stream.units.needs_check(i) and _routes(chosen, table.count):
                index = self._compact(run, table, chosen)
                return ((args[0], index, *args[2:]), kwargs) if len(args) > 1 else (args, {**kwargs, ROUTED: index})
            self._whole(run, table, chosen)
            return None
        finally:
            with stream.state:  # a guess held until this layer's own experts are read may be read
                stream.guesses_made.layer_read(i)
                stream.reader.layer_read(i)

    def _whole(self, run: Any, table: ExpertTable, chosen: object) -> None:
        """Read the chosen experts' pages into the unit's whole place and bind it there."""
        stream, i, ring = self.stream, self.index, self.stream.ring
        lookup = table.plan(chosen, verify=stream.units.needs_check(i))
        off = self.place(run, table.nbytes, None, f"the experts of {table.name}")
        t0 = time.perf_counter()
        read = table.read(stream.units.reader, lookup, ring.view[off : off + table.nbytes], stream.expert_cache, i)
        t1 = time.perf_counter()
        if lookup.verify:
            stream.units.mark_verified(i, table.segment.index)
        stream.binder.bind(stream.bindings[i], ring.bytes, off)
        self.started(run, t0, t1, read)

    def _compact(self, run: Any, table: ExpertTable, chosen: torch.Tensor) -> torch.Tensor:
        """Fill a compact place with the chosen experts (those the guess missed: from the
        expert cache, else read), bind the unit over it; the router's choice renumbered."""
        stream, i, ring, cache = self.stream, self.index, self.stream.ring, self.stream.expert_cache
        experts = sorted({int(e) for e in chosen.reshape(-1).tolist() if e < table.count})
        place = self._read_ahead(run)
        if place is None:
            off = self.place(run, len(experts) * table.slot_bytes, None, f"the experts of {table.name}")
            place = ExpertPlace(off, [None] * len(experts))
        guessed = {e for e in place.slots if e is not None}
        made = stream.guesses_made.guessed.get(i)
        if made is not None:  # how right the guess was, read or not, by rank
            with stream.state:
                stream.guesses.score(made, experts)
        fills = assign(place, experts)
        if fills is None:  # no slots in the experts' order for those the guess missed
            fills = in_order(place, experts)
        stream.guesses.read += len(guessed)
        stream.guesses.chosen += len(guessed & set(experts))
        filled = {e for e, _ in fills}
        if cache is not None:
            for e in set(experts) - filled:
                cache.chose(i, e)
        t0, read = time.perf_counter(), 0
        what = f"unit {table.segment.index} ({table.name})"
        for e, s in fills:
            at = place.offset + s * table.slot_bytes
            slot, inside = ring.view[at : at + table.slot_bytes], table.slot_slices(e)
            if cache is not None and cache.load(i, e, slot, inside):
                continue
            read += table.read_slot(stream.units.reader, e, slot, what)
            if cache is not None:
                cache.store(i, e, slot, inside)
        t1 = time.perf_counter()
        count = bind_compact(table, ring.bytes, place)
        self.kernels.restores(run, i, count)  # with the meta tensors when the unit ends
        self.started(run, t0, t1, read)
        return renumbered(chosen, place, table.count)

    def _read_ahead(self, run: Any) -> ExpertPlace | None:
        """The compact place the reader read this unit's guess into, once that read has
        ended; None when it took none (nor will now: the unit takes its own place)."""
        return self.kernels.take_read_ahead(run, self.index)


def _routes(chosen: object, count: int) -> bool:
    """Whether ``chosen`` is a router's choice a compact place can serve: integer ids of
    experts (``count``: no expert), at least one an expert."""
    return (
        isinstance(chosen, torch.Tensor) and not chosen.is_floating_point() and chosen.dim() >= 1
        and chosen.numel() > 0 and bool((chosen >= 0).all()) and bool((chosen <= count).all())
        and bool((chosen < count).any())
    )


class GuessHook(SharedHook):
    """Before the router of a MoE layer: guess what the next MoE layer's router will
    choose from the same input, for the reader to read those experts ahead
    (:mod:`layerfit.engine.expert_guess`). Not while the guessed unit is still to be
    verified (its first read is whole)."""

    def __init__(self, stream: UnitStream, guess: Guess) -> None:
        self.stream = stream
        self.guess = guess

    def __call__(self, module: nn.Module, args: tuple) -> None:
        stream, unit = self.stream, self.guess.unit
        run = stream.run
        if run is None or run.source is not None or not args or stream.units.needs_check(unit):
            return
        guessed = guess(self.guess, args[0])
        if guessed is None:
            return
        with stream.state:
            stream.guesses_made.made(unit, guessed)
            stream.reader.guess_made(unit)


class InnerHook(UnitHook):
    """Before a later layer of the unit: the unit must be bound (its first layer ran)."""

    def __init__(self, stream: UnitStream, index: int, name: str) -> None:
        super().__init__(stream, index)
        self.name = name

    def __call__(self, module: nn.Module, args: tuple) -> None:
        stream, i = self.stream, self.index
        run = stream.run
        if run is None or i in self.kernels.bound or not run.ordered:
            return
        first = stream.blocks[i].segments[0].name or "<root>"
        raise stream.out_of_order(i, f"runs {self.name or '<root>'}, but not its first layer {first}")


class UnstoredHook(SharedHook):
    """Before a module that did not run at prepare: its weights were never stored, so
    running it now would compute with the skeleton's meta tensors."""

    def __init__(self, stream: UnitStream, name: str) -> None:
        self.stream = stream
        self.name = name

    def __call__(self, module: nn.Module, args: tuple) -> None:
        if self.stream.run is not None:
            name = self.name or "<root>"
            raise LayerfitError(
                f"module {name} runs, but it did not run on the example input at prepare, so "
                f"its weights were not stored (a branch that depends on the input): prepare "
                f"the model with an input that runs {name}"
            )


def install_hooks(
    stream: UnitStream, modules: dict[str, nn.Module], unused: Iterable[str],
    guesses: Iterable[tuple[nn.Module, Guess]] = (),
) -> list[RemovableHandle]:
    """Hook every unit of ``stream``'s configuration into ``modules`` (the model's, by
    name), every module owning an ``unused`` tensor (one that did not run at prepare),
    and each router that guesses the next MoE layer's experts (``guesses``: the router
    and its guess; after its unit's own hook, which binds it)."""
    handles = []
    for i, blk in enumerate(stream.blocks):
        first, last = modules[blk.segments[0].name], modules[blk.segments[-1].name]
        if isinstance(stream.gathered.get(i), ExpertTable):
            handles.append(first.register_forward_pre_hook(ExpertsHook(stream, i).__call__, with_kwargs=True))
        elif i in stream.gathered:
            handles.append(first.register_forward_pre_hook(GatherHook(stream, i).__call__, with_kwargs=True))
        else:
            handles.append(first.register_forward_pre_hook(PreHook(stream, i).__call__))
        handles.append(last.register_forward_hook(PostHook(stream, i).__call__))
        for seg in blk.segments[1:]:  # a later layer of the block needs the block bound
            handles.append(modules[seg.name].register_forward_pre_hook(InnerHook(stream, i, seg.name).__call__))
    for router, planned in guesses:
        handles.append(router.register_forward_pre_hook(GuessHook(stream, planned).__call__))
    for name in sorted({n.rpartition(".")[0] for n in unused}):
        module = modules.get(name)
        if module is not None:
            handles.append(module.register_forward_pre_hook(UnstoredHook(stream, name).__call__))
    return handles


__all__ = ["ExpertsHook", "GatherHook", "GuessHook", "InnerHook", "PostHook", "PreHook", "UnstoredHook", "install_hooks"]
