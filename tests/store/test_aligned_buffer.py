"""The read buffers: page-aligned, pre-faulted, and in transparent huge pages where the
kernel grants them (a direct read into them is then a few long segments)."""

from __future__ import annotations

import ctypes
import mmap
import sys
from pathlib import Path

import pytest

from layerfit.store import reader
from layerfit.store.reader import aligned_buffer

linux = pytest.mark.skipif(not sys.platform.startswith("linux") or not Path("/proc/self/pagemap").exists(),
                           reason="reads /proc/self/smaps and pagemap")


def address(buf: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def smaps_entry(buf: mmap.mmap) -> dict[str, str]:
    """The smaps fields of the mapping that holds ``buf`` (the kernel may have merged it
    with a neighbour of the same flags)."""
    start = address(buf)
    fields: dict[str, str] = {}
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            if inside:
                break
            low, high = (int(x, 16) for x in head.split("-"))
            inside = low <= start < high
        elif inside:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    assert fields, "mapping not found in /proc/self/smaps"
    return fields


def resident_pages(buf: mmap.mmap) -> int:
    """How many of ``buf``'s pages are in memory (the present bit of /proc/self/pagemap)."""
    page = mmap.PAGESIZE
    first, count = address(buf) // page, len(buf) // page
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(first * 8)
        entries = pagemap.read(count * 8)
    return sum(int.from_bytes(entries[k : k + 8], "little") >> 63 for k in range(0, len(entries), 8))


@pytest.mark.parametrize("nbytes", [1, 4096, 5000, 3 * 2**20 + 1])
def test_the_buffer_is_aligned_and_large_enough(nbytes: int):
    buf = aligned_buffer(nbytes)
    try:
        assert len(buf) >= nbytes and len(buf) % reader.ALIGN == 0
        assert address(buf) % mmap.PAGESIZE == 0
    finally:
        buf.close()


@linux
@pytest.mark.parametrize("nbytes", [64 * 1024, 8 * 2**20])
def test_the_buffer_is_resident_from_the_start(nbytes: int):
    buf = aligned_buffer(nbytes)
    try:
        assert resident_pages(buf) == len(buf) // mmap.PAGESIZE
    finally:
        buf.close()


@linux
@pytest.mark.skipif(not hasattr(mmap, "MADV_HUGEPAGE"), reason="no MADV_HUGEPAGE on this platform")
def test_a_large_buffer_asks_for_huge_pages():
    buf = aligned_buffer(8 * 2**20)
    try:
        flags = smaps_entry(buf).get("VmFlags", "")
        if not flags:
            pytest.skip("this kernel's smaps has no VmFlags")
        assert "hg" in flags.split()
    finally:
        buf.close()


@linux
def test_without_populate_advice_every_page_is_touched(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(reader, "MADV_POPULATE_WRITE", 0x7FFF)  # an advice no kernel knows: EINVAL
    buf = aligned_buffer(4 * 2**20)
    try:
        assert resident_pages(buf) == len(buf) // mmap.PAGESIZE
    finally:
        buf.close()
