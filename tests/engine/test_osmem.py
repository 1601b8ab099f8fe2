"""The allocator setting that returns freed large blocks to the OS, checked in a fresh
process (it is process-wide) by what RSS does after a free."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from layerfit.engine.osmem import is_glibc, return_large_frees_to_os
from layerfit.errors import BudgetError

MB = 1024 * 1024

# Raw malloc/free on the main thread, so nothing else moves the heap. The first 24 MB
# block is a mapping; freeing it makes glibc raise its thresholds (mmap to 24 MB, heap
# trim to 48 MB), so the 16 MB block comes from the heap's top and stays resident when
# freed. Once set, the free of a small block next to the top gives the 16 MB back, and
# a 20 MB block is a mapping that its free unmaps. RSS is read around each free.
_SCRIPT = """
import ctypes, json
from layerfit.engine.osmem import return_large_frees_to_os, rss_bytes

libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]

def returned_by_free(nbytes):
    block = libc.malloc(nbytes)
    ctypes.memset(block, 1, nbytes)
    before = rss_bytes()
    libc.free(block)
    return before - rss_bytes()

returned_by_free(24 * 2**20)
by_default = returned_by_free(16 * 2**20)
applied = return_large_frees_to_os(4 * 2**20)
top = returned_by_free(100 * 1024)
mapping = returned_by_free(20 * 2**20)
print(json.dumps({"by_default": by_default, "applied": applied, "top": top, "mapping": mapping}))
"""


@pytest.mark.skipif(not is_glibc(), reason="the setting is glibc's")
def test_freed_large_blocks_go_back_to_the_os_once_set() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=120,
        check=True,
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["applied"] is True
    assert seen["by_default"] < 2 * MB, seen  # glibc keeps the freed 16 MB resident ...
    assert seen["top"] > 15 * MB, seen  # ... until its trim threshold is set back
    assert seen["mapping"] > 19 * MB, seen  # and a large block is a mapping again


def test_a_threshold_mallopt_cannot_take_is_refused() -> None:
    # 2**32 + 4096 once reached glibc as 4096 (ctypes cut it to a C int): every block
    # over 4 kB would have been a mapping of its own.
    for bad in (-1, 2**31, 2**32 + 4096):
        with pytest.raises(BudgetError, match="mmap threshold"):
            return_large_frees_to_os(bad)
