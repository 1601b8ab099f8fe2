"""The calling thread's OpenMP team, and letting it go.

PyTorch runs its CPU kernels on OpenMP (on Linux, the GNU libgomp it bundles). A thread
that runs one parallel kernel keeps a team of helper threads until it exits. libgomp
counts the threads of every team, and once they outnumber the CPUs a waiting thread
spins only 100 times before it sleeps, so every team then runs its kernels at about half
speed, even while the other teams sit idle (README, "Latency per request"). One tensor
operation on a long-lived thread (a server's request decoder, an application's main
thread) thus slows every network the runtime runs afterwards.

:func:`release_thread_team` ends the calling thread's team; its next parallel kernel
starts a new one. Outputs stay bit-identical: the number of threads per kernel does not
change, only whether idle helpers stay alive.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

_OMP_PAUSE_SOFT = 1  # <omp.h> omp_pause_resource_t
T = TypeVar("T")


_found: list[ctypes.CDLL | None] = []  # the answer, once PyTorch (and its OpenMP) is loaded


def _libgomp() -> ctypes.CDLL | None:
    """The libgomp this process has loaded (PyTorch's), or ``None``.

    Only libgomp: its ``omp_pause_resource_all`` frees the calling thread's team alone.
    Another OpenMP runtime (LLVM's libomp, Intel's) may pause every thread's, so it is
    left alone.
    """
    if _found:
        return _found[0]
    lib = _find_libgomp()
    if lib is not None or "torch" in sys.modules:  # torch loads its OpenMP when imported
        _found.append(lib)
    return lib


def _find_libgomp() -> ctypes.CDLL | None:
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    for line in maps.splitlines():
        fields = line.split()
        if len(fields) >= 6 and Path(fields[-1]).name.startswith("libgomp"):
            try:
                lib = ctypes.CDLL(fields[-1], mode=os.RTLD_NOLOAD | os.RTLD_LAZY)  # the copy loaded
                pause = lib.omp_pause_resource_all
            except (OSError, AttributeError):  # gone, or older than OpenMP 5.0
                return None
            pause.argtypes = [ctypes.c_int]
            pause.restype = ctypes.c_int
            return lib
    return None


def release_thread_team() -> bool:
    """End the calling thread's OpenMP team, if it has one, so that its idle helper
    threads stop counting against every other thread's kernels. Call it outside any
    tensor operation, on a thread that will live on without running kernels for a while.
    ``False`` where PyTorch's OpenMP is not libgomp (nothing to do or nothing safe)."""
    lib = _libgomp()
    return lib is not None and lib.omp_pause_resource_all(_OMP_PAUSE_SOFT) == 0


def without_thread_team(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn``, then :func:`release_thread_team` on the same thread (even if it raised):
    for tensor work handed to a pool of long-lived threads."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            release_thread_team()

    return run
