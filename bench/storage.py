"""The storage a bench reads from: its block device, a throttle playing a slower card, and the
disk's own direct-read bandwidth (O_DIRECT, the page cache bypassed).

Imports nothing beyond the standard library at load, so a child running in another virtual
environment (bench/vs_mmap.py's llama.cpp) uses it too. Nothing here asserts a timing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from memory_limits import CGROUP_V1, Cgroup, drop_page_cache

# SanDisk Extreme A2 64 GB on a Raspberry Pi 4 (pidramble.com microSD benchmarks)
SD_CARD = {"read_bps": 43_700_000, "write_bps": 36_300_000, "read_iops": 1800, "write_iops": 900}


def block_device(path: Path) -> str:
    """``major:minor`` of the whole disk holding ``path`` (throttles apply to disks)."""
    st = os.stat(path)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    sysfs = Path("/sys/dev/block") / dev
    if (sysfs / "partition").exists():
        dev = (sysfs.resolve().parent / "dev").read_text().strip()
    return dev


class Storage:
    """Where a child's block I/O goes: as it is (``vm``) or throttled like an SD card.

    The throttle grants bytes per time slice, and reads that start within about 0.15 s of
    earlier reads are credited with the idle part of that slice: up to twice as fast as
    the card (``bench/sd_throttle.py``). A bench that times requests calls ``settle()``
    before each, so no request's speed depends on how long the disk idled before it.
    """

    SETTLE_S = 0.5  # idle time after which the throttle reads at its rate again (measured: 0.2 s)

    def __init__(self, kind: str, path: Path) -> None:
        if kind not in ("vm", "sd"):
            raise SystemExit(f"--storage: vm or sd, got {kind!r}")
        self.kind = kind
        self.device = block_device(path)
        self.throttle: Cgroup | None = None
        if kind == "sd":
            self.throttle = Cgroup("blkio")
            if not self.throttle.available:
                raise SystemExit("--storage sd needs a blkio cgroup (v1), i.e. root")
            for key, value in SD_CARD.items():
                (self.throttle.path / f"blkio.throttle.{key}_device").write_text(f"{self.device} {value}")

    @property
    def cgroup(self) -> Path | None:
        return None if self.throttle is None else self.throttle.path

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "device": self.device, **(SD_CARD if self.kind == "sd" else {})}

    def settle(self) -> None:
        """Idle until the throttle has forgotten earlier reads (a no-op for ``vm``)."""
        if self.throttle is not None:
            time.sleep(self.SETTLE_S)

    def bytes_read(self) -> int | None:
        """Bytes read so far through the throttle (``None`` for ``vm``): what the card served."""
        if self.throttle is None:
            return None
        for line in (self.throttle.path / "blkio.throttle.io_service_bytes").read_text().splitlines():
            fields = line.split()
            if len(fields) == 3 and fields[0] == self.device and fields[1] == "Read":
                return int(fields[2])
        return 0

    def enter_fn(self):
        """A ``preexec_fn`` that puts a child under the throttle from its start."""
        return None if self.throttle is None else self.throttle.enter_fn()

    def enter_here(self) -> None:
        """Put this whole process under the throttle (a no-op for ``vm``)."""
        if self.throttle is not None:
            (self.throttle.path / "cgroup.procs").write_text(str(os.getpid()))

    def leave_here(self) -> None:
        """Take this process back out of the throttle (to the blkio root)."""
        if self.throttle is not None:
            (CGROUP_V1 / "blkio" / "cgroup.procs").write_text(str(os.getpid()))

    def remove(self) -> None:
        if self.throttle is not None:
            self.throttle.remove()


def _direct_pass(path: Path, buffer: Any, size: int | None) -> tuple[int, float]:
    """One pass reading ``path`` from its start with ``O_DIRECT`` into ``buffer`` (one
    request of the buffer's length each), up to ``size`` bytes (None: to its end): the
    bytes read and the seconds it took."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    try:
        t0, done = time.perf_counter(), 0
        while size is None or done < size:
            got = os.preadv(fd, [buffer], done)
            if got <= 0:
                break
            done += got
        return done, time.perf_counter() - t0
    finally:
        os.close(fd)


def direct_read_bandwidth(path: Path, limit: int = 1024 * 2**20, chunks: tuple[int, ...] = (8 * 2**20, 64 * 2**20),
                          repeats: int = 2) -> float:
    """Bytes per second reading ``path`` (its first ``limit`` bytes) with O_DIRECT into a
    pre-faulted buffer, the best of ``chunks``-byte requests (each the median of
    ``repeats`` passes): the disk's speed the same minute a bench runs, past the page
    cache, at the request sizes the engine's coalesced reads take (an unfaulted buffer or
    small requests measure well below what the engine reads at). The buffer is the
    engine's own kind (huge pages where granted: bench/hugepage_reads.py)."""
    from layerfit.store.reader import aligned_buffer

    rates = []
    for chunk in chunks:
        buffer = aligned_buffer(chunk)
        size = min(path.stat().st_size, limit) // chunk * chunk
        passes = []
        for _ in range(repeats):
            done, seconds = _direct_pass(path, buffer, size)
            passes.append(done / seconds)
        buffer.close()
        rates.append(sorted(passes)[len(passes) // 2])
    return max(rates)


def direct_read_once(path: Path, chunk: int) -> dict[str, Any]:
    """Read ``path`` whole with ``O_DIRECT`` in ``chunk``-byte reads into a pre-faulted
    buffer of the engine's own kind (huge pages where granted), as the engine reads a
    unit (an unfaulted one halved the rate of 256 MiB reads here), page cache dropped
    first: one pass, as a row (bench/vs_mmap.py's and bench/pipeline_floor.py's records)."""
    from layerfit.store.reader import aligned_buffer

    drop_page_cache()
    buffer = aligned_buffer(chunk)
    try:
        total, seconds = _direct_pass(path, buffer, None)
    finally:
        buffer.close()
    return {"file": str(path), "bytes": total, "seconds": seconds, "bytes_per_s": total / seconds, "chunk_bytes": chunk}

