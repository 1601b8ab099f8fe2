"""Checking a prepared folder's weights against its manifest, end to end.

``layerfit verify DIR`` and a server's periodic re-verification (``--reverify-every``)
read every segment with the same reader the engine uses (direct I/O where the file
system allows) and hash it: a byte flipped with the modification time put back, or a
file truncated or zeroed after the engine's first check, is found here.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from layerfit.store.manifest import Manifest, read_manifest
from layerfit.store.reader import SegmentReader, aligned_buffer, checksum_error

#: When an engine checks a unit's SHA-256: on every read from storage, on its first read
#: only (the default), or never.
VERIFY_MODES = ("always", "first", "never")


@dataclass(frozen=True)
class Verified:
    """What :func:`verify_folder` checked."""

    segments: int
    nbytes: int
    io_mode: str


CHUNK = 4 * 2**20  # hashed a piece at a time: a server re-verifying holds 4 MiB, not its largest layer


def verify_folder(directory: str | Path, manifest: Manifest | None = None) -> Verified:
    """Read and hash every segment of ``directory``; a :class:`~layerfit.errors.CorruptStoreError`
    (or :class:`~layerfit.errors.ManifestError`) naming the first that does not match."""
    m = manifest if manifest is not None else read_manifest(directory)
    largest = max((s.nbytes for s in m.segments), default=0)
    buffer = aligned_buffer(max(min(largest, CHUNK), 1))
    view = memoryview(buffer)
    try:
        with SegmentReader(Path(directory) / m.weights_file, m.weights_size) as reader:
            for segment in m.segments:
                digest = hashlib.sha256()
                what = "resident tensors" if segment.index < 0 else f"unit {segment.index} ({segment.name or '<root>'})"
                for start in range(0, segment.nbytes, CHUNK):
                    n = min(CHUNK, segment.nbytes - start)  # segments are whole pages: aligned
                    reader.read_range(segment.offset + start, n, view, what)
                    digest.update(view[:n])
                if digest.hexdigest() != segment.sha256:
                    raise checksum_error(segment)
            mode = reader.mode
    finally:
        view.release()
        buffer.close()
    return Verified(len(m.segments), sum(s.nbytes for s in m.segments), mode)
