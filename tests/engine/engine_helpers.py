"""Helpers the engine tests share."""

from __future__ import annotations

import os


def read_spy():
    """(reads, spy): ``spy`` stands in for ``os.preadv`` and records each request's
    (offset, length) in ``reads``."""
    real = os.preadv
    reads: list[tuple[int, int]] = []

    def spy(fd, buffers, offset, *rest):
        reads.append((offset, sum(len(b) for b in buffers)))
        return real(fd, buffers, offset, *rest)

    return reads, spy


def finish_read_ahead(engine) -> None:
    """Wait until the engine's read-ahead has read all it will (a caller whose work
    between two calls outlasts it): what the next pass adopts no longer depends on timing."""
    ahead = engine.stream.read_ahead.current
    if ahead is not None:
        ahead.join()
