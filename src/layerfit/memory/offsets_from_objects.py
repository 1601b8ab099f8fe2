"""Offsets from shared objects: lay a shared-objects plan end to end (TFLite ``ObjectsToOffsets``).

Algorithm:
  1. Plan shared objects with an objects strategy.
  2. Object ``k`` starts where object ``k − 1`` ends; every tensor takes its object's
     offset. The arena is the objects' total.

Registered once per objects heuristic as ``objects:<name>``; ``objects:greedy_in_order``
is TFLite's offset assignment for every strategy except greedy by size, and the
converse conversion does not exist (offsets may overlap across time in ways objects
cannot), so these are never better than the dedicated offset strategies' best.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from layerfit.memory.plans import OffsetsPlan
from layerfit.memory.records import TensorUsageRecord
from layerfit.memory.registry import STRATEGIES, register

OBJECTS_STRATEGIES = (
    "greedy_in_order",
    "greedy_by_breadth",
    "greedy_by_size",
    "greedy_by_size_improved",
    "min_cost_flow",
)


def _end_to_end(name: str) -> Callable[[Sequence[TensorUsageRecord]], OffsetsPlan]:
    def offsets_from_objects(records: Sequence[TensorUsageRecord]) -> OffsetsPlan:
        objects = STRATEGIES["objects"][name].function(records)
        return objects.to_offsets(strategy=f"objects:{name}")

    offsets_from_objects.__name__ = f"offsets_from_{name}"
    offsets_from_objects.__doc__ = f"The {name} shared objects laid end to end."
    return offsets_from_objects


for _name in OBJECTS_STRATEGIES:
    register("offsets", f"objects:{_name}", f"{_name} shared objects laid end to end")(
        _end_to_end(_name)
    )
