"""The memory an engine holds for streamed and kept weights, sized by its plan.

Three buffers at most: the read buffer (``ring``, host memory the reader fills; pinned
when a copy stage reads it), the copy stage's device buffer (``device_ring``), and the
memory of the units pipeline ``auto`` keeps (``kept``). A new plan reshapes the rings in
place when it can, so a reconfiguration does not map their memory again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import torch

from layerfit.capture.units import storage_address
from layerfit.engine.device import Device
from layerfit.engine.ring import RingBuffer
from layerfit.engine.skeleton import Binding, bind
from layerfit.engine.unit_reader import UnitReader
from layerfit.store.reader import aligned_buffer


class WeightBuffers:
    """The read, device and kept buffers of one engine on ``device``."""

    def __init__(self, device: Device, trace: bool) -> None:
        self.device = device
        self.trace = trace  # rings record their occupancy for the timeline
        self.ring: RingBuffer | None = None  # the read buffer
        self.device_ring: RingBuffer | None = None  # the copy stage's target
        self.kept: RingBuffer | None = None  # the units auto keeps
        self._pinned: torch.Tensor | None = None  # the read buffer, while pinned

    def resize(
        self, capacity: int, device_capacity: int, room: threading.Condition, copyable: threading.Condition
    ) -> None:
        """Rings of ``capacity`` and ``device_capacity`` bytes (0: none), whose waiters
        wait on ``room`` and ``copyable``; the read buffer pinned for a copy stage."""
        self.unpin()
        self.ring = self._resized(self.ring, capacity, room, None)
        self.device_ring = self._resized(self.device_ring, device_capacity, copyable, self.device.device_buffer)
        if self.ring is not None and self.device_ring is not None and self.device.pins_host:
            self._pinned = self.ring.bytes[: self.ring.capacity]  # not the pages given back
            self.device.pin(self._pinned)

    def _resized(
        self,
        ring: RingBuffer | None,
        capacity: int,
        condition: threading.Condition,
        storage: Callable[[int], torch.Tensor] | None,
    ) -> RingBuffer | None:
        """``ring`` with ``capacity`` (reshaped in place when it can be); None for 0."""
        if ring is not None and capacity and ring.reshape(capacity):
            ring.record_history = self.trace
            return ring
        if ring is not None:
            ring.close()
        if not capacity:
            return None
        ring = RingBuffer(capacity, condition, None if storage is None else storage(capacity))
        ring.record_history = self.trace
        return ring

    def keep(self, nbytes: int, units: Sequence[int], reader: UnitReader, bindings: Sequence[list[Binding]]) -> None:
        """Read ``units`` (those ``auto`` keeps) into their own buffer of ``nbytes`` and
        bind them for good; with a copy stage that buffer is device memory."""
        staged = self.device_ring is not None
        self.kept = RingBuffer(nbytes, None, self.device.device_buffer(nbytes) if staged else None)
        self.bind_for_good(units, self.kept, reader, bindings, staged)

    def preload(self, units: Sequence[int], reader: UnitReader, bindings: Sequence[list[Binding]]) -> None:
        """Read every unit once and bind it for good (the preload policy)."""
        if self.device_ring is None:
            self.bind_for_good(units, self.ring, reader, bindings)
        else:
            self.bind_for_good(units, self.device_ring, reader, bindings, staged=True)

    def bind_for_good(
        self,
        units: Sequence[int],
        target: RingBuffer,
        reader: UnitReader,
        bindings: Sequence[list[Binding]],
        staged: bool = False,
    ) -> None:
        """Read ``units`` into ``target`` and bind them there for good. ``staged``: the
        target is device memory, reached through a host staging buffer of the largest of
        them that is freed after."""
        if not units:
            return
        blocks = reader.blocks
        staging = aligned_buffer(max(blocks[i].nbytes for i in units)) if staged else None
        view = memoryview(staging) if staged else None
        host = torch.frombuffer(staging, dtype=torch.uint8) if staged else None
        try:
            for i in units:
                n = blocks[i].nbytes
                off = target.allocate(n)
                if staged:
                    reader.read_unit(i, view[:n])
                    self.device.copy(target.bytes[off : off + n], host[:n])
                else:
                    reader.read_unit(i, target.view[off : off + n])
                bind(bindings[i], target.bytes, off)
        finally:
            del host
            if staged:
                view.release()
                staging.close()

    def release_kept(self) -> None:
        """Free the kept units' memory (their bindings are undone by the caller first)."""
        if self.kept is not None:
            self.kept.close()
            self.kept = None

    def unpin(self) -> None:
        if self._pinned is not None:
            self.device.unpin(self._pinned)
            self._pinned = None

    def close(self) -> None:
        """Free every buffer."""
        self.release_kept()
        self.unpin()
        for ring in (self.ring, self.device_ring):
            if ring is not None:
                ring.close()
        self.ring = self.device_ring = None

    @property
    def streaming_rings(self) -> list[RingBuffer]:
        """The read and device buffers that exist."""
        return [r for r in (self.ring, self.device_ring) if r is not None]

    def streamed_addresses(self) -> set[int]:
        """Storage addresses of the streaming rings, whose bytes the next units overwrite."""
        streamed = {storage_address(r.bytes) for r in self.streaming_rings}
        streamed.discard(None)
        return streamed

    def occupancy(self, t0: float, kept_bytes: int) -> list[tuple[float, int]]:
        """Bytes held in the unit buffers over time (read + device buffer), from ``t0``."""
        rings = self.streaming_rings
        changes = sorted((t, k, b) for k, r in enumerate(rings) for t, b in r.history)
        held = [0] * len(rings)
        out = []
        for t, k, b in changes:
            held[k] = b
            out.append((max(t - t0, 0.0), kept_bytes + sum(held)))
        return out


__all__ = ["WeightBuffers"]
