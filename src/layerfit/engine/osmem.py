"""Memory as the operating system sees it: peak RSS (resettable) and cgroup usage, the
C allocator's setting that decides whether freed memory goes back to it, and the
libraries' pages given back once loaded."""

from __future__ import annotations

import ctypes
import errno
import functools
from pathlib import Path
from typing import Any

import psutil

from layerfit.errors import BudgetError
from layerfit.memory_limit import process_memory

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
    return process_memory().peak_bytes or psutil.Process().memory_info().rss


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


_MADV_PAGEOUT = 21  # <sys/mman.h>, Linux 5.4


@functools.cache
def _madvise() -> Any:
    """The C library's ``madvise``, or None where it has none."""
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


def library_mappings(maps: str | None = None) -> list[tuple[int, int, str]]:
    """``(start, end, path)`` of each read-only mapping of a shared library (a ``.so``
    file) in ``maps`` (by default this process's ``/proc/self/maps``): the libraries'
    code and constants, whose resident pages are page cache, not the process's own."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            return []
    out = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or "w" in fields[1] or fields[4] == "0" or not fields[5].startswith("/"):
            continue
        name = fields[5].rsplit("/", 1)[-1]
        if name.endswith(".so") or ".so." in name:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            out.append((start, end, fields[5]))
    return out


def page_out_libraries() -> int:
    """Ask the kernel to reclaim now the pages of this process's shared libraries
    (``madvise(MADV_PAGEOUT)`` on their read-only mappings); bytes of mappings advised,
    0 where the kernel (before Linux 5.4) or the C library cannot.

    Why: importing PyTorch runs the static initialisers spread over all of
    ``libtorch_cpu.so``, which leaves about 75 MB of library pages resident that no pass
    runs again. Resident, they count in the process's RSS and in its memory cgroup's
    usage until the kernel needs the memory, so a footprint measured once loaded reads
    them as memory the process needs. Paged out once loaded, the next passes fault back
    what they run (from the disk, once): the resident file pages of ResNet-152 or a
    0.5 GB decoder after three passes fell from about 100 MB to 45
    (bench/results/footprint.md). Nothing changes but where the pages are: a clean
    library page is never written. A page another process maps too stays where it is.
    """
    madvise = _madvise()
    if madvise is None:
        return 0
    advised = 0
    for start, end, _ in library_mappings():
        if madvise(start, end - start, _MADV_PAGEOUT) == 0:
            advised += end - start
        elif ctypes.get_errno() == errno.EINVAL:  # a kernel without MADV_PAGEOUT
            return advised
    return advised
