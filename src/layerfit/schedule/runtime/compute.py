"""The engine's process-wide compute, as the runtime's callers use it: the layers above
the runtime (the server) take these from here and never import :mod:`layerfit.engine`.

- :func:`set_compute_threads` / :func:`check_compute_threads`: how many threads each
  PyTorch kernel uses, set once before the runtime's threads run a kernel;
- :func:`without_thread_team`: tensor work handed to a pool of long-lived threads (a
  server's request decoding) that must not keep an OpenMP team there, or every forward
  pass the runtime runs afterwards slows down (:mod:`layerfit.engine.openmp`);
- :func:`flat_outputs`: every tensor of a model's output, in order, as the runtime's
  futures resolve to it.
"""

from __future__ import annotations

from layerfit.engine.measurement import flat_outputs
from layerfit.engine.openmp import (
    COMPUTE_THREADS_HELP,
    check_compute_threads,
    kernels_on,
    set_compute_threads,
    without_thread_team,
)

__all__ = [
    "COMPUTE_THREADS_HELP",
    "check_compute_threads",
    "flat_outputs",
    "kernels_on",
    "set_compute_threads",
    "without_thread_team",
]
