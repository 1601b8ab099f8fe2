"""Reading an engine's units from its weights file, verifying each as its mode says.

Full SHA-256 verification happens on the first read of each unit (``verify="first"``),
on every read (``always``) or never; a pool of engines of one model shares what was
verified, so each unit is checked once (:meth:`UnitReader.share_verification`).
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Sequence

from layerfit.engine.units import Block
from layerfit.errors import LayerfitError
from layerfit.store.reader import SegmentReader, aligned_buffer, verify_segment


class UnitReader:
    """Reads the units of the current partition (``blocks``) with ``reader``."""

    def __init__(self, reader: SegmentReader, verify: str) -> None:
        self.reader = reader
        self.verify = verify
        self.blocks: Sequence[Block] = ()
        self.verified: set[int] = set()  # segment indices whose SHA-256 was checked
        self.verified_blocks: set[int] = set()  # units that need no check (again)
        self.extents: dict[int, int] = {}  # unit -> the bytes from its start its binding reads, where fewer

    def configure(self, blocks: Sequence[Block], extents: dict[int, int] | None = None) -> None:
        """Read units of a new partition from now on; none verified yet (every one when
        verify is ``never``). ``extents``: for a unit whose binding reads only its first
        bytes (the packed mode's int4 weights, not their heads), how many; once verified,
        such a unit is read only that far (the rest of its place in the buffer is left
        as it was, and nothing reads it)."""
        self.blocks = blocks
        self.verified_blocks = set(range(len(blocks))) if self.verify == "never" else set()
        self.extents = {i: n for i, n in (extents or {}).items() if n < blocks[i].nbytes}

    def needs_check(self, i: int) -> bool:
        """Whether the next read of unit ``i`` verifies its SHA-256."""
        return i not in self.verified_blocks

    def read_nbytes(self, i: int) -> int:
        """The bytes the next read of unit ``i`` reads: all, to verify it; else its extent."""
        if i not in self.verified_blocks:
            return self.blocks[i].nbytes
        return self.extents.get(i, self.blocks[i].nbytes)

    def read_unit(self, i: int, into: memoryview) -> None:
        """Read unit ``i`` into ``into`` (aligned, at least the unit's bytes); the first
        read of a unit verifies its SHA-256. Unit sources call it from their own threads,
        concurrently with the forward pass."""
        blk = self.blocks[i]
        nbytes = self.read_nbytes(i)
        self.reader.read_range(blk.offset, nbytes, into[:nbytes], f"unit {i} ({blk.name or '<root>'})")
        if i not in self.verified_blocks:
            self.check(i, into[: blk.nbytes])

    def read_part(self, i: int, start: int, stop: int, into: memoryview) -> None:
        """Read bytes ``start..stop-1`` of unit ``i``, which needs no check, into the same
        bytes of ``into`` (the unit's place): a unit handed over as it arrives is read in
        parts. ``start`` is aligned; ``stop`` is too, or the end of the unit's read."""
        if self.needs_check(i):
            raise LayerfitError(f"unit {i} is read in parts before its SHA-256 was verified")
        blk = self.blocks[i]
        what = f"unit {i} ({blk.name or '<root>'})"
        self.reader.read_range(blk.offset + start, stop - start, into[start:stop], what)

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

    def read_units(self, first: int, stop: int, view: memoryview) -> list[int]:
        """Read units ``first..stop-1`` (adjacent in the file) into ``view``; the bytes read
        of each (:meth:`read_nbytes`).

        Adjacent units are read with one request, which a unit read short ends; if a
        request fails, its units are read one by one so the error names the unit that
        cannot be read (and a transient error heals).
        """
        blocks = self.blocks
        sizes = [self.read_nbytes(k) for k in range(first, stop)]
        start = first
        for k, nbytes in enumerate(sizes, first):
            if k == stop - 1 or nbytes < blocks[k].nbytes:
                self._read_adjacent(start, k + 1, view[blocks[start].offset - blocks[first].offset :], nbytes)
                start = k + 1
        return sizes

    def _read_adjacent(self, first: int, stop: int, view: memoryview, last_nbytes: int) -> None:
        """Read units ``first..stop-1`` into ``view`` with one request, the last one
        ``last_nbytes`` of it; one by one where that fails, so the error names the unit."""
        blocks = self.blocks
        if stop - first == 1:
            self.read_unit(first, view)
            return
        base = blocks[first].offset
        total = blocks[stop - 1].offset + last_nbytes - base
        try:
            what = f"units {first}-{stop - 1} ({blocks[first].name} .. {blocks[stop - 1].name})"
            self.reader.read_range(base, total, view[:total], what)
        except LayerfitError:
            for k in range(first, stop):
                pos = blocks[k].offset - base
                self.read_unit(k, view[pos : pos + blocks[k].nbytes])
            return
        for k in range(first, stop):
            if k not in self.verified_blocks:
                pos = blocks[k].offset - base
                self.check(k, view[pos : pos + blocks[k].nbytes])

    def check(self, i: int, view: memoryview) -> None:
        """Verify unit ``i``'s bytes in ``view`` against its segments' SHA-256."""
        always = self.verify == "always"
        pos = 0
        for seg in self.blocks[i].segments:
            if always or seg.index not in self.verified:
                verify_segment(seg, view[pos : pos + seg.nbytes])
                if not always:
                    self.verified.add(seg.index)
            pos += seg.nbytes
        if not always:
            self.verified_blocks.add(i)

    def mark_verified(self, i: int, segment_index: int) -> None:
        """Unit ``i`` (one segment, an embedding table) was verified by its rows' reader."""
        if self.verify != "always":
            self.verified.add(segment_index)
            self.verified_blocks.add(i)

    def share_verification(self, other: UnitReader) -> None:
        """Trust the units ``other`` has verified (and share what either verifies from now
        on) when both read the same weights file — same inode, size and modification
        time — in the same units."""
        same_units = [b.offset for b in other.blocks] == [b.offset for b in self.blocks]
        if other.reader.identity == self.reader.identity and same_units:
            self.verified = other.verified
            self.verified_blocks = other.verified_blocks


__all__ = ["UnitReader"]
