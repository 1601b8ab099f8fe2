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

linux = pytest.mark.skipif(not sys.platform.startswith("linux") or not Path("/proc/self/smaps").exists(),
                           reason="reads /proc/self/smaps")


def smaps_entry(buf: mmap.mmap) -> dict[str, str]:
    """The smaps fields of the mapping that starts at ``buf``."""
    start = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for k, line in enumerate(lines):
        head = line.split()[0]
        if "-" in head and int(head.split("-")[0], 16) == start:
            fields = {}
            for entry in lines[k + 1:]:
                if "-" in entry.split()[0] and ":" not in entry.split()[0]:
                    break
                key, _, value = entry.partition(":")
                fields[key] = value.strip()
            return fields
    raise AssertionError("mapping not found in /proc/self/smaps")


def kib(value: str) -> int:
    return int(value.split()[0]) * 1024


@pytest.mark.parametrize("nbytes", [1, 4096, 5000, 3 * 2**20 + 1])
def test_the_buffer_is_aligned_and_large_enough(nbytes: int):
    buf = aligned_buffer(nbytes)
    try:
        assert len(buf) >= nbytes and len(buf) % reader.ALIGN == 0
        assert ctypes.addressof(ctypes.c_char.from_buffer(buf)) % mmap.PAGESIZE == 0
    finally:
        buf.close()


@linux
@pytest.mark.parametrize("nbytes", [64 * 1024, 8 * 2**20])
def test_the_buffer_is_resident_from_the_start(nbytes: int):
    buf = aligned_buffer(nbytes)
    try:
        assert kib(smaps_entry(buf)["Rss"]) == len(buf)
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
        assert kib(smaps_entry(buf)["Rss"]) == len(buf)
    finally:
        buf.close()
