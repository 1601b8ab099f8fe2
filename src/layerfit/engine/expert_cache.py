"""Experts held in memory: the most often chosen, and those read ahead for the next layer.

A routed mixture-of-experts layer reads, per pass, only the experts its router chose
(:mod:`layerfit.engine.experts`). Routers are not uniform — some experts are chosen far
more often than others, and consecutive tokens often choose alike — so what ``auto``
leaves of the budget after the units it keeps whole is spent here, in one pre-faulted
buffer cut into slots of one expert each (its slice of every stacked tensor, read in
whole pages). Two kinds of entries share the slots:

* **kept** experts: the bytes of an expert read are kept, and the next pass that chooses
  it copies them from memory into the unit's place instead of reading the file. Every
  choice is counted; an expert is let in only if it has been chosen more often than the
  experts it would push out (the least often chosen, the least recent among equals).
  Least-recently-used alone thrashes here: a decode visits the layers in a cycle, so
  with room for fewer experts than one token uses, it evicts exactly the next ones
  (measured: hit rate 0).
* experts **read ahead**: at most :attr:`ExpertCache.ahead_slots` slots are reserved for
  the experts the next layer is predicted to choose (:mod:`layerfit.engine.expert_prefetch`),
  read there on another thread while the layers before it run. When that layer runs, a
  chosen one is copied like a kept one (waiting for its read if it is still under way);
  afterwards it becomes a kept expert if the rule above lets it in, and the slot of one
  not chosen is freed (its bytes counted as read ahead for nothing).

:attr:`ExpertCache.stats` counts hits and misses over the engine's life: the hit rate of
a real decode. The cache holds bytes read from the verified file, keyed by (unit,
expert); the engine makes a new one whenever its configuration (and so its unit
numbering) changes. Copies are plain ``memcpy`` between two huge-page buffers (6 MB in
about 0.25 ms here).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from layerfit.store.manifest import ALIGN
from layerfit.store.reader import aligned_buffer

Slices = Sequence[tuple[int, int, int]]
"""(offset in the unit, bytes, offset in the slot) of one expert's slice of each tensor."""

Key = tuple[int, int]  # (unit, expert)


@dataclass
class _Ahead:
    """An expert read ahead for a unit that has not run yet."""

    slot: int
    reading: bool = True  # its read is under way
    ok: bool = False  # its read succeeded
    used: bool = False  # its layer chose it
    dropped: bool = False  # its layer ran while it was read: the slot goes when the read ends
    nbytes: int = 0  # bytes its read took


class ExpertCache:
    """Slots of ``slot_bytes`` (rounded up to whole pages), as many as ``capacity`` holds;
    ``ahead_slots`` of them may hold experts read ahead, the rest kept experts."""

    def __init__(self, capacity: int, slot_bytes: int, ahead_slots: int = 0) -> None:
        self.slot_bytes = self.rounded(slot_bytes)
        self.slots = capacity // self.slot_bytes
        self.capacity = self.slots * self.slot_bytes
        self.ahead_slots = min(ahead_slots, self.slots)
        self._memory = aligned_buffer(self.capacity) if self.slots else None
        self.view = memoryview(self._memory) if self._memory is not None else memoryview(bytearray())
        self._free = list(range(self.slots - 1, -1, -1))
        self._entries: OrderedDict[Key, int] = OrderedDict()  # kept: the slot of each, least recent first
        self._ahead: dict[Key, _Ahead] = {}
        self._expected: set[int] = set()  # units read ahead for that have not run yet
        self._chosen: dict[Key, int] = {}  # how often each expert was chosen
        self._cond = threading.Condition()
        self.hits = self.misses = self.evictions = 0
        self.bytes_saved = 0  # bytes copied from memory instead of read
        self.ahead_read = self.ahead_hits = 0  # experts read ahead, and of them chosen
        self.ahead_wasted_bytes = 0  # bytes read ahead for experts their layer did not choose

    @staticmethod
    def rounded(slot_bytes: int) -> int:
        """The bytes of a slot for ``slot_bytes``: whole pages (direct reads land there)."""
        return -(-max(slot_bytes, 1) // ALIGN) * ALIGN

    @property
    def used(self) -> int:
        """Bytes of the slots holding an expert (kept or read ahead)."""
        with self._cond:
            return (len(self._entries) + len(self._ahead)) * self.slot_bytes

    @property
    def kept_limit(self) -> int:
        return self.slots - self.ahead_slots

    def cached(self, unit: int) -> frozenset[int]:
        """The kept experts of ``unit``."""
        with self._cond:
            return frozenset(e for u, e in self._entries if u == unit)

    # --- the executing thread: a routed unit's lookups ------------------------------------

    def load(self, unit: int, expert: int, view: memoryview, slices: Slices) -> bool:
        """Copy ``expert``'s bytes into ``view`` (the unit's place) at its ``slices``, from
        a kept slot or one read ahead (waiting for that read to end); False (a miss,
        nothing written) when it is not held."""
        key = (unit, expert)
        with self._cond:
            self._chosen[key] = self._chosen.get(key, 0) + 1
            ahead = self._ahead.get(key)
            while ahead is not None and ahead.reading:
                self._cond.wait()
            if ahead is not None and ahead.ok:
                ahead.used = True
                slot = ahead.slot
                self.ahead_hits += 1
            elif key in self._entries:
                slot = self._entries[key]
                self._entries.move_to_end(key)
            else:
                self.misses += 1
                return False
            self.hits += 1
        # Outside the lock: a slot is reused only by this thread (store, settle).
        base = slot * self.slot_bytes
        for offset, size, at in slices:
            view[offset : offset + size] = self.view[base + at : base + at + size]
            self.bytes_saved += size
        return True

    def store(self, unit: int, expert: int, view: memoryview, slices: Slices) -> None:
        """Keep ``expert``'s bytes, just read into ``view``, if it was chosen more often than
        each kept expert it must push out to fit."""
        key = (unit, expert)
        with self._cond:
            if key in self._entries or key in self._ahead or not self._admit(key):
                return
            slot = self._free.pop()
            self._entries[key] = slot
        base = slot * self.slot_bytes
        for offset, size, at in slices:
            self.view[base + at : base + at + size] = view[offset : offset + size]

    def settle(self, unit: int) -> None:
        """``unit`` ran: what was read ahead for it and chosen becomes a kept expert if the
        rule lets it in; every other slot read ahead for it is freed (once its read ends)."""
        with self._cond:
            self._expected.discard(unit)
            for key in [k for k in self._ahead if k[0] == unit]:
                ahead = self._ahead[key]
                if ahead.reading:
                    ahead.dropped = True
                    continue
                del self._ahead[key]
                if ahead.used and self._admit(key):
                    self._entries[key] = ahead.slot
                    continue
                self._free.append(ahead.slot)
                if ahead.ok and not ahead.used:
                    self.ahead_wasted_bytes += ahead.nbytes

    def _admit(self, key: Key) -> bool:
        """Make room among the kept experts for ``key`` if each one it pushes out was
        chosen less often (lock held); False, changing nothing, if it may not come in."""
        if self.kept_limit <= 0:
            return False
        chosen = self._chosen.get(key, 0)
        victims = []
        for held in sorted(self._entries, key=lambda k: self._chosen.get(k, 0)):  # stable: least recent first among equals
            if len(self._entries) - len(victims) < self.kept_limit:
                break
            if self._chosen.get(held, 0) >= chosen:
                return False  # the cache holds experts chosen at least as often
            victims.append(held)
        for held in victims:
            self._free.append(self._entries.pop(held))
            self.evictions += 1
        return True

    # --- the read-ahead thread ---------------------------------------------------------------

    def expect(self, unit: int) -> None:
        """Experts are about to be read ahead for ``unit``, which has not run yet."""
        with self._cond:
            self._expected.add(unit)

    def begin(self, unit: int) -> None:
        """``unit`` runs: no more slots are reserved for it (a read under way ends)."""
        with self._cond:
            self._expected.discard(unit)

    def reserve(self, unit: int, expert: int) -> int | None:
        """The byte offset in :attr:`view` of a slot to read ``expert`` ahead into; None
        when it is held already, ``unit`` has run since it was expected, or every slot
        for reading ahead is taken."""
        key = (unit, expert)
        with self._cond:
            if (unit not in self._expected or key in self._entries or key in self._ahead
                    or len(self._ahead) >= self.ahead_slots or not self._free):
                return None
            slot = self._free.pop()
            self._ahead[key] = _Ahead(slot)
            return slot * self.slot_bytes

    def finish(self, unit: int, expert: int, nbytes: int | None) -> None:
        """The read of ``expert`` ahead ended: ``nbytes`` read, or None if it failed (its
        layer then reads it itself)."""
        key = (unit, expert)
        with self._cond:
            ahead = self._ahead[key]
            ahead.reading, ahead.ok, ahead.nbytes = False, nbytes is not None, nbytes or 0
            self.ahead_read += ahead.ok
            if ahead.dropped:  # its layer ran without it
                del self._ahead[key]
                self._free.append(ahead.slot)
                self.ahead_wasted_bytes += ahead.nbytes
            self._cond.notify_all()

    def settle_all(self) -> None:
        """A pass ended: free every slot read ahead (for a unit it did not run)."""
        with self._cond:
            units = {u for u, _ in self._ahead} | self._expected
        for unit in units:
            self.settle(unit)

    # --- the engine --------------------------------------------------------------------------

    def close(self) -> None:
        """Give the slots' memory back (no read may be under way)."""
        self._entries.clear()
        self._ahead.clear()
        self.view.release()
        if self._memory is not None:
            with contextlib.suppress(BufferError):  # a view is still alive: freed with it
                self._memory.close()

    @property
    def stats(self) -> dict[str, float]:
        """Hits, misses, hit rate, evictions, bytes held and bytes not read thanks to it;
        experts read ahead, how many of them were chosen and the bytes of those not."""
        with self._cond:
            lookups = self.hits + self.misses
            return {
                "capacity_bytes": self.capacity, "slot_bytes": self.slot_bytes, "slots": self.slots,
                "ahead_slots": self.ahead_slots, "held_bytes": len(self._entries) * self.slot_bytes,
                "experts_held": len(self._entries), "hits": self.hits, "misses": self.misses,
                "hit_rate": self.hits / lookups if lookups else 0.0, "evictions": self.evictions,
                "bytes_saved": self.bytes_saved, "read_ahead": self.ahead_read, "read_ahead_hits": self.ahead_hits,
                "read_ahead_wasted_bytes": self.ahead_wasted_bytes,
            }


__all__ = ["ExpertCache", "Slices"]
