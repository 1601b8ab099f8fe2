"""The allocator setting that returns freed large blocks to the OS, checked in a fresh
process (it is process-wide) by what RSS does after a free."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from layerfit.engine.osmem import _glibc, return_large_frees_to_os

MB = 1024 * 1024

# The first 24 MB block is a mapping; freeing it raises glibc's adaptive threshold to
# 24 MB, so the 16 MB block comes from the heap. A small block after it keeps it off the
# heap's top (which could be trimmed). With the threshold fixed, a block larger than any
# free heap block is a mapping again. RSS is read around each free.
_SCRIPT = """
import json, sys
import torch
from layerfit.engine.osmem import return_large_frees_to_os, rss_bytes

def kept_after_free(nbytes):
    pin = []
    block = torch.ones(nbytes // 4)
    pin.append(torch.ones(1024))
    before = rss_bytes()
    del block
    return before - rss_bytes()

torch.ones(24 * 2**20 // 4)  # a mapping, freed: the adaptive threshold rises
adaptive = kept_after_free(16 * 2**20)
applied = return_large_frees_to_os(4 * 2**20)
fixed = kept_after_free(20 * 2**20)  # larger than the freed heap block, so not served from it
print(json.dumps({"adaptive_returned": adaptive, "applied": applied, "fixed_returned": fixed}))
"""


@pytest.mark.skipif(_glibc() is None, reason="the setting is glibc's")
def test_freed_large_blocks_go_back_to_the_os_once_set() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=120,
        check=True,
    )
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["applied"] is True
    # glibc's default keeps the freed 16 MB block resident ...
    assert seen["adaptive_returned"] < 2 * MB, seen
    # ... and once the threshold is fixed at 4 MB, a freed 20 MB block leaves RSS
    assert seen["fixed_returned"] > 19 * MB, seen


def test_a_negative_threshold_is_refused() -> None:
    with pytest.raises(ValueError, match="threshold_bytes"):
        return_large_frees_to_os(-1)
