"""The next MoE layer's experts, guessed a layer early, so the reader reads them ahead.

A routed layer reads its experts once its router has chosen them (:mod:`layerfit.engine.experts`),
on the executing thread: the kernels wait for the disk at every MoE layer. But the hidden
state changes little from one layer to the next (the residual stream), so the next MoE
layer's router applied to the hidden state entering this layer's router guesses much of
its choice a layer early (speculative expert loading: Eliseev and Mazur, *Fast Inference
of Mixture-of-Experts Language Models with Offloading*, 2023). So when a router runs, the
routed experts unit of the MoE layer after it gets a guess: each token's top-k under that
layer's router weight, which must be in memory (kept or resident, as ``auto`` keeps small
routers). The reader thread, waiting at that unit, takes a compact place for it
(:mod:`layerfit.engine.expert_places`) and reads the guessed experts there, with room
left for those the guess misses, then goes on to the units after it; it starts once the
current layer's own experts are read (its experts hook says so), so a guess never
delays a read its own layer waits for.

A right guess turns a read on the executing thread into one made while the layers before
it ran; a wrong one costs a read nobody waited for. So every guess is scored against
its layer's choice, by rank (a token's first guess, its second, ...), and the reader
reads a rank ahead only while three in four of its guesses were right
(:data:`RIGHT_ENOUGH`). Whatever the guess, the output is the model's to the bit: a
guess decides which bytes are read early, never which experts run or what they compute.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from layerfit.engine.expert_cache import ExpertCache
from layerfit.engine.expert_places import compact_layout
from layerfit.engine.experts import ExpertTable, experts_segment
from layerfit.engine.units import Block

ROUTER_NAMES = ("gate", "router")
"""Where transformers' sparse MoE blocks keep their router, beside their experts."""


@dataclass(frozen=True)
class Guess:
    """How to guess what routed experts unit ``unit`` will choose: with ``router`` (its
    own layer's router, whose ``weight`` is [experts, hidden]) applied to what enters the
    router of the MoE layer before it, ``top_k`` per token. ``hold``: that layer's own
    experts unit when it is routed too (the guess is read once that unit's are)."""

    unit: int
    router: nn.Module
    top_k: int
    hold: int | None


@dataclass(frozen=True)
class Guessed:
    """A guess made in a pass: the ``experts`` (each token's first choice, then its
    second, ...) and the ``ranks`` they were guessed at (0: a token's first choice), for
    ``tokens`` tokens, ``top_k`` each; read once unit ``hold`` is."""

    experts: tuple[int, ...]
    ranks: tuple[int, ...]
    tokens: int
    top_k: int
    hold: int | None


RIGHT_ENOUGH = 0.75
"""The share of a rank's guesses their layer must have chosen for the reader to read that
rank ahead. A wrong read costs the disk as much as a right one saves where the reads are
what a token waits for, so a rank is read only where three of its guesses in four are
right: then reads ahead exceed what the layer uses by at most a third. Measured on
``bench/moe_decoding.py``'s decoders: a token's first guess is chosen 92-99 % of the
time, its second 36 % (seeded weights) and 68 % (trained)."""

SCORED_FIRST = 8
"""Guesses of a rank scored before its share decides (until then it is read)."""


@dataclass
class GuessCount:
    """Over a configuration: every guess scored by rank against its layer's choice
    (``scored``, ``right``), and the experts read ahead on a guess (``read``) and of them
    those their layer chose (``chosen``)."""

    read: int = 0
    chosen: int = 0
    scored: list[int] = field(default_factory=list)
    right: list[int] = field(default_factory=list)

    def score(self, guessed: Guessed, chosen: Iterable[int]) -> None:
        """Count each of ``guessed``'s experts against what its layer ``chosen``."""
        chosen = set(chosen)
        for e, r in zip(guessed.experts, guessed.ranks, strict=True):
            while len(self.scored) <= r:
                self.scored.append(0)
                self.right.append(0)
            self.scored[r] += 1
            self.right[r] += e in chosen

    def worth_reading(self, rank: int) -> bool:
        """Whether guesses of ``rank`` are right often enough to read ahead (:data:`RIGHT_ENOUGH`)."""
        if rank >= len(self.scored) or self.scored[rank] < SCORED_FIRST:
            return True
        return self.right[rank] >= RIGHT_ENOUGH * self.scored[rank]


class PassGuesses:
    """The guesses made in one pass and the MoE layers whose own experts were read: the
    experts' side of the pass. Written by the experts' hooks on the executing thread
    (a router's :class:`~layerfit.engine.hooks.GuessHook` makes a guess, a layer's
    :class:`~layerfit.engine.hooks.ExpertsHook` reads its experts), under the stream's
    lock; the reader asks :meth:`readable` before it reads a guess ahead."""

    def __init__(self) -> None:
        self.guessed: dict[int, Guessed] = {}  # the guess made for a unit
        self.layers_read: set[int] = set()  # the units whose own experts were read

    def made(self, unit: int, guessed: Guessed) -> None:
        """The experts of ``unit`` were guessed."""
        self.guessed[unit] = guessed

    def layer_read(self, unit: int) -> None:
        """MoE layer ``unit`` read its own experts (a guess held until then may be read)."""
        self.layers_read.add(unit)

    def readable(self, unit: int) -> Guessed | None:
        """The guess for ``unit`` once the reader may read it: made, and the layer it is
        held for (the layer before, whose experts go first) read; else None."""
        made = self.guessed.get(unit)
        if made is not None and (made.hold is None or made.hold in self.layers_read):
            return made
        return None


def guess(g: Guess, hidden: object) -> Guessed | None:
    """``g``'s guess from ``hidden`` (what enters the router before its unit's); None when
    its router's weight is not in memory or does not fit ``hidden``."""
    weight = getattr(g.router, "weight", None)
    if not isinstance(hidden, torch.Tensor) or not isinstance(weight, torch.Tensor) or weight.is_meta \
            or hidden.shape[-1] != weight.shape[1] or hidden.device != weight.device:
        return None
    with torch.no_grad():
        flat = hidden.reshape(-1, weight.shape[1])
        top = torch.nn.functional.linear(flat.to(weight.dtype), weight).topk(min(g.top_k, weight.shape[0]), dim=-1)
    ranked = top.indices.t().tolist()  # [rank][token]
    first: dict[int, int] = {}  # each expert, at the first rank it is guessed at
    for rank, row in enumerate(ranked):
        for e in row:
            first.setdefault(e, rank)
    return Guessed(tuple(first), tuple(first.values()), flat.shape[0], g.top_k, g.hold)


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
        out[id(trigger)] = (trigger, Guess(unit, router, top_k, hold=routed.get(before)))
    return out


def guessing_routers(model: nn.Module, blocks: Sequence[Block], routed: Iterable[int]) -> set[int]:
    """The units (of ``blocks``) that are the routers of the ``routed`` experts units but
    the model's first MoE layer's: the routers a guess applies, which must stay in memory."""
    modules = dict(model.named_modules())
    by_name = {block.segments[0].name: i for i, block in enumerate(blocks) if len(block.segments) == 1}
    experts = [i for i, block in enumerate(blocks) if any(experts_segment(seg) for seg in block.segments)]
    out = set()
    for i in routed:
        name = blocks[i].segments[0].name
        if not experts or i == experts[0] or "." not in name:
            continue
        parent, module = modules.get(name.rpartition(".")[0]), modules.get(name)
        router = None if parent is None or module is None else router_of(module, parent)
        unit = next((by_name.get(n) for n, m in modules.items() if m is router), None) if router is not None else None
        if unit is not None:
            out.add(unit)
    return out


@dataclass(frozen=True)
class ExpertMemory:
    """What one configuration holds for routed experts: the cache (None: no room for one
    expert), the units bound compact (:mod:`layerfit.engine.expert_places`) and the
    routers whose hooks guess (each with its :class:`Guess`)."""

    cache: ExpertCache | None = None
    compact: frozenset[int] = frozenset()
    guesses: tuple[tuple[nn.Module, Guess], ...] = ()

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()


def slot_plan(capacity: int, tables: Mapping[int, ExpertTable]) -> tuple[int, int]:
    """How ``capacity`` bytes of expert cache are cut for ``tables`` (the routed units):
    (bytes of a slot, the largest expert's in whole pages; slots)."""
    slot = ExpertCache.rounded(max((t.slot_bytes for t in tables.values()), default=0))
    return slot, (capacity // slot if tables else 0)


def expert_memory(
    capacity: int, tables: Mapping[int, object], modules: Mapping[str, nn.Module], experts_names: Iterable[str],
    read_ahead: bool, compact: bool = True,
) -> ExpertMemory:
    """For the routed units among ``tables`` (the gathered units' tables): a cache of
    ``capacity`` bytes (:func:`slot_plan`), the units bound compact (with ``compact``: the
    reference binder) and, with ``read_ahead``, the guesses of the compact ones."""
    experts = {i: t for i, t in tables.items() if isinstance(t, ExpertTable)}
    compact_units = frozenset(i for i, t in experts.items() if compact and compact_layout(t))
    guesses = plan_guesses(modules, experts_names, {i: experts[i] for i in compact_units}) if read_ahead else {}
    slot, slots = slot_plan(capacity, experts)
    cache = ExpertCache(capacity, slot) if slots else None
    return ExpertMemory(cache, compact_units, tuple(guesses.values()))


__all__ = [
    "RIGHT_ENOUGH", "ROUTER_NAMES", "SCORED_FIRST", "ExpertMemory", "Guess", "GuessCount", "Guessed", "PassGuesses",
    "expert_memory", "guess", "guessing_routers", "plan_guesses", "router_of", "slot_plan",
]
