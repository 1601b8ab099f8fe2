"""Memory as the operating system sees it: peak RSS (resettable) and cgroup usage, and
the C allocator's setting that decides whether freed memory goes back to it."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import psutil

from layerfit.errors import BudgetError

_M_TRIM_THRESHOLD = -1  # glibc <malloc.h>
_M_MMAP_THRESHOLD = -3
DEFAULT_MMAP_THRESHOLD = 4 * 1024 * 1024
HEAP_TRIM_THRESHOLD = 128 * 1024  # glibc's own default, before it adapts
_INT_MAX = 2**31 - 1  # mallopt takes a C int


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark of this process (Linux ``clear_refs`` 5)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """Peak resident set size since the process started or the last reset."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return psutil.Process().memory_info().rss


def rss_bytes() -> int:
    """Current resident set size."""
    return psutil.Process().memory_info().rss


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (the only one whose allocator these settings are for)."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 -- raises AttributeError outside glibc
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]  # else ctypes truncates silently
        libc.mallopt.restype = ctypes.c_int
        return libc
    except (OSError, AttributeError):
        return None


def is_glibc() -> bool:
    """Whether this process's C library is glibc, where :func:`return_large_frees_to_os` acts."""
    return _glibc() is not None


def return_large_frees_to_os(threshold_bytes: int = DEFAULT_MMAP_THRESHOLD) -> bool:
    """Make every later allocation of ``threshold_bytes`` or more a mapping of its own,
    which ``free`` unmaps, and give the heap's free top back above 128 KiB: freed large
    blocks go back to the OS instead of staying resident in the C heap. Process-wide;
    ``False`` where the C library is not glibc or refuses a value.

    Why: glibc's thresholds adapt. Each freed mapping raises the mmap threshold to the
    freed size (up to 32 MiB) and the heap's trim threshold to twice that, so later
    blocks of that size come from the heap, and a freed heap block stays resident. A
    process that runs many models in turn, each execution allocating and freeing
    layer-sized scratch on many threads, keeps tens of MB that no budget counts: 70 MB
    above the ledger (median) under ``layerfit.Runtime`` on a 378.7 MB budget, where a
    cgroup held to the budget paged 31,000 times in one run. Setting the mmap threshold
    stops both from adapting but leaves a trim threshold that has already risen, so that
    one is set back explicitly. Cost: a mapping, and its page faults, per large
    allocation, and a trim whenever the heap's free top passes 128 KiB. Measured under
    the Runtime on closed workloads: 13 % more minor page faults, RSS 13-71 MB lower,
    and a mean response changed by -2 % to +22 % over four A/B sets on a noisy 2-core
    VM (+1 to +2 %, +9 to +22 %, +9 % and -2 %).
    """
    if not 0 <= threshold_bytes <= _INT_MAX:
        raise BudgetError(
            f"an mmap threshold must be 0 to {_INT_MAX} bytes (a C int), got {threshold_bytes}"
        )
    libc = _glibc()
    if libc is None:
        return False
    mapped = libc.mallopt(_M_MMAP_THRESHOLD, int(threshold_bytes)) == 1
    trimmed = libc.mallopt(_M_TRIM_THRESHOLD, HEAP_TRIM_THRESHOLD) == 1
    return mapped and trimmed
