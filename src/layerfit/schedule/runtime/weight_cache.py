"""Loaded weights kept in the budget's spare memory between jobs, given back on demand.

Without it every job reads every unit of its models again, even when the budget could
hold them all: a server at a loose budget pays the streaming cost on every request. With
it, an **unload** task hands its unit's buffer — and the ledger reservation the load
retained for it — to the cache instead of freeing it, and a later **load** task of the
same unit of the same model takes the buffer back instead of reading it.

The budget is never exceeded for it. Cached bytes stay reserved in the
:class:`~layerfit.schedule.MemoryLedger` (so the ledger and the process agree on what is
resident), but they count as free to the policy: before a task's memory is reserved the
dispatcher asks the cache to :meth:`~WeightCache.make_room`, which evicts entries until
the task fits. Which entries go first:

1. units no network in flight will load any more before units one still will (of
   those, the units it reaches last first);
2. units of the model requested least often lately (a count per model, all halved every
   :data:`AGING` requests, so that traffic that moves on is followed);
3. of equally requested models, the units cached for the first time last.

Weights are streamed in order and models are requested over and over, so evicting the
least recently used unit evicts exactly the unit the next pass needs first: with models
requested in turn nothing would ever hit. Rule 3 instead keeps a fixed set that every
pass finds. ``bench/weight_cache_eviction.py`` compares these orders on synthetic traces.

Only memory admitted within the budget is cached: a unit loaded by the progress rule or
over-committed is freed as before. Entries are never shared: a buffer belongs to the
cache or to one network at a time (two jobs of one model running at once read the unit
each, and the second one unloaded is freed). Thread-safe under the ledger's lock.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Protocol

from layerfit.schedule.ledger import Admission, MemoryLedger
from layerfit.schedule.tasks import Task, TaskKind

AGING = 64  # requests after which every model's request count is halved


class UnitBuffer(Protocol):
    """A loaded unit's memory: its size, and a way to give it back to the OS."""

    nbytes: int

    def free(self) -> None: ...


@dataclass(eq=False)
class _Entry:
    model: Hashable
    unit: int
    buffer: UnitBuffer
    key: tuple[str, int]  # its reservation in the ledger
    reserved: int  # the ledger's bytes for it (the load's estimate)


class WeightCache:
    """Units of loaded models kept between jobs, within the ledger's budget.

    ``locate(task)`` names the model a load task reads from (any hashable that changes
    when the model is reloaded, e.g. its engine pool), or ``None`` for a task whose unit
    must not be cached.
    """

    def __init__(self, ledger: MemoryLedger, locate: Callable[[Task], Hashable | None]) -> None:
        self._ledger = ledger
        self._locate = locate
        self._entries: dict[tuple[Hashable, int], _Entry] = {}
        self._claimed: dict[str, _Entry] = {}  # load task id -> the entry it takes
        self._requests: dict[Hashable, int] = {}  # model -> requests lately (halved every AGING)
        self._first_cached: dict[tuple[Hashable, int], int] = {}  # (model, unit) -> rank
        self._passes: dict[Hashable, tuple[Hashable, set[int]]] = {}  # network -> model, units it loaded
        self._keys = itertools.count()
        self._ranks = itertools.count()
        self.reserved = 0  # ledger bytes of the entries
        self.nbytes = 0  # buffer bytes of the entries
        self.hits = 0
        self.hit_bytes = 0  # buffer bytes of the hits: what they did not read
        self.misses = 0
        self.evictions = 0

    # --- the dispatcher -------------------------------------------------------------

    def reclaimable(self) -> int:
        """Ledger bytes the cache gives back if a task needs them (all of its entries)."""
        return self.reserved

    def make_room(self, task: Task, nbytes: int) -> None:
        """``task`` is about to reserve ``nbytes``: claim its unit if cached, then evict
        entries until ``nbytes`` fits the ledger (or nothing is left to evict)."""
        with self._ledger.condition:
            if task.kind is TaskKind.LOAD and task.retained > 0:
                model = self._locate(task)
                if model is not None:
                    self._passes.setdefault(task.network, (model, set()))[1].add(task.layer)
                    entry = self._entries.get((model, task.layer))
                    if entry is None:
                        self.misses += 1
                    else:
                        self.hits += 1
                        self.hit_bytes += entry.buffer.nbytes
                        self._forget(entry)
                        self._claimed[task.id] = entry
            if self._entries and not self._ledger.fits(nbytes):
                for entry in sorted(self._entries.values(), key=self._eviction_order):
                    self._evict(entry)
                    if self._ledger.fits(nbytes):
                        break

    def _eviction_order(self, entry: _Entry) -> tuple[bool, int, int]:
        wanted = any(
            model == entry.model and entry.unit not in loaded for model, loaded in self._passes.values()
        )
        if wanted:  # needed again soon: the unit the networks in flight reach last goes first
            return True, self._requests.get(entry.model, 0), -entry.unit
        return False, self._requests.get(entry.model, 0), -self._first_cached[(entry.model, entry.unit)]

    def requested(self, network: Hashable, model: Hashable) -> None:
        """``network`` of a job just submitted will stream ``model``: that model's entries
        are worth more, every other model's less, and the entries it will load are kept
        until it has (evicted only when nothing else is left to evict)."""
        with self._ledger.condition:
            self._requests[model] = self._requests.get(model, 0) + 1
            if sum(self._requests.values()) >= AGING:
                self._requests = {key: count // 2 for key, count in self._requests.items()}
            self._passes[network] = (model, set())

    def finished(self, network: Hashable) -> None:
        """``network``'s job is over: it loads nothing more."""
        with self._ledger.condition:
            self._passes.pop(network, None)

    # --- the executor ---------------------------------------------------------------

    def take(self, task_id: str) -> UnitBuffer | None:
        """The buffer :meth:`make_room` claimed for load task ``task_id``, if any (once)."""
        with self._ledger.condition:
            entry = self._claimed.pop(task_id, None)
            return None if entry is None else entry.buffer

    def put(self, model: Hashable, unit: int, buffer: UnitBuffer, held: Hashable) -> bool:
        """Keep ``buffer`` (unit ``unit`` of ``model``) with the reservation ``held`` that the
        ledger holds for it; ``False`` if not kept — the caller frees the buffer then."""
        with self._ledger.condition:
            if (model, unit) in self._entries:  # another job's copy is cached already
                return False
            key = ("weight-cache", next(self._keys))
            admission = self._ledger.transfer(held, key, owner="weight-cache")
            if admission is None:  # the reservation was freed (its job was cancelled)
                return False
            if admission is not Admission.FIT:  # over the budget: give it back now
                self._ledger.release(key)
                return False
            entry = _Entry(model, unit, buffer, key, self._ledger.held(key))
            if (model, unit) not in self._first_cached:
                self._first_cached[(model, unit)] = next(self._ranks)
            self._entries[(model, unit)] = entry
            self.reserved += entry.reserved
            self.nbytes += buffer.nbytes
            return True

    def drop_model(self, model: Hashable) -> None:
        """Free every entry of ``model`` (it was unloaded or replaced)."""
        with self._ledger.condition:
            for entry in [e for e in self._entries.values() if e.model == model]:
                self._evict(entry, count=False)
            self._requests.pop(model, None)
            self._first_cached = {k: r for k, r in self._first_cached.items() if k[0] != model}
            self._passes = {n: p for n, p in self._passes.items() if p[0] != model}

    def evict_all(self) -> int:
        """Free every entry (not the buffers loads in flight have claimed); returns the
        buffer bytes freed."""
        with self._ledger.condition:
            freed = self.nbytes
            for entry in list(self._entries.values()):
                self._evict(entry, count=False)
            return freed

    def clear(self) -> None:
        """Free every entry and every buffer claimed but not taken."""
        with self._ledger.condition:
            self.evict_all()
            for entry in self._claimed.values():
                entry.buffer.free()
            self._claimed.clear()
            self._requests.clear()
            self._first_cached.clear()
            self._passes.clear()

    def reset_counters(self) -> None:
        """Start counting hits, misses and evictions afresh (after a warm-up)."""
        with self._ledger.condition:
            self.hits = self.hit_bytes = self.misses = self.evictions = 0

    def stats(self) -> dict[str, int]:
        with self._ledger.condition:
            return {
                "entries": len(self._entries),
                "bytes": self.nbytes,
                "reserved_bytes": self.reserved,
                "hits": self.hits,
                "hit_bytes": self.hit_bytes,
                "misses": self.misses,
                "evictions": self.evictions,
            }

    # --- entries --------------------------------------------------------------------

    def _forget(self, entry: _Entry) -> None:
        """Take ``entry`` out of the cache and its bytes out of the ledger."""
        del self._entries[(entry.model, entry.unit)]
        self.reserved -= entry.reserved
        self.nbytes -= entry.buffer.nbytes
        self._ledger.release(entry.key)

    def _evict(self, entry: _Entry, *, count: bool = True) -> None:
        self._forget(entry)
        entry.buffer.free()
        if count:
            self.evictions += 1


__all__ = ["UnitBuffer", "WeightCache"]
