"""Experts read ahead: the next MoE layer's experts, guessed a layer early, read while the
layers before it run.

A routed layer reads its experts once its router has chosen them, on the executing
thread (:mod:`layerfit.engine.experts`): the kernels wait for the disk at every MoE
layer. But the hidden state changes little from one layer to the next (the residual
stream), so the next MoE layer's router applied to the hidden state entering this
layer's router guesses much of its choice a layer early (speculative expert loading:
Eliseev and Mazur, *Fast Inference of Mixture-of-Experts Language Models with
Offloading*, 2023). So when a router runs, the routed experts unit of the MoE layer
after it gets a guess: each token's top-k under that layer's router weight, which must
be in memory (kept or resident, as ``auto`` keeps small routers). A thread of its own
reads the guessed experts not held already into the expert cache's slots for reading
ahead (:class:`~layerfit.engine.expert_cache.ExpertCache`), in the guess's order (every
token's first choice, then its second, ...), starting once the current layer's own
experts are read: a routed layer's experts hook starts it (:meth:`ExpertPrefetch.go`),
so a guess never delays a read its own layer waits for.

A right guess turns a read on the executing thread into a copy from memory; a wrong one
costs a read nobody waited for, and its slot is freed when the layer has run. Whatever
the guess, the output is the model's to the bit: a guess decides which bytes are read
early, never which experts run or what they compute. Each read ahead is in the pass's
timeline (a read of the experts unit), so bytes per token count it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from layerfit.engine.expert_cache import ExpertCache
from layerfit.engine.experts import ExpertTable
from layerfit.store.reader import SegmentReader

ROUTER_NAMES = ("gate", "router")
"""Where transformers' sparse MoE blocks keep their router, beside their experts."""

Record = Callable[[int, float, float, int], None]
"""Told of each read ahead: (unit, start, end, bytes), perf_counter seconds."""


@dataclass(frozen=True)
class Guess:
    """How to guess what routed experts unit ``unit`` will choose: with ``router`` (its
    own layer's router, whose ``weight`` is [experts, hidden]) applied to what enters the
    router of the MoE layer before it, ``top_k`` per token. ``hold``: that layer's own
    experts are routed too, so the reads wait for its experts hook (:meth:`ExpertPrefetch.go`)."""

    unit: int
    router: nn.Module
    top_k: int
    hold: bool


def router_of(experts: nn.Module, parent: nn.Module) -> nn.Module | None:
    """The router beside ``experts`` in ``parent`` (its sparse MoE block): a child named
    like one whose ``weight`` has a row per expert, or None."""
    count = next((p.shape[0] for p in experts.parameters(recurse=False) if p.dim() >= 3), None)
    for name in ROUTER_NAMES:
        child = getattr(parent, name, None)
        weight = getattr(child, "weight", None)
        if isinstance(child, nn.Module) and isinstance(weight, torch.Tensor) and weight.dim() == 2 \
                and weight.shape[0] == count:
            return child
    return None


def plan_guesses(
    modules: Mapping[str, nn.Module], experts_names: Iterable[str], tables: Mapping[int, ExpertTable],
) -> dict[int, tuple[nn.Module, Guess]]:
    """For each routed unit in ``tables`` (its index → its table), the router whose input
    guesses it (the router of the MoE layer before it) and its :class:`Guess`, keyed by
    that router's ``id``. ``experts_names``: every module of experts in the order they run
    (kept whole or routed). A unit gets no guess when it is its model's first MoE layer,
    when a router is not found, or when its router says no ``top_k``."""
    routed = {table.name: unit for unit, table in tables.items()}
    routers: list[tuple[str, nn.Module | None]] = []
    for name in experts_names:
        parent = modules.get(name.rpartition(".")[0]) if "." in name else None
        experts = modules.get(name)
        routers.append((name, None if parent is None or experts is None else router_of(experts, parent)))
    out: dict[int, tuple[nn.Module, Guess]] = {}
    for (before, trigger), (name, router) in zip(routers, routers[1:], strict=False):
        unit = routed.get(name)
        top_k = getattr(router, "top_k", None)
        if unit is None or trigger is None or router is None or not isinstance(top_k, int) or top_k < 1:
            continue
        out[id(trigger)] = (trigger, Guess(unit, router, top_k, hold=before in routed))
    return out


class ExpertPrefetch:
    """Reads guessed experts into ``cache``'s slots for reading ahead, on its own thread,
    from ``reader``; ``tables``: the routed units' tables; ``record`` is told of each read."""

    def __init__(self, cache: ExpertCache, reader: SegmentReader, tables: Mapping[int, ExpertTable],
                 record: Record) -> None:
        self.cache = cache
        self.reader = reader
        self.tables = tables
        self.record = record
        self._cond = threading.Condition()
        self._next: tuple[int, tuple[int, ...]] | None = None  # the guess to read next: (unit, experts)
        self._held = False  # it waits for the current layer's experts hook
        self._busy = False  # a guess is being read
        self._closed = False
        self._thread: threading.Thread | None = None
        self.guesses = 0

    def guess(self, guess: Guess, hidden: object) -> None:
        """Guess ``guess.unit``'s experts from ``hidden`` (what enters the router before
        it) and have them read ahead; nothing when its router's weight is not in memory."""
        weight = getattr(guess.router, "weight", None)
        if not isinstance(hidden, torch.Tensor) or not isinstance(weight, torch.Tensor) or weight.is_meta \
                or hidden.shape[-1] != weight.shape[1] or hidden.device != weight.device:
            return
        with torch.no_grad():
            logits = torch.nn.functional.linear(hidden.reshape(-1, weight.shape[1]).to(weight.dtype), weight)
            top = logits.topk(min(guess.top_k, weight.shape[0]), dim=-1).indices
        experts = tuple(dict.fromkeys(top.t().reshape(-1).tolist()))  # every token's first choice, then second, ...
        self.cache.expect(guess.unit)
        with self._cond:
            self._next, self._held = (guess.unit, experts), guess.hold
            self.guesses += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="layerfit-experts-ahead", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def go(self) -> None:
        """The current layer's experts are read: the guess for the next one may be read."""
        with self._cond:
            if self._held:
                self._held = False
                self._cond.notify_all()

    def end_pass(self) -> None:
        """A pass ended (or failed): drop the guess not read yet, wait for the read under
        way, and free what was read ahead for a unit that did not run."""
        with self._cond:
            self._next = None
            while self._busy:
                self._cond.wait()
        self.cache.settle_all()

    def close(self) -> None:
        """Stop the thread (after its read under way)."""
        with self._cond:
            self._closed = True
            self._next = None
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (self._next is None or self._held):
                    self._cond.wait()
                if self._closed:
                    return
                (unit, experts), self._next = self._next, None
                self._busy = True
            try:
                self._read(unit, experts)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _read(self, unit: int, experts: tuple[int, ...]) -> None:
        """Read ``experts`` of ``unit`` into free slots for reading ahead, while it is
        still to run (the cache refuses a slot once it has run, or when none is free)."""
        table = self.tables[unit]
        what = f"unit {table.segment.index} ({table.name}), read ahead"
        for expert in experts:
            if self._closed:
                return
            at = self.cache.reserve(unit, expert)
            if at is None:
                continue
            t0, nbytes = time.perf_counter(), 0
            try:
                for a, b, offset in table.ranges(expert):
                    self.reader.read_range(a, b - a, self.cache.view[at + offset : at + offset + b - a], what)
                    nbytes += b - a
            except Exception:  # its layer reads it itself, and reports what is wrong
                self.cache.finish(unit, expert, None)
                continue
            self.cache.finish(unit, expert, nbytes)
            self.record(unit, t0, time.perf_counter(), nbytes)


@dataclass(frozen=True)
class ExpertMemory:
    """What one configuration holds of single experts: the cache (None: no room for one
    expert), what reads ahead into it (None: off, or no guess) and the routers whose
    hooks guess (each with its :class:`Guess`)."""

    cache: ExpertCache | None = None
    prefetch: ExpertPrefetch | None = None
    guesses: tuple[tuple[nn.Module, Guess], ...] = ()

    def close(self) -> None:
        """Stop the read-ahead, then give the slots back."""
        if self.prefetch is not None:
            self.prefetch.close()
        if self.cache is not None:
            self.cache.close()


def slot_plan(
    capacity: int, tables: Mapping[int, ExpertTable], guesses: Mapping[int, tuple[nn.Module, Guess]],
) -> tuple[int, int, int]:
    """How ``capacity`` bytes of expert cache are cut for ``tables`` (the routed units):
    (bytes of a slot, the largest expert's in whole pages; slots; slots for reading ahead: with a guess
    for some unit, as many as a token's choices, the largest ``top_k``, but never more
    than half of the slots, so that a small cache keeps the experts chosen most)."""
    slot = ExpertCache.rounded(max((t.slot_bytes for t in tables.values()), default=0))
    slots = capacity // slot if tables else 0
    top_k = max((guess.top_k for _, guess in guesses.values()), default=0)
    return slot, slots, min(top_k, slots // 2)


def expert_memory(
    capacity: int, tables: Mapping[int, object], modules: Mapping[str, nn.Module], experts_names: Iterable[str],
    reader: SegmentReader, record: Record, read_ahead: bool,
) -> ExpertMemory:
    """The experts ``capacity`` bytes hold for the routed units among ``tables`` (the
    gathered units' tables), cut as :func:`slot_plan` says (no slot is for reading
    ahead without ``read_ahead``)."""
    experts = {i: t for i, t in tables.items() if isinstance(t, ExpertTable)}
    guesses = plan_guesses(modules, experts_names, experts) if read_ahead else {}
    slot, slots, ahead = slot_plan(capacity, experts, guesses)
    if not slots:  # no room for one expert
        return ExpertMemory()
    cache = ExpertCache(capacity, slot, ahead)
    if not cache.ahead_slots:
        return ExpertMemory(cache)
    return ExpertMemory(cache, ExpertPrefetch(cache, reader, experts, record), tuple(guesses.values()))


__all__ = [
    "ROUTER_NAMES", "ExpertMemory", "ExpertPrefetch", "Guess", "expert_memory", "plan_guesses", "router_of", "slot_plan",
]
