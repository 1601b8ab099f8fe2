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
