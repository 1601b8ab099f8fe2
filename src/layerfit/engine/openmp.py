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

:func:`set_compute_threads` sets how many threads each kernel uses. With several
networks in flight, one thread each keeps the teams from outnumbering the cores, at the
price of the last bits: a kernel's result depends on how many threads split it.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from layerfit.errors import LayerfitError

COMPUTE_THREADS_HELP = (
    "threads each PyTorch kernel uses (default: PyTorch's, one per core); outputs equal model(x) "
    "computed with the same number, bit for bit"
)
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


def set_compute_threads(threads: int | None, option: str = "threads") -> int:
    """Run PyTorch's CPU kernels on ``threads`` threads each from now on and return the
    number in effect (``None``: keep PyTorch's, by default one per core).

    Process-wide, as ``torch.set_num_threads``, and only for threads that have not run a
    kernel yet (each keeps the count it started with), so call it before any work. Outputs
    then equal ``model(x)`` run with the same count, bit for bit; a different count
    changes convolutions in the last bits. ``option`` names the setting in the error.
    """
    import torch

    if check_compute_threads(threads, option) is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def kernels_on(threads: int) -> str:
    """How reports name the thread count: ``"kernels on 2 threads"``."""
    return f"kernels on {threads} thread{'s' * (threads != 1)}"


def check_compute_threads(threads: int | None, option: str = "threads") -> int | None:
    """``threads`` if :func:`set_compute_threads` takes it (``None`` or a whole number, 1
    or more); otherwise an error naming ``option``."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise LayerfitError(f"{option} must be a whole number of threads, 1 or more, not {threads!r}")
    return threads
