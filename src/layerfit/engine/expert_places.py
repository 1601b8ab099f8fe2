"""A routed unit's experts in the read buffer: a compact place of slots, one expert each.

A module of stacked experts (``gate_up_proj`` [E, 2I, H], ``down_proj`` [E, H, I]) indexes
its tensors by the experts its router chose, so bound whole it needs the unit's whole
place in the read buffer although a token uses k of its E experts. Where every expert's
slice of each tensor lies at the same offset within whole pages (a slice of whole pages,
as for power-of-two widths), the unit is instead bound **compact**: each tensor as
[n, ...] over a place of n slots (:meth:`ExpertTable.slices` lays a slot out), and the
router's choice renumbered to the slots. The module's own code runs unchanged on the
same bytes at the same alignment (a slot's pages hold a slice where the file's pages do),
so its output is the model's to the bit, and a decoded token's place is k slots, not E:
the reader can read the next layer's units, and its guessed experts, while this one runs.

Order. The module's code runs the chosen experts in the order of their numbers (its
eager loop over them, or its grouped GEMMs over tokens sorted by expert), and that order
decides how each token's outputs are summed. The slots are numbered in the experts'
order, so renumbered the choice keeps it, and the module's ``num_experts`` is the
place's slots for the pass (an id past the experts, transformers' "no expert", past
the slots): the same GEMMs on the same bytes, in the same order, so the output is the
model's to the bit. The experts guessed for a layer are read into the middle slots of a
place with free slots before and after them (:func:`ahead_layout`), so that the ones the
guess missed can take slots that keep the order; where none can, every chosen expert
is placed again in order.

Only transformers' own experts code is bound compact (eager, grouped and batched
GEMMs, which all count the experts by ``num_experts``); a unit laid out otherwise, or
bound by another binder, takes its whole place as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from layerfit.engine.experts import ExpertTable

COMPACT_IMPLEMENTATIONS = (None, "eager", "grouped_mm", "batched_mm")
"""transformers' experts implementations (``config._experts_implementation``) that count
the experts by the module's ``num_experts`` (None: a module with no such choice)."""


def compact_layout(table: ExpertTable) -> bool:
    """Whether ``table``'s experts may be bound compact: each expert's slice of every
    tensor at the same offset in its slot, the tensors row-major, and its module counting
    its experts by ``num_experts`` in code :data:`COMPACT_IMPLEMENTATIONS` names."""
    layouts = {tuple((size, at) for _, size, at in table.slices(e)) for e in range(table.count)}
    module = table.bindings[0].module if table.bindings else None
    implementation = getattr(getattr(module, "config", None), "_experts_implementation", None)
    return (
        len(layouts) == 1 and all(b.stride is None for b in table.bindings)
        and getattr(module, "num_experts", None) == table.count and implementation in COMPACT_IMPLEMENTATIONS
    )


@dataclass
class ExpertPlace:
    """A routed unit's compact place: ``offset`` in the read buffer, and the expert each
    of its slots holds (None: free)."""

    offset: int
    slots: list[int | None]


def ahead_layout(guessed: Sequence[int], tokens: int, top_k: int, count: int) -> list[int | None]:
    """The slots of a place read ahead with the ``guessed`` experts (ascending): room
    besides for every expert a pass of ``tokens`` tokens may choose that the guess
    missed (so its layer never needs a larger place; at most the unit's ``count`` slots),
    half of it before the guessed and half after, so that a missed expert below or above
    them finds a slot in order."""
    spare = min(count, len(guessed) + top_k * tokens) - len(guessed)
    before = spare // 2
    return [*[None] * before, *guessed, *[None] * (spare - before)]


def assign(place: ExpertPlace, chosen: Sequence[int]) -> list[tuple[int, int]] | None:
    """Give each expert of ``chosen`` (ascending) a slot of ``place`` in order: those it
    holds keep theirs, each other takes the first slot after the last one given that
    holds no chosen expert. The (expert, slot) pairs to fill; None when that order
    cannot be kept (then :func:`in_order`). ``place.slots`` says afterwards what each
    slot holds."""
    held = {e: s for s, e in enumerate(place.slots) if e is not None and e in chosen}
    taken = set(held.values())
    fills, last = [], -1
    for e in chosen:
        if e in held:
            s = held[e]
        else:
            s = next((t for t in range(last + 1, len(place.slots)) if t not in taken), None)
            if s is None:
                return None
            fills.append((e, s))
            taken.add(s)
        if s <= last:
            return None
        last = s
    for e, s in fills:
        place.slots[s] = e
    return fills


def in_order(place: ExpertPlace, chosen: Sequence[int]) -> list[tuple[int, int]]:
    """Fill ``place`` again with ``chosen`` (ascending) in its first slots, every one read
    anew; the (expert, slot) pairs to fill."""
    place.slots = [*chosen, *[None] * (len(place.slots) - len(chosen))]
    return list(zip(chosen, range(len(chosen)), strict=True))


def bind_compact(table: ExpertTable, buffer: torch.Tensor, place: ExpertPlace) -> int:
    """Bind each of ``table``'s stacked tensors as [slots, ...] over ``place`` in
    ``buffer`` (the read buffer, uint8; slot s at ``place.offset + s * slot_bytes``) and
    give its module as many experts; returns the module's own count, to restore."""
    slot, slices = table.slot_bytes, table.slices(0)
    for binding, (_, _, at) in zip(table.bindings, slices, strict=True):
        if binding.encoding is not None:  # GGML blocks: each slot's expert dequantized, stacked
            size = binding.nbytes // table.count
            starts = [place.offset + s * slot + at for s in range(len(place.slots))]
            binding.attach(torch.cat([binding.dequantized(buffer[a : a + size], 1) for a in starts]))
            continue
        item = binding.dtype.itemsize
        inner = binding.shape[1:]
        strides, step = [], 1
        for n in reversed(inner):
            strides.insert(0, step)
            step *= n
        typed = buffer.view(binding.dtype)
        binding.attach(typed.as_strided((len(place.slots), *inner), (slot // item, *strides),
                                        (place.offset + at) // item))
    module = table.bindings[0].module
    count, module.num_experts = module.num_experts, len(place.slots)
    return count


def renumbered(top_k_index: torch.Tensor, place: ExpertPlace, count: int) -> torch.Tensor:
    """``top_k_index`` with each chosen expert's number replaced by its slot's, and an id
    past the ``count`` experts (no expert) by one past the slots."""
    table = torch.full((count + 1,), len(place.slots), dtype=top_k_index.dtype)
    for s, e in enumerate(place.slots):
        if e is not None:
            table[e] = s
    return table[top_k_index.cpu()].to(top_k_index.device)


__all__ = [
    "COMPACT_IMPLEMENTATIONS", "ExpertPlace", "ahead_layout", "assign", "bind_compact", "compact_layout", "in_order",
    "renumbered",
]
