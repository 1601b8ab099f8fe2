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

    def configure(self, blocks: Sequence[Block]) -> None:
        """Read units of a new partition from now on; none verified yet (every one when
        verify is ``never``)."""
        self.blocks = blocks
        self.verified_blocks = set(range(len(blocks))) if self.verify == "never" else set()

    def needs_check(self, i: int) -> bool:
        """Whether the next read of unit ``i`` verifies its SHA-256."""
        return i not in self.verified_blocks

    def read_unit(self, i: int, into: memoryview) -> None:
        """Read unit ``i`` into ``into`` (aligned, at least the unit's bytes); the first
        read of a unit verifies its SHA-256. Unit sources call it from their own threads,
        concurrently with the forward pass."""
        blk = self.blocks[i]
        view = into[: blk.nbytes]
        self.reader.read_range(blk.offset, blk.nbytes, view, f"unit {i} ({blk.name or '<root>'})")
        if i not in self.verified_blocks:
            self.check(i, view)

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

    def read_units(self, first: int, stop: int, view: memoryview) -> None:
        """Read units ``first..stop-1`` (adjacent in the file) into ``view``.

        Several units are read with one request; if that fails, they are read one by one
        so the error names the unit that cannot be read (and a transient error heals).
        """
        blocks = self.blocks
        if stop - first == 1:
            self.read_unit(first, view)
            return
        base = blocks[first].offset
        total = blocks[stop - 1].offset + blocks[stop - 1].nbytes - base
        view = view[:total]
        try:
            what = f"units {first}-{stop - 1} ({blocks[first].name} .. {blocks[stop - 1].name})"
            self.reader.read_range(base, total, view, what)
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
