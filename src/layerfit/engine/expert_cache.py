"""Experts used often stay in memory: a least-frequently-used cache of single experts.

A routed mixture-of-experts layer reads, per pass, only the experts its router chose
(:mod:`layerfit.engine.experts`). Routers are not uniform — some experts are chosen far
more often than others, and consecutive tokens often choose alike — so what ``auto``
leaves of the budget after the units it keeps whole is spent here: the bytes of each
expert read are kept (its slice of every stacked tensor, exactly), and the next pass
that chooses it copies them from memory into the unit's place instead of reading the
file. Every choice is counted; an expert is let in only if it has been chosen more often
than the experts it would push out (the least often chosen, the least recent among
equals). Least-recently-used alone thrashes here: a decode visits the layers in a cycle,
so with room for fewer experts than one token uses, it evicts exactly the next ones
(measured: hit rate 0). :attr:`ExpertCache.stats` counts hits and misses over the
engine's life: the hit rate of a real decode.

The cache holds bytes that were read from the verified file, keyed by (unit, expert);
the engine drops it whenever its configuration (and so its unit numbering) changes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

Slices = Sequence[tuple[int, int]]  # (offset in the unit, bytes) of one expert in each tensor


class ExpertCache:
    """At most ``capacity`` bytes of experts' weights, the most often chosen."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._entries: OrderedDict[tuple[int, int], bytes] = OrderedDict()  # least recent first
        self._chosen: dict[tuple[int, int], int] = {}  # how often each expert was chosen
        self.hits = self.misses = self.evictions = 0
        self.bytes_saved = 0  # bytes copied from memory instead of read

    def cached(self, unit: int) -> frozenset[int]:
        """The experts of ``unit`` held now."""
        return frozenset(e for u, e in self._entries if u == unit)

    def load(self, unit: int, expert: int, view: memoryview, slices: Slices) -> bool:
        """Copy ``expert``'s bytes into ``view`` (the unit's place) at its ``slices``;
        False (a miss, nothing written) when it is not held."""
        self._chosen[unit, expert] = self._chosen.get((unit, expert), 0) + 1
        data = self._entries.get((unit, expert))
        if data is None:
            self.misses += 1
            return False
        self._entries.move_to_end((unit, expert))
        at = 0
        for offset, size in slices:
            view[offset : offset + size] = data[at : at + size]
            at += size
        self.hits += 1
        self.bytes_saved += len(data)
        return True

    def store(self, unit: int, expert: int, view: memoryview, slices: Slices) -> None:
        """Keep ``expert``'s bytes, just read into ``view``, if it was chosen more often than
        each expert it must push out to fit (an expert larger than the cache is not kept)."""
        key = (unit, expert)
        size = sum(n for _, n in slices)
        if size > self.capacity or key in self._entries:
            return
        chosen = self._chosen.get(key, 0)
        victims, freed = [], 0
        for held in sorted(self._entries, key=self._chosen.__getitem__):  # stable: least recent first among equals
            if self.used - freed + size <= self.capacity:
                break
            if self._chosen[held] >= chosen:
                return  # the cache holds experts chosen at least as often
            victims.append(held)
            freed += len(self._entries[held])
        for held in victims:
            self.used -= len(self._entries.pop(held))
            self.evictions += 1
        self._entries[key] = b"".join(bytes(view[offset : offset + n]) for offset, n in slices)
        self.used += size

    def clear(self) -> None:
        self._entries.clear()
        self.used = 0

    @property
    def stats(self) -> dict[str, float]:
        """Hits, misses, hit rate, evictions, bytes held and bytes not read thanks to it."""
        lookups = self.hits + self.misses
        return {
            "capacity_bytes": self.capacity, "held_bytes": self.used, "experts_held": len(self._entries),
            "hits": self.hits, "misses": self.misses, "hit_rate": self.hits / lookups if lookups else 0.0,
            "evictions": self.evictions, "bytes_saved": self.bytes_saved,
        }


__all__ = ["ExpertCache"]
