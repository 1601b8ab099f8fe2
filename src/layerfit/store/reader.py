"""Read weight segments from storage into caller-owned aligned buffers.

``O_DIRECT`` bypasses the page cache, so what the engine reads is the only copy of the
weights in memory (the page cache would otherwise hold a second one, and that counts
against a memory cgroup). Where the filesystem refuses ``O_DIRECT`` (tmpfs, some
overlays) the reader falls back to buffered reads followed by
``posix_fadvise(DONTNEED)`` and says so in :attr:`SegmentReader.mode`.
"""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from layerfit.errors import CorruptStoreError, ReadError
from layerfit.sizes import format_bytes_exact
from layerfit.store.manifest import ALIGN, Segment

# madvise(MADV_POPULATE_WRITE) (Linux 5.14) faults a range in after MADV_HUGEPAGE, which
# MAP_POPULATE cannot follow; Python's mmap module does not name it.
MADV_POPULATE_WRITE = 23
HUGE_PAGE = 2 * 2**20


def aligned_buffer(nbytes: int) -> mmap.mmap:
    """A page-aligned, pre-faulted anonymous buffer of at least ``nbytes`` bytes, in
    transparent huge pages where the kernel grants them.

    Huge pages make the buffer physically contiguous in 2 MiB pieces, so a direct read
    into it is a few long scatter-gather segments instead of one per 4 KiB page; a disk
    whose queue allows few segments per request (virtio-blk: 254) otherwise splits
    every read of a few MiB into many requests. Measured here on 4 MiB units read into
    a 100 MiB buffer: 1.2–1.4 GB/s in 4 KiB pages, 2.8–3.1 GB/s in huge pages, the
    same disk in the same minute (``bench/hugepage_reads.py``). Pre-faulting moves
    the page-fault cost out of the first inference and makes the buffer count in RSS
    from the start, as it will later.
    """
    size = max(ALIGN, (nbytes + ALIGN - 1) // ALIGN * ALIGN)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    huge = getattr(mmap, "MADV_HUGEPAGE", None) if size >= HUGE_PAGE else None
    if huge is None:  # nothing to ask for: the kernel populates it in the one call
        buf = mmap.mmap(-1, size, flags=flags | getattr(mmap, "MAP_POPULATE", 0))
        if getattr(mmap, "MAP_POPULATE", 0):
            return buf
    else:
        buf = mmap.mmap(-1, size, flags=flags)
        try:
            buf.madvise(huge)
            buf.madvise(MADV_POPULATE_WRITE)
            return buf
        except OSError:  # THP compiled out (EINVAL) or a kernel before 5.14: touch each page
            pass
    view = memoryview(buf)
    for off in range(0, size, mmap.PAGESIZE):
        view[off] = 0
    view.release()
    return buf


@dataclass(frozen=True)
class FileIdentity:
    """Cheap identity of the weights file: detects replacement or modification."""

    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: str | Path) -> FileIdentity:
        st = os.stat(path)
        return cls(st.st_ino, st.st_size, st.st_mtime_ns)


def check_weights_file(path: str | Path, expected_size: int) -> FileIdentity:
    """The weights file's identity, once it is known to be there with the manifest's size:
    a missing, truncated or replaced file is refused before anything reads from it."""
    path = Path(path)
    if not path.is_file():
        if path.exists() or path.is_symlink():
            raise CorruptStoreError(
                f"weights file {path} is not a regular file (a FIFO, a device, a folder or a broken link): "
                "prepare the model again"
            )
        raise CorruptStoreError(f"weights file {path} is missing")
    identity = FileIdentity.of(path)
    if identity.size != expected_size:
        raise CorruptStoreError(
            f"weights file {path} has {format_bytes_exact(identity.size)}, the manifest says "
            f"{format_bytes_exact(expected_size)}: the file is truncated or replaced (prepare the model again)"
        )
    return identity


class SegmentReader:
    """Reads whole segments (aligned offset and length) of one weights file."""

    def __init__(self, path: str | Path, expected_size: int, *, direct: bool = True) -> None:
        self.path = Path(path)
        self.identity = check_weights_file(self.path, expected_size)
        self.mode = "buffered"
        self.bytes_read = 0  # every byte read from storage so far (reads from several threads add up)
        self._counting = threading.Lock()
        self._fd = -1
        if direct and hasattr(os, "O_DIRECT"):
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_DIRECT)
                probe = aligned_buffer(ALIGN)
                try:
                    os.preadv(fd, [memoryview(probe)], 0)
                    self._fd, self.mode = fd, "direct"
                except OSError as exc:
                    os.close(fd)
                    if exc.errno != errno.EINVAL:
                        raise
                finally:
                    probe.close()
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                    raise ReadError(f"cannot open {self.path}: {exc}") from exc
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_RDONLY)

    def check_unchanged(self) -> None:
        """Raise if the weights file was replaced or modified since the reader opened."""
        try:
            now = FileIdentity.of(self.path)
        except FileNotFoundError:
            now = None
        if now != self.identity:
            raise CorruptStoreError(
                f"weights file {self.path} changed on disk while the model was loaded "
                "(inode, size or modification time differ): load the model again"
            )

    def read(self, segment: Segment, into: memoryview) -> None:
        """Read ``segment`` into ``into`` (at least ``segment.nbytes`` long, aligned)."""
        what = f"unit {segment.index} ({segment.name or '<root>'})"
        self.read_range(segment.offset, segment.nbytes, into, what)

    def read_range(self, offset: int, nbytes: int, into: memoryview, what: str) -> None:
        """Read ``nbytes`` at ``offset`` (both aligned) into ``into``; errors name ``what``."""
        done = 0
        while done < nbytes:
            try:
                n = os.preadv(self._fd, [into[done:nbytes]], offset + done)
            except OSError as exc:
                raise ReadError(f"reading {what} failed: {exc}") from exc
            if n == 0:
                raise CorruptStoreError(
                    f"weights file {self.path} ends inside {what}: the file is truncated"
                )
            done += n
        with self._counting:
            self.bytes_read += nbytes
        if self.mode == "buffered":
            os.posix_fadvise(self._fd, offset, nbytes, os.POSIX_FADV_DONTNEED)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> SegmentReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def verify_segment(segment: Segment, data: memoryview) -> None:
    """Raise naming the unit if ``data`` does not hash to the manifest's SHA-256."""
    if hashlib.sha256(data[: segment.nbytes]).hexdigest() != segment.sha256:
        raise checksum_error(segment)


def checksum_error(segment: Segment) -> CorruptStoreError:
    """The error for a segment whose bytes do not hash to the manifest's SHA-256."""
    what = "resident tensors" if segment.index < 0 else f"unit {segment.index} ({segment.name or '<root>'})"
    return CorruptStoreError(
        f"checksum mismatch in {what} at offset {segment.offset}: the weights file is "
        "corrupt (prepare the model again)"
    )
