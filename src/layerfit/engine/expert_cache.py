"""Experts used often stay in memory: a least-frequently-used cache of single experts.

A routed mixture-of-experts layer reads, per pass, only the experts its router chose
(:mod:`layerfit.engine.experts`). Routers are not uniform — some experts are chosen far
more often than others, and consecutive tokens often choose alike — so what ``auto``
leaves of the budget after the units it keeps whole is spent here, in one pre-faulted
buffer cut into slots of one expert each (its slice of every stacked tensor, laid out
as :meth:`~layerfit.engine.experts.ExpertTable.slices` says): the bytes of each expert
read are kept, and the next pass that chooses it copies them from memory into the unit's
place instead of reading the file. Every choice is counted; an expert is let in only if
it has been chosen more often than the experts it would push out (the least often
chosen, the least recent among equals). Least-recently-used alone thrashes here: a
decode visits the layers in a cycle, so with room for fewer experts than one token uses,
it evicts exactly the next ones (measured: hit rate 0). :attr:`ExpertCache.stats` counts
hits and misses over the engine's life: the hit rate of a real decode.

The cache holds bytes that were read from the verified file, keyed by (unit, expert);
the engine makes a new one whenever its configuration (and so its unit numbering)
changes. A copy is a plain ``memcpy`` between two buffers.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Sequence

from layerfit.store.manifest import ALIGN
from layerfit.store.reader import aligned_buffer

Slices = Sequence[tuple[int, int, int]]
"""Of one expert's slice of each tensor: (where it lies in the view copied to or from —
the unit's place, or a slot of a compact one —, bytes, where it lies in a slot)."""

Key = tuple[int, int]  # (unit, expert)


class ExpertCache:
    """Slots of ``slot_bytes`` (rounded up to whole pages), as many as ``capacity`` holds,
    for the experts chosen most. Used by the executing thread only."""

    def __init__(self, capacity: int, slot_bytes: int) -> None:
        self.slot_bytes = self.rounded(slot_bytes)
        self.slots = capacity // self.slot_bytes
        self.capacity = self.slots * self.slot_bytes
        self._memory = aligned_buffer(self.capacity) if self.slots else None
        self.view = memoryview(self._memory) if self._memory is not None else memoryview(bytearray())
        self._free = list(range(self.slots - 1, -1, -1))
        self._entries: OrderedDict[Key, int] = OrderedDict()  # the slot of each, least recent first
        self._chosen: dict[Key, int] = {}  # how often each expert was chosen
        self.hits = self.misses = self.evictions = 0
        self.bytes_saved = 0  # bytes copied from memory instead of read

    @staticmethod
    def rounded(slot_bytes: int) -> int:
        """The bytes of a slot for ``slot_bytes``: whole pages."""
        return -(-max(slot_bytes, 1) // ALIGN) * ALIGN

    @property
    def used(self) -> int:
        """Bytes of the slots holding an expert."""
        return len(self._entries) * self.slot_bytes

    def cached(self, unit: int) -> frozenset[int]:
        """The experts of ``unit`` held now."""
        return frozenset(e for u, e in self._entries if u == unit)

    def chose(self, unit: int, expert: int) -> None:
        """Count a choice of ``expert`` served without the cache (read ahead on a guess)."""
        self._chosen[unit, expert] = self._chosen.get((unit, expert), 0) + 1

    def load(self, unit: int, expert: int, view: memoryview, slices: Slices) -> bool:
        """Copy ``expert``'s bytes into ``view`` at its ``slices`` (their first field: where
        in ``view``); False (a miss, nothing written) when it is not held."""
        key = (unit, expert)
        self._chosen[key] = self._chosen.get(key, 0) + 1
        slot = self._entries.get(key)
        if slot is None:
            self.misses += 1
            return False
        self._entries.move_to_end(key)
        base = slot * self.slot_bytes
        for offset, size, at in slices:
            view[offset : offset + size] = self.view[base + at : base + at + size]
            self.bytes_saved += size
        self.hits += 1
        return True

    def store(self, unit: int, expert: int, view: memoryview, slices: Slices) -> None:
        """Keep ``expert``'s bytes, just read into ``view``, if it was chosen more often than
        each expert it must push out to fit."""
        key = (unit, expert)
        if key in self._entries or not self._admit(key):
            return
        slot = self._free.pop()
        self._entries[key] = slot
        base = slot * self.slot_bytes
        for offset, size, at in slices:
            self.view[base + at : base + at + size] = view[offset : offset + size]

    def _admit(self, key: Key) -> bool:
        """Make room for ``key`` if each expert it pushes out was chosen less often; False,
        changing nothing, if it may not come in."""
        if not self.slots:
            return False
        chosen = self._chosen.get(key, 0)
        victims = []
        for held in sorted(self._entries, key=lambda k: self._chosen.get(k, 0)):  # stable: least recent first among equals
            if len(self._entries) - len(victims) < self.slots:
                break
            if self._chosen.get(held, 0) >= chosen:
                return False  # the cache holds experts chosen at least as often
            victims.append(held)
        for held in victims:
            self._free.append(self._entries.pop(held))
            self.evictions += 1
        return True

    def close(self) -> None:
        """Give the slots' memory back."""
        self._entries.clear()
        self.view.release()
        if self._memory is not None:
            with contextlib.suppress(BufferError):  # a view is still alive: freed with it
                self._memory.close()

    @property
    def stats(self) -> dict[str, float]:
        """Hits, misses, hit rate, evictions, bytes held and bytes not read thanks to it."""
        lookups = self.hits + self.misses
        return {
            "capacity_bytes": self.capacity, "slot_bytes": self.slot_bytes, "slots": self.slots,
            "held_bytes": self.used, "experts_held": len(self._entries), "hits": self.hits, "misses": self.misses,
            "hit_rate": self.hits / lookups if lookups else 0.0, "evictions": self.evictions,
            "bytes_saved": self.bytes_saved,
        }


__all__ = ["ExpertCache", "Slices"]
