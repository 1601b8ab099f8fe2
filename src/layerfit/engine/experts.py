"""Routed experts on demand: a mixture-of-experts layer reads only the experts it uses.

A mixture-of-experts decoder (Mixtral, Qwen-MoE, OLMoE in transformers' layout) holds
each layer's experts in one module whose tensors stack the experts along their first
dimension (``gate_up_proj`` [E, 2I, H], ``down_proj`` [E, H, I]); its ``forward`` takes
the router's choice (``top_k_index``) and computes with only the experts chosen, by
indexing those tensors. Streamed whole, every pass reads all E experts, though one
token uses k of them (2 of 8 in Mixtral). The engine instead reads, when the layer
runs, only the pages of the experts its router chose, into the unit's own place in the
buffer; the tensors are bound as for any unit, so the module's own code runs unchanged
on the same bytes, and the output is the model's to the bit. What it does not read is
never touched by the module.

As with an embedding read by rows (:mod:`layerfit.engine.gather`), the read depends on
the input, so it runs on the executing thread when the layer starts; the unit's first
read verifies its SHA-256 and so reads it whole. Where the experts' layout allows, the
unit takes not its whole place but one of its chosen experts only
(:mod:`layerfit.engine.expert_places`), which the reader may fill ahead on a guess
(:mod:`layerfit.engine.expert_guess`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn

from layerfit.engine.expert_cache import ExpertCache
from layerfit.engine.skeleton import Binding, unbind
from layerfit.store.manifest import ALIGN, Segment
from layerfit.store.reader import SegmentReader, verify_segment

ROUTED = "top_k_index"  # the argument transformers' experts modules take the router's choice by


def experts_segment(segment: Segment) -> bool:
    """Whether a stored unit looks like a module of stacked experts, from the manifest
    alone: two or more row-major parameters of the module itself, each at least 3-D
    with the same first dimension (the experts), of a module whose type names experts."""
    tensors = segment.tensors
    if not segment.module_type.endswith("Experts") or len(tensors) < 2:
        return False
    count = tensors[0].shape[0] if tensors[0].shape else 0
    prefix = f"{segment.name}." if segment.name else ""
    return count > 1 and all(
        t.kind == "param" and t.stride is None and len(t.shape) >= 3 and t.shape[0] == count
        and t.places == (prefix + t.name.rpartition(".")[2],)
        for t in tensors
    )


def routed_module(module: nn.Module) -> bool:
    """Whether ``module``'s ``forward`` takes the router's choice as ``top_k_index``."""
    try:
        return ROUTED in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True)
class ExpertLookup:
    """The file ranges (aligned) one pass reads of an experts unit, and whether it reads
    the unit whole to verify it."""

    experts: tuple[int, ...]
    extents: tuple[tuple[int, int], ...]
    verify: bool

    @property
    def bytes_read(self) -> int:
        return sum(b - a for a, b in self.extents)


class ExpertTable:
    """One unit of stacked experts read by the experts its router chooses."""

    def __init__(self, segment: Segment, bindings: list[Binding]) -> None:
        self.segment = segment
        self.bindings = bindings
        self.count = segment.tensors[0].shape[0]
        self.nbytes = segment.nbytes

    @classmethod
    def of(cls, segment: Segment, bindings: list[Binding]) -> ExpertTable | None:
        """The table of an experts unit bound by ``bindings``; None unless its module
        takes the router's choice (``top_k_index``)."""
        if not experts_segment(segment) or not bindings:
            return None
        module = bindings[0].module
        if any(b.module is not module for b in bindings) or not routed_module(module):
            return None
        return cls(segment, bindings)

    @property
    def name(self) -> str:
        return self.segment.name or "<root>"

    def plan(self, top_k_index: object, *, verify: bool) -> ExpertLookup:
        """What to read for ``top_k_index`` (the router's choice; ids past the experts,
        which transformers uses for no expert, read nothing): each chosen expert's slice
        of every tensor, widened to pages, merged. ``verify``: the whole unit."""
        start, end = self.segment.offset, self.segment.offset + self.segment.nbytes
        if verify or not isinstance(top_k_index, torch.Tensor) or top_k_index.is_floating_point():
            return ExpertLookup(tuple(range(self.count)), ((start, end),), verify)
        ids = torch.unique(top_k_index.detach().reshape(-1).cpu())
        experts = tuple(int(e) for e in ids.tolist() if 0 <= e < self.count)
        return ExpertLookup(experts, self._extents(experts), False)

    def slices(self, expert: int) -> tuple[tuple[int, int, int], ...]:
        """(offset in the unit, bytes, offset in a cache slot) of ``expert``'s slice of
        each stacked tensor: in a slot each slice lies where it lies in the whole pages
        :meth:`ranges` reads it from."""
        return tuple((first - self.segment.offset, size, at + first - a)
                     for (a, _, at), (first, size) in zip(self.ranges(expert), self._firsts(expert), strict=True))

    def slot_slices(self, expert: int) -> tuple[tuple[int, int, int], ...]:
        """:meth:`slices` for a view of one slot (where each slice lies in it, twice)."""
        return tuple((at, size, at) for _, size, at in self.slices(expert))

    def ranges(self, expert: int) -> tuple[tuple[int, int, int], ...]:
        """(file start, file end, offset in a cache slot) of the whole pages holding
        ``expert``'s slice of each tensor: what reading it ahead into a slot reads, each
        range at a page boundary of the slot (direct I/O)."""
        end = self.segment.offset + self.segment.nbytes
        out, at = [], 0
        for first, size in self._firsts(expert):
            a, b = first // ALIGN * ALIGN, min(-(-(first + size) // ALIGN) * ALIGN, end)
            out.append((a, b, at))
            at += -(-(b - a) // ALIGN) * ALIGN
        return tuple(out)

    @property
    def slot_bytes(self) -> int:
        """The bytes of a cache slot that holds any one expert (:meth:`ranges`)."""
        return max(sum(-(-(b - a) // ALIGN) * ALIGN for a, b, _ in self.ranges(e)) for e in range(self.count))

    def _firsts(self, expert: int) -> list[tuple[int, int]]:
        """(file offset, bytes) of ``expert``'s slice of each stacked tensor."""
        return [
            (self.segment.offset + t.offset + expert * (t.nbytes // self.count), t.nbytes // self.count)
            for t in self.segment.tensors
        ]

    def _extents(self, experts: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
        """The file ranges holding ``experts``, widened to pages and merged."""
        ranges = [(a, b) for e in experts for a, b, _ in self.ranges(e)]
        extents: list[tuple[int, int]] = []
        for a, b in sorted(ranges):
            if extents and a <= extents[-1][1]:
                extents[-1] = (extents[-1][0], max(extents[-1][1], b))
            else:
                extents.append((a, b))
        return tuple(extents)

    def read(
        self, reader: SegmentReader, lookup: ExpertLookup, view: memoryview,
        cache: ExpertCache | None = None, unit: int = -1,
    ) -> int:
        """Read ``lookup``'s ranges into ``view`` (the unit's place, aligned, its bytes
        long) where they lie in the unit, and return the bytes read. With ``cache``, the
        chosen experts it holds are copied from it instead, and those read are kept in
        it (as unit ``unit``) as its rule allows. A whole read is verified; a mismatch
        raises :class:`~layerfit.errors.CorruptStoreError`."""
        what = f"unit {self.segment.index} ({self.name})"
        missing = lookup.experts
        extents = lookup.extents
        if cache is not None and not lookup.verify:
            missing = tuple(e for e in lookup.experts if not cache.load(unit, e, view, self.slices(e)))
            extents = self._extents(missing)
        for a, b in extents:
            at = a - self.segment.offset
            reader.read_range(a, b - a, view[at : at + b - a], what)
        if lookup.verify:
            verify_segment(self.segment, view)
        elif cache is not None:
            for e in missing:
                cache.store(unit, e, view, self.slices(e))
        return sum(b - a for a, b in extents)

    def read_slot(self, reader: SegmentReader, expert: int, slot: memoryview, what: str) -> int:
        """Read ``expert`` into ``slot`` (a compact place's slot, page-aligned) laid out as
        :meth:`ranges` says; the bytes read."""
        nbytes = 0
        for a, b, at in self.ranges(expert):
            reader.read_range(a, b - a, slot[at : at + b - a], what)
            nbytes += b - a
        return nbytes

    def restore(self, saved: object) -> None:
        """Put the skeleton's meta tensors back, and the module's count of experts where
        a compact binding changed it (``saved``: that count, else None)."""
        unbind(self.bindings)
        if saved is not None:
            self.bindings[0].module.num_experts = saved
