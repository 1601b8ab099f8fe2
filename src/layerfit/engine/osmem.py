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
_M_ARENA_MAX = -8
DEFAULT_MMAP_THRESHOLD = 4 * 1024 * 1024
HEAP_TRIM_THRESHOLD = 128 * 1024  # glibc's own default, before it adapts
# Heap trim threshold when the heap is trimmed at the end of each forward pass instead
# (Runtime(return_freed_memory="after-pass")): a pass reuses its own freed scratch
# without faulting it in again, and what it freed leaves at its end.
AFTER_PASS_TRIM_THRESHOLD = 16 * 1024 * 1024
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
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
        return libc
    except (OSError, AttributeError):
        return None


def is_glibc() -> bool:
    """Whether this process's C library is glibc, where :func:`return_large_frees_to_os` acts."""
    return _glibc() is not None


def return_large_frees_to_os(
    threshold_bytes: int = DEFAULT_MMAP_THRESHOLD, trim_threshold_bytes: int = HEAP_TRIM_THRESHOLD
) -> bool:
    """Make every later allocation of ``threshold_bytes`` or more a mapping of its own,
    which ``free`` unmaps, and give the heap's free top back above ``trim_threshold_bytes``
    (by default 128 KiB, glibc's own): freed large blocks go back to the OS instead of
    staying resident in the C heap. Process-wide; ``False`` where the C library is not
    glibc or refuses a value.

    Why: glibc's thresholds adapt. Each freed mapping raises the mmap threshold to the
    freed size (up to 32 MiB) and the heap's trim threshold to twice that, so later
    blocks of that size come from the heap, and a freed heap block stays resident. A
    process that runs many models in turn, each execution allocating and freeing
    layer-sized scratch on many threads, keeps tens of MB that no budget counts: 70 MB
    above the ledger (median) under ``layerfit.Runtime`` on a 378.7 MB budget, where a
    cgroup held to the budget paged 31,000 times in one run. Setting the mmap threshold
    stops both from adapting but leaves a trim threshold that has already risen, so that
    one is set back explicitly. Cost: a mapping, and its page faults, per large
    allocation, and at 128 KiB a trim, and page faults again, whenever the heap's free
    top passes it: a model whose layers free and allocate megabytes of scratch runs up
    to twice as slow (mobilenet_v2 at 224 px: 20 -> 40 ms). A larger trim threshold with
    :func:`trim_heap` after each forward pass costs a fraction of that.
    """
    for what, value in (("an mmap", threshold_bytes), ("a heap trim", trim_threshold_bytes)):
        if not 0 <= value <= _INT_MAX:
            raise BudgetError(f"{what} threshold must be 0 to {_INT_MAX} bytes (a C int), got {value}")
    libc = _glibc()
    if libc is None:
        return False
    mapped = libc.mallopt(_M_MMAP_THRESHOLD, int(threshold_bytes)) == 1
    trimmed = libc.mallopt(_M_TRIM_THRESHOLD, int(trim_threshold_bytes)) == 1
    return mapped and trimmed


def limit_heap_arenas(arenas: int) -> bool:
    """Let glibc keep at most ``arenas`` heaps for all threads (its default: eight per
    CPU). Process-wide; ``False`` where the C library is not glibc or refuses the value.

    Why: each heap other than the main one keeps its free top up to the trim threshold,
    and :func:`trim_heap` does not give that back, only the free pages below it. A
    runtime that runs every forward pass on a fresh thread spreads its passes over as
    many heaps as it may. Trimmed after each pass (16 MiB threshold), the thesis and
    edge workloads of ``bench/freed_memory.py`` ended 21 and 62 MiB above their idle
    RSS with glibc's default, and 5 and 13 MiB with one heap per CPU (two here), which
    also lowered their RSS p95 by 20 and 50 MiB (one run each).
    """
    if isinstance(arenas, bool) or not isinstance(arenas, int) or not 1 <= arenas <= _INT_MAX:
        raise BudgetError(f"heap arenas must be 1 to {_INT_MAX}, got {arenas!r}")
    libc = _glibc()
    return libc is not None and libc.mallopt(_M_ARENA_MAX, arenas) == 1


def trim_heap() -> bool:
    """Give every free page of the C heaps back to the OS (glibc ``malloc_trim``), all
    threads' arenas, not only the top; ``False`` where the C library is not glibc."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
