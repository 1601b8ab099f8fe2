"""An engine fitted to a memory limit: configured at its minimum, measured, then given the
weight budget its footprint leaves (the rule and what is measured:
:mod:`layerfit.memory_limit`)."""

from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING

from layerfit.engine.config import EngineConfig
from layerfit.engine.osmem import page_out_libraries, reset_peak_rss, trim_heap
from layerfit.engine.plan import plan
from layerfit.engine.skeleton import segment_bindings
from layerfit.errors import BudgetError
from layerfit.memory_limit import (
    Footprint,
    effective_limit,
    kv_bytes_per_token,
    measured_footprint,
    process_memory,
)
from layerfit.sizes import Budget, format_bytes
from layerfit.store.examples import example_call
from layerfit.store.manifest import Manifest

if TYPE_CHECKING:
    from layerfit.engine.engine import Engine


class MemoryRoom:
    """The room ``config.memory_limit`` gives ``engine`` (loaded: its skeleton built, no
    weight read yet). Made before the resident weights are read, it refuses a limit the
    process already fills, so that nothing starts that the limit would kill; :meth:`fit`
    then measures the footprint and configures the engine."""

    def __init__(self, engine: Engine, config: EngineConfig) -> None:
        assert config.memory_limit is not None
        self.engine, self.config = engine, config
        self.limit, self.notice = effective_limit(config.memory_limit)
        if self.notice is not None:
            warnings.warn(self.notice, stacklevel=4)
        manifest = engine.manifest
        self.minimum = _minimum_budget(engine, config)
        self.asked = None if config.budget is None else config.budget.bytes_for(manifest.total_bytes)
        trim_heap()  # what building the skeleton freed goes back before anything is measured
        # Library pages the imports left resident that no pass runs again go back too: the
        # passes below fault back the ones they run, which the footprint then counts.
        page_out_libraries()
        held = process_memory().resident_bytes
        weights = max(self.minimum, self.asked or 0)
        if held + weights > self.limit:
            what = "the budget asked" if self.asked is not None and self.asked > self.minimum else (
                "the model's minimum weight budget")
            raise BudgetError(
                f"memory limit {format_bytes(self.limit)} cannot run this model: the process holds "
                f"{format_bytes(held)} before its weights and {what} is {format_bytes(weights)}: it needs more "
                f"than {format_bytes(held + weights)}"
            )

    def fit(self) -> Footprint:
        """Configure the engine at its minimum budget, run its folder's example call twice
        (the first brings in what any pass needs once; the second is measured), and
        reconfigure it with what the limit leaves (the budget asked, where it fits). A limit
        the measure finds too small is one line saying what the model needs."""
        engine, config = self.engine, self.config
        engine.reconfigure(config.replace(budget=Budget(nbytes=self.minimum)))
        args, kwargs = example_call(engine.manifest)
        engine(*args, **kwargs)
        first = process_memory()
        peak_reset = reset_peak_rss()
        engine(*args, **kwargs)
        after = process_memory()
        # Without a resettable peak the process's lifetime peak stands in (larger: safe).
        peak = after.peak_bytes if peak_reset else max(after.peak_bytes, first.peak_bytes)
        footprint = measured_footprint(
            self.limit, first, peak, engine.memory.weight_bytes, after.resident_bytes - first.resident_bytes,
            config.kv_positions * kv_bytes_per_position(engine) + config.kv_beside_bytes, self.minimum,
        )
        footprint.check(self.asked, self.notice)  # too small a limit says so before the search below
        footprint = self._with_made_bytes(footprint)
        engine.reconfigure(config.replace(budget=Budget(nbytes=footprint.check(self.asked, self.notice))))
        return footprint

    def _with_made_bytes(self, footprint: Footprint) -> Footprint:
        """``footprint`` with the bytes the units held for good make beside the budget (a
        GGUF model's dequantized or packed values, which the budget's stored bytes do not
        count): the largest budget whose plan, with what its held units make, fits what
        the limit leaves (found by bisection: a larger budget holds a superset)."""
        engine, config = self.engine, self.config
        if not engine.binder.counts_made:
            return footprint
        room = footprint.weight_budget_bytes
        packed = not config.dequantize
        made_of: dict[int, int] = {}

        def made(budget: int) -> int:
            chosen = plan(engine.manifest, config.replace(budget=Budget(nbytes=budget)), engine.model)
            held = range(len(chosen.blocks)) if chosen.weights.policy.resident else chosen.weights.kept
            for i in held:
                if i not in made_of:
                    made_of[i] = sum(b.made_nbytes for seg in chosen.blocks[i].segments
                                     for b in segment_bindings(engine.model, seg, packed=packed))
            return sum(made_of[i] for i in held)

        if room + made(room) <= room:  # nothing held is made
            return footprint
        low, high = self.minimum, room  # low fits (it holds nothing for good), high does not
        while high - low > max(1, room // 1000):
            middle = (low + high) // 2
            low, high = (middle, high) if middle + made(middle) <= room else (low, middle)
        return dataclasses.replace(footprint, made_bytes=room - low)


def within(footprint: Footprint, config: EngineConfig, manifest: Manifest) -> EngineConfig:
    """``config`` (a reconfiguration of an engine fitted to a limit) with the budget the
    limit leaves, or its own where it fits in that."""
    asked = None if config.budget is None else config.budget.bytes_for(manifest.total_bytes)
    return config.replace(budget=Budget(nbytes=footprint.check(asked)))


def _minimum_budget(engine: Engine, config: EngineConfig) -> int:
    """The least weight budget ``config``'s pipeline runs in: the resident tensors and the
    largest unit, or every weight for a pipeline that holds them all (preload)."""
    unbounded = plan(engine.manifest, config.replace(budget=None), engine.model)
    try:
        plan(engine.manifest, config.replace(budget=Budget(nbytes=unbounded.memory.minimum_budget)), engine.model)
    except BudgetError:
        return unbounded.memory.weight_bytes
    return unbounded.memory.minimum_budget


def kv_bytes_per_position(engine: Engine) -> int:
    """Bytes of KV cache a position of the engine's model takes (0: it has none)."""
    config = getattr(engine.model, "config", None)
    if config is None:
        return 0
    dtype = next((p.dtype for p in engine.model.parameters() if p.is_floating_point()), None)
    return kv_bytes_per_token(config, dtype.itemsize if dtype is not None else 4)


__all__ = ["MemoryRoom", "kv_bytes_per_position", "within"]
