"""Embedding rows on demand: an untied token embedding is read row by row.

A language model's token embedding is one of its largest units (32 k tokens x 768 in
fp32 is 98 MB), yet a pass looks up only the rows of the ids in its input: one row per
token when decoding. Streamed whole, the table is read again for every token. For a
plain ``nn.Embedding`` whose weight is the only tensor of its unit (a table tied to the
head is resident: the head needs all of it), the engine instead reads the rows of the
distinct ids from the weights file when the embedding runs, binds them as the weight,
and lets the embedding look up each id's position among them. A lookup copies rows, so
the output is the model's to the bit. ``max_norm`` (which rewrites looked-up rows in
place) keeps the table streamed whole.

The read depends on the ids, so it cannot run ahead: it is made on the executing thread
when the embedding starts, as a few small aligned reads. Where those would cost more
than reading the table (a long prompt), and on the table's first use, whose SHA-256 is
not yet verified, the table is scanned instead in pieces of at most :data:`SCAN_CHUNK`
bytes, hashed on the way, and the rows are picked out. The rows and the piece being
read take their place in the engine's unit buffer, in the unit's turn, so the budget
holds as for any unit; the reader does not read past the table before its rows have
their place, which costs nothing when the table is the first unit, as in a language
model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from layerfit.engine.experts import ExpertTable, experts_segment
from layerfit.engine.skeleton import Binding, unbind
from layerfit.errors import BudgetError
from layerfit.sizes import format_bytes, format_bytes_exact
from layerfit.store.manifest import ALIGN, Segment
from layerfit.store.reader import SegmentReader, checksum_error

SCAN_CHUNK = 1024 * 1024
"""Bytes per read when the whole table is scanned (1 MiB reads the disk at full speed
here: dd gave the same 1.6 GB/s with 1-16 MB blocks)."""


def gatherable_segment(segment: Segment) -> bool:
    """Whether a stored unit is an embedding table that may be read row by row, judged
    from the manifest alone (``inspect`` plans with it; the engine also checks the module).
    A table smaller than the room a row takes (a few pages) is read whole.
    """
    if segment.module_type != "Embedding" or len(segment.tensors) != 1:
        return False
    t = segment.tensors[0]
    weight = f"{segment.name}.weight" if segment.name else "weight"
    if t.kind != "param" or t.places != (weight,) or len(t.shape) != 2 or t.stride is not None:
        return False
    if t.encoding is not None and (t.encoding.transposed or t.encoding.int4_rows):  # rows not a byte range
        return False
    return least_room(segment) < segment.nbytes  # a table of a few pages is read whole


def gathered_units(blocks: Iterable[Sequence[Segment]]) -> frozenset[int]:
    """Indices of the units (each given by its segments) made of one gatherable table:
    an embedding read by rows, or a module of experts read by the experts it runs
    (:mod:`layerfit.engine.experts`)."""
    return frozenset(
        i for i, segs in enumerate(blocks)
        if len(segs) == 1 and (gatherable_segment(segs[0]) or experts_segment(segs[0]))
    )


def table_of(segment: Segment, bindings: list[Binding]) -> RowTable | ExpertTable | None:
    """The table that reads a gathered unit: its embedding's rows, or its experts."""
    return ExpertTable.of(segment, bindings) if experts_segment(segment) else RowTable.of(segment, bindings)


def least_room(segment: Segment) -> int:
    """The buffer room a gathered unit takes at the least: for a table, one row (its
    place, rounded to a page so that the read buffer after it stays aligned, and the
    pages it is read from); experts are read into the unit's own place."""
    if experts_segment(segment):
        return segment.nbytes
    t = segment.tensors[0]
    row = -(-(t.nbytes // t.shape[0]) // ALIGN) * ALIGN
    return row + row + ALIGN


def streamed_minimum(units: Sequence[Segment]) -> int:
    """The largest unit's bytes as the engine streams units on cpu (the minimum budget
    beside the resident tensors): a gatherable table counts the room of one row."""
    return max((least_room(u) if gatherable_segment(u) or experts_segment(u) else u.nbytes for u in units), default=0)


@dataclass(frozen=True)
class Lookup:
    """How one pass's ids are read: the distinct ids' rows (``first``: each row's file
    offset, ascending) go to the start of a region of ``nbytes``, read through the rest
    of it in ``extents`` (aligned file ranges); ``positions`` is each id's row among them."""

    positions: torch.Tensor
    first: list[int]
    extents: list[tuple[int, int]]
    rows_bytes: int
    nbytes: int
    scanned: bool  # the whole table is read
    verify: bool  # and its SHA-256 checked on the way

    @property
    def bytes_read(self) -> int:
        return sum(b - a for a, b in self.extents)


class RowTable:
    """One embedding table read by rows from the weights file."""

    def __init__(self, segment: Segment, binding: Binding) -> None:
        self.segment = segment
        self.binding = binding
        self.rows, self.width = binding.shape
        self.dtype = binding.dtype
        self.row_bytes = binding.nbytes // self.rows
        self.start = segment.offset + binding.offset  # the table's first byte in the file
        self.end = segment.offset + segment.nbytes  # the unit's end (aligned reads stop there)
        # An id check that costs no memory: a table of one zero, seen ``rows`` times.
        self._probe = torch.zeros(1, 1, dtype=self.dtype).expand(self.rows, 1)

    @classmethod
    def of(cls, segment: Segment, bindings: list[Binding]) -> RowTable | None:
        """The table of a gatherable unit bound by ``bindings``; None if its module is not
        a plain ``nn.Embedding`` without ``max_norm``."""
        if not gatherable_segment(segment) or len(bindings) != 1:
            return None
        module = bindings[0].module
        if type(module) is not nn.Embedding or module.max_norm is not None:
            return None
        return cls(segment, bindings[0])

    @property
    def least_room(self) -> int:
        return least_room(self.segment)

    def restore(self, padding_idx: object) -> None:
        """Put the meta table back in place of the rows, and the module's padding_idx."""
        unbind([self.binding])
        self.binding.module.padding_idx = padding_idx

    @property
    def name(self) -> str:
        return self.segment.name or "<root>"

    def check_ids(self, ids: object) -> None:
        """Raise what ``nn.Embedding`` raises for ``ids`` (not a tensor of integers, an id
        out of range), so a bad input fails as it does on the model."""
        torch.nn.functional.embedding(ids, self._probe)

    def plan(self, ids: torch.Tensor, *, room: int, verify: bool, request_bytes: int) -> Lookup:
        """How to read the rows of ``ids`` (checked with :meth:`check_ids`) in a region of
        at most ``room`` bytes. ``verify``: scan the table and check its SHA-256.
        Otherwise the rows are read by small aligned requests unless, at
        ``request_bytes`` per request beyond its bytes, a scan costs less."""
        distinct, positions = torch.unique(ids, sorted=True, return_inverse=True)
        first = [r * self.row_bytes + self.start for r in distinct.tolist()]
        rows_bytes = len(first) * self.row_bytes
        rows_room = -(-rows_bytes // ALIGN) * ALIGN  # the read buffer after it stays aligned
        chunk = min(SCAN_CHUNK, (room - rows_room) // ALIGN * ALIGN)
        if chunk < ALIGN:
            raise BudgetError(
                f"the input looks up {len(first)} distinct rows of embedding {self.name} "
                f"({format_bytes(rows_bytes)}), and with a {ALIGN}-byte read buffer they need "
                f"{format_bytes_exact(rows_room + ALIGN)}; the engine's unit buffer holds "
                f"{format_bytes_exact(room)}: raise the "
                "budget, or look up fewer distinct ids per call"
            )
        sparse = self._split(self._extents(first), chunk)
        scan = self._split([(self.segment.offset, self.end)], chunk)
        scanned = verify or sum(b - a for a, b in sparse) + len(sparse) * request_bytes >= (
            self.end - self.segment.offset + len(scan) * request_bytes
        )
        extents = scan if scanned else sparse
        nbytes = rows_room + max(b - a for a, b in extents)
        return Lookup(positions.view(ids.shape), first, extents, rows_bytes, nbytes, scanned, verify)

    def read(self, reader: SegmentReader, lookup: Lookup, region: torch.Tensor, view: memoryview) -> torch.Tensor:
        """Read ``lookup``'s rows into ``region`` (``lookup.nbytes`` of uint8, aligned;
        ``view`` is the same memory) and return them as the table's rows. A scan that
        verifies raises :class:`~layerfit.errors.CorruptStoreError` on a mismatch."""
        rb, first = self.row_bytes, lookup.first
        rows_room = -(-lookup.rows_bytes // ALIGN) * ALIGN
        data, buffer = region[rows_room:], view[rows_room : lookup.nbytes]
        digest = hashlib.sha256() if lookup.verify else None
        what = f"unit {self.segment.index} ({self.name})"
        j = 0  # rows before j are complete
        for a, b in lookup.extents:
            reader.read_range(a, b - a, buffer, what)
            if digest is not None:
                digest.update(buffer[: b - a])
            k = j
            while k < len(first) and first[k] < b:
                lo, hi = max(first[k], a), min(first[k] + rb, b)
                if lo < hi:
                    at = k * rb + lo - first[k]
                    region[at : at + hi - lo] = data[lo - a : hi - a]
                if first[k] + rb <= b:
                    j = k + 1
                k += 1
        if digest is not None and digest.hexdigest() != self.segment.sha256:
            raise checksum_error(self.segment)
        rows = region[: lookup.rows_bytes]
        if self.binding.encoding is not None:  # GGML blocks, a whole number a row: their values
            return self.binding.dequantized(rows, len(first))
        return rows.view(self.dtype).view(len(first), self.width)

    def _extents(self, first: list[int]) -> list[tuple[int, int]]:
        """Aligned, disjoint file ranges covering the rows starting at ``first`` (sorted)."""
        extents: list[tuple[int, int]] = []
        for start in first:
            a = start // ALIGN * ALIGN
            b = min(-(-(start + self.row_bytes) // ALIGN) * ALIGN, self.end)
            if extents and a <= extents[-1][1]:
                extents[-1] = (extents[-1][0], max(extents[-1][1], b))
            else:
                extents.append((a, b))
        return extents

    @staticmethod
    def _split(extents: list[tuple[int, int]], chunk: int) -> list[tuple[int, int]]:
        """``extents`` cut into pieces of at most ``chunk`` bytes (a multiple of ALIGN)."""
        return [(x, min(x + chunk, b)) for a, b in extents for x in range(a, b, chunk)]
