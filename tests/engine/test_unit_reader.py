"""`UnitReader`: a unit whose binding reads only its first bytes is read that far once verified."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from layerfit.engine.unit_reader import UnitReader
from layerfit.engine.units import Block
from layerfit.store.manifest import ALIGN, Segment
from layerfit.store.reader import SegmentReader, aligned_buffer

SENTINEL = 0xA5


def _units(path: Path, pages: list[int]) -> tuple[list[Block], bytes]:
    """A weights file of units ``pages[i]`` pages long, random bytes, and its blocks."""
    data = os.urandom(sum(pages) * ALIGN)
    path.write_bytes(data)
    blocks, offset = [], 0
    for i, n in enumerate(pages):
        chunk = data[offset : offset + n * ALIGN]
        segment = Segment(i, f"layer{i}", "Linear", offset, n * ALIGN, n * ALIGN, hashlib.sha256(chunk).hexdigest(), ())
        blocks.append(Block(i, (segment,)))
        offset += n * ALIGN
    return blocks, data


@st.composite
def _layouts(draw: st.DrawFn) -> tuple[list[int], dict[int, int], int, int]:
    pages = draw(st.lists(st.integers(1, 4), min_size=1, max_size=6))
    extents = {i: draw(st.integers(1, n)) * ALIGN for i, n in enumerate(pages) if draw(st.booleans())}
    first = draw(st.integers(0, len(pages) - 1))
    stop = draw(st.integers(first + 1, len(pages)))
    return pages, extents, first, stop


@settings(max_examples=40, deadline=None)
@given(_layouts())
def test_verified_units_are_read_to_their_extents_in_requests_a_short_unit_ends(tmp_path_factory, layout):
    pages, extents, first, stop = layout
    path = tmp_path_factory.mktemp("units") / "weights.bin"
    blocks, data = _units(path, pages)
    with SegmentReader(path, len(data)) as reader:
        units = UnitReader(reader, "first")
        units.configure(blocks, extents)
        buffer = aligned_buffer(len(data))
        view = memoryview(buffer)
        sizes = units.read_units(first, stop, view)  # the first read verifies: whole units
        assert sizes == [blocks[k].nbytes for k in range(first, stop)]
        base = blocks[first].offset
        span = blocks[stop - 1].offset + blocks[stop - 1].nbytes - base
        assert bytes(view[:span]) == data[base : base + span]
        assert reader.bytes_read == span

        requests = []
        read_range = reader.read_range

        def recording(offset: int, nbytes: int, into: memoryview, what: str) -> None:
            requests.append((offset, nbytes))
            read_range(offset, nbytes, into, what)

        reader.read_range = recording
        view[:span] = bytes([SENTINEL]) * span
        sizes = units.read_units(first, stop, view)
        want = {k: extents.get(k, blocks[k].nbytes) for k in range(first, stop)}
        assert sizes == list(want.values())
        assert reader.bytes_read == span + sum(want.values())
        for k in range(first, stop):
            pos = blocks[k].offset - base
            assert bytes(view[pos : pos + want[k]]) == data[blocks[k].offset : blocks[k].offset + want[k]]
            assert set(view[pos + want[k] : pos + blocks[k].nbytes]) <= {SENTINEL}  # left as it was
        short = [k for k in range(first, stop) if want[k] < blocks[k].nbytes]
        assert len(requests) == len(short) + (stop - 1 not in short)
        view.release()
        buffer.close()


def test_a_unit_is_read_whole_until_verified_and_always_when_every_read_verifies(tmp_path: Path):
    blocks, data = _units(tmp_path / "weights.bin", [3])
    for verify, second in (("first", ALIGN), ("always", 3 * ALIGN), ("never", ALIGN)):
        with SegmentReader(tmp_path / "weights.bin", len(data)) as reader:
            units = UnitReader(reader, verify)
            units.configure(blocks, {0: ALIGN})
            buffer = aligned_buffer(len(data))
            units.read_unit(0, memoryview(buffer))
            first = reader.bytes_read
            units.read_unit(0, memoryview(buffer))
            assert (first, reader.bytes_read - first) == (ALIGN if verify == "never" else 3 * ALIGN, second)
            buffer.close()
