"""The allocator setting that returns freed large blocks to the OS, checked in a fresh
process (it is process-wide) by what RSS does after a free."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from layerfit.engine.osmem import (
    is_glibc,
    library_mappings,
    limit_heap_arenas,
    return_large_frees_to_os,
)
from layerfit.errors import BudgetError

MB = 1024 * 1024


def run_script(script: str, *args: str) -> subprocess.CompletedProcess:
    """``script`` in a fresh Python (the allocator's settings are process-wide), with no
    MALLOC_* variable of ours changing glibc's defaults."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, timeout=120, check=True
    )


def last_json(script: str) -> dict:
    return json.loads(run_script(script).stdout.strip().splitlines()[-1])

# Raw malloc/free on the main thread, so nothing else moves the heap. The first 24 MB
# block is a mapping; freeing it makes glibc raise its thresholds (mmap to 24 MB, heap
# trim to 48 MB), so the 16 MB block comes from the heap's top and stays resident when
# freed. Once set, the free of a small block next to the top gives the 16 MB back, and
# a 20 MB block is a mapping that its free unmaps. RSS is read around each free into a
# buffer made beforehand: reading it allocates nothing from the C heap, where a block
# left above the 16 MB one (a read buffer, say) would keep it off the heap's top. Which
# allocation landed there depended on the interpreter's path, so the test failed under
# one checkout's path and passed under another.
_SCRIPT = """
import ctypes, json, os, resource
from layerfit.engine.osmem import return_large_frees_to_os

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
statm = os.open("/proc/self/statm", os.O_RDONLY)
text = bytearray(128)
page = resource.getpagesize()

def rss():
    read = os.preadv(statm, [text], 0)
    return int(text[:read].split()[1]) * page

def returned_by_free(nbytes):
    block = libc.malloc(nbytes)
    ctypes.memset(block, 1, nbytes)
    before = rss()
    libc.free(block)
    return before - rss()

returned_by_free(4096)  # the calls' own first-use allocations happen here, not above a block
returned_by_free(24 * 2**20)
by_default = returned_by_free(16 * 2**20)
applied = return_large_frees_to_os(4 * 2**20)
top = returned_by_free(100 * 1024)
mapping = returned_by_free(20 * 2**20)
print(json.dumps({"by_default": by_default, "applied": applied, "top": top, "mapping": mapping}))
"""


@pytest.mark.skipif(not is_glibc(), reason="the setting is glibc's")
def test_freed_large_blocks_go_back_to_the_os_once_set() -> None:
    seen = last_json(_SCRIPT)
    assert seen["applied"] is True
    assert seen["by_default"] < 2 * MB, seen  # glibc keeps the freed 16 MB resident ...
    assert seen["top"] > 15 * MB, seen  # ... until its trim threshold is set back
    assert seen["mapping"] > 19 * MB, seen  # and a large block is a mapping again


# The Runtime's "after-pass" setting: a freed 3 MB block (under the 4 MB mmap threshold,
# below a small live block) stays in the heap, where the pass's next allocation reuses it
# without faulting it in; trim_heap() gives its pages back (malloc_trim releases free
# pages anywhere in the heap, not only at its top).
_TRIM_SCRIPT = """
import ctypes, json
from layerfit.engine.osmem import return_large_frees_to_os, rss_bytes, trim_heap

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]

applied = return_large_frees_to_os(4 * 2**20, trim_threshold_bytes=64 * 2**20)
block = libc.malloc(3 * 2**20)
pin = libc.malloc(1024)
ctypes.memset(block, 1, 3 * 2**20)
before = rss_bytes()
libc.free(block)
kept = before - rss_bytes()
trimmed = trim_heap()
returned = before - rss_bytes()
print(json.dumps({"applied": applied, "by_free": kept, "trimmed": trimmed, "by_trim": returned}))
"""


@pytest.mark.skipif(not is_glibc(), reason="the setting is glibc's")
def test_a_heap_trim_gives_back_what_a_high_threshold_kept() -> None:
    seen = last_json(_TRIM_SCRIPT)
    assert seen["applied"] is True and seen["trimmed"] is True
    assert seen["by_free"] < MB, seen  # the freed block stays resident for reuse ...
    assert seen["by_trim"] > 2.5 * MB, seen  # ... until the heap is trimmed


# Threads that allocate at the same time get heaps of their own, up to glibc's limit;
# malloc_stats() lists the heaps ("Arena N:") on stderr.
_ARENA_SCRIPT = """
import ctypes, sys, threading
from layerfit.engine.osmem import limit_heap_arenas

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
if sys.argv[1] != "default":
    assert limit_heap_arenas(int(sys.argv[1]))
barrier = threading.Barrier(6)

def work():
    block = libc.malloc(100_000)  # all six hold a block at once: none can share a free heap
    barrier.wait()
    libc.free(block)

threads = [threading.Thread(target=work) for _ in range(6)]
for t in threads:
    t.start()
for t in threads:
    t.join()
libc.malloc_stats()
"""


@pytest.mark.skipif(not is_glibc(), reason="the setting is glibc's")
def test_threads_share_as_few_heaps_as_told() -> None:
    def heaps(limit: str) -> int:
        stderr = run_script(_ARENA_SCRIPT, limit).stderr
        return sum(line.startswith("Arena ") for line in stderr.splitlines())

    assert heaps("default") >= 4  # glibc: up to eight per CPU
    assert heaps("2") == 2
    assert heaps("1") == 1


def test_a_heap_limit_below_one_is_refused() -> None:
    for bad in (0, -1, True, 2.5):
        with pytest.raises(BudgetError, match="heap arenas"):
            limit_heap_arenas(bad)  # type: ignore[arg-type]


def test_a_threshold_mallopt_cannot_take_is_refused() -> None:
    # 2**32 + 4096 once reached glibc as 4096 (ctypes cut it to a C int): every block
    # over 4 kB would have been a mapping of its own.
    for bad in (-1, 2**31, 2**32 + 4096):
        with pytest.raises(BudgetError, match="mmap threshold"):
            return_large_frees_to_os(bad)
        with pytest.raises(BudgetError, match="heap trim threshold"):
            return_large_frees_to_os(trim_threshold_bytes=bad)


_MAPS = """\
7f0000000000-7f0000100000 r--p 00000000 fd:01 1234 /usr/lib/libtorch_cpu.so
7f0000100000-7f0000200000 r-xp 00100000 fd:01 1234 /usr/lib/libtorch_cpu.so
7f0000200000-7f0000210000 rw-p 00200000 fd:01 1234 /usr/lib/libtorch_cpu.so
7f0000300000-7f0000301000 r--p 00000000 fd:01 99 /usr/lib/libpython3.11.so.1.0
7f0000400000-7f0000500000 r--p 00000000 fd:01 77 /data/weights.safetensors
7f0000600000-7f0000700000 rw-p 00000000 00:00 0
7f0000800000-7f0000801000 r-xp 00000000 00:00 0 [vdso]
7f0000900000-7f0000901000 r--s 00000000 00:05 12 /dev/shm/not-a.so-file
"""


def test_library_mappings_are_the_read_only_mappings_of_shared_objects() -> None:
    assert library_mappings(_MAPS) == [
        (0x7F0000000000, 0x7F0000100000, "/usr/lib/libtorch_cpu.so"),
        (0x7F0000100000, 0x7F0000200000, "/usr/lib/libtorch_cpu.so"),
        (0x7F0000300000, 0x7F0000301000, "/usr/lib/libpython3.11.so.1.0"),
    ]


def _on_tmpfs(path: Path) -> bool:
    """Whether ``path`` lies on a memory file system (its pages cannot be paged out without swap)."""
    best, kind = "", ""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        mount, fs = line.split()[1], line.split()[2]
        if str(path).startswith(mount) and len(mount) > len(best):
            best, kind = mount, fs
    return kind in ("tmpfs", "ramfs")


# A file named like a library, mapped read-only by this process alone (a page another
# process maps is left alone by the kernel), its pages touched; then paged out.
_PAGE_OUT = """
import json, mmap, os, sys
from layerfit.engine.osmem import page_out_libraries

path = sys.argv[1]
with open(path, "wb") as fh:
    fh.write(os.urandom(8 << 20))
    fh.flush()
    os.fsync(fh.fileno())  # clean pages: nothing to write back before they go
fd = os.open(path, os.O_RDONLY)
mapped = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
sum(mapped[k] for k in range(0, len(mapped), mmap.PAGESIZE))

def rss():
    total, ours = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) >= 5 and "-" in fields[0] and ":" in fields[3]:
                ours = len(fields) > 5 and fields[5] == path
            elif ours and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total

before = rss()
advised = page_out_libraries()
print(json.dumps({"before": before, "advised": advised, "after": rss()}))
"""


def test_library_pages_leave_the_process_when_paged_out(tmp_path: Path) -> None:
    if _on_tmpfs(tmp_path):
        pytest.skip("the temporary folder is a memory file system: its pages cannot be paged out")
    run = run_script(_PAGE_OUT, str(tmp_path / "libdata.so"))
    out = json.loads(run.stdout.strip().splitlines()[-1])
    if out["advised"] == 0:
        pytest.skip("this kernel has no MADV_PAGEOUT (Linux 5.4)")
    assert out["before"] >= 7 * MB
    assert out["after"] <= out["before"] // 4
