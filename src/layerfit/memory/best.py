"""``best``: run a portfolio of heuristics and keep the smallest plan.

The paper recommends evaluating several strategies before the first inference and
keeping the best; their ranking differs from network to network. The portfolio also
breaks ties several ways, because every greedy strategy resolves equal sizes or equal
breadths by record order and operator order:

  1. Members: every registered heuristic of the approach (for offsets this includes
     both strip-packing priorities and the shared-objects plans laid end to end).
  2. Variants of the input: as given; record order reversed (other ties); time mirrored
     (op ``t`` becomes ``T − t``, which maps legal plans to legal plans); both.
     The min-cost flow member, the slowest, runs on the input as given only, and not at
     all past ``PORTFOLIO_ARC_LIMIT`` reuse arcs (its network is quadratic: minutes and
     gigabytes for ten thousand tensors); the note then says so.
  3. Keep the first plan of minimal total; stop early once a plan meets the lower bound,
     since nothing can beat it.

The plan's ``note`` names the winning member and variant.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from layerfit.memory.bounds import objects_lower_bound, offsets_lower_bound
from layerfit.memory.objects_min_cost_flow import PORTFOLIO_ARC_LIMIT, reuse_arc_count
from layerfit.memory.plans import OffsetsPlan, Plan, SharedObjectsPlan
from layerfit.memory.records import TensorUsageRecord, mirror
from layerfit.memory.registry import STRATEGIES, register

Variant = tuple[str, Callable[[Sequence[TensorUsageRecord]], list[TensorUsageRecord]]]

VARIANTS: tuple[Variant, ...] = (
    ("as given", list),
    ("ties reversed", lambda rs: list(reversed(rs))),
    ("mirrored", mirror),
    ("mirrored, ties reversed", lambda rs: list(reversed(mirror(rs)))),
)


# members whose cost grows faster than quadratically run on the first variant only
SLOW_MEMBERS = ("min_cost_flow", "objects:min_cost_flow")


def _members(
    approach: str, first_variant: bool, slow: bool = True
) -> Iterator[tuple[str, Callable[[Sequence[TensorUsageRecord]], Plan]]]:
    for name, entry in STRATEGIES[approach].items():
        if not entry.heuristic or name == "naive":
            continue
        if name in SLOW_MEMBERS and not (first_variant and slow):
            continue
        if approach == "offsets" and name == "strip_packing":
            for priority in ("lifetime", "size"):
                yield (
                    f"strip_packing[{priority}]",
                    lambda rs, fn=entry.function, p=priority: fn(rs, priority=p),
                )
        else:
            yield name, entry.function


def _portfolio(records: Sequence[TensorUsageRecord], approach: str, bound: int) -> tuple[Plan, str]:
    best: Plan | None = None
    label = "naive"
    slow = reuse_arc_count(records) <= PORTFOLIO_ARC_LIMIT
    for number, (variant, transform) in enumerate(VARIANTS):
        variant_records = transform(records)
        for name, function in _members(approach, number == 0, slow):
            candidate = function(variant_records)
            if best is None or candidate.total < best.total:
                best, label = candidate, f"{name} ({variant})"
            if best.total <= bound:
                return best, label
    if best is None:  # no heuristic registered: fall back to no sharing
        best = STRATEGIES[approach]["naive"].function(records)
    if not slow:
        label += f"; min_cost_flow left out (over {PORTFOLIO_ARC_LIMIT} reuse arcs)"
    return best, label


@register(
    "objects",
    "best",
    "portfolio of every objects heuristic, ties broken several ways",
    heuristic=False,
)
def best_objects(records: Sequence[TensorUsageRecord]) -> SharedObjectsPlan:
    bound = objects_lower_bound(records)
    plan, label = _portfolio(records, "objects", bound)
    assert isinstance(plan, SharedObjectsPlan)
    return SharedObjectsPlan(
        plan.object_sizes, dict(plan.object_ids), "best", lower_bound=bound, note=label
    )


@register(
    "offsets",
    "best",
    "portfolio of every offsets heuristic, ties broken several ways",
    heuristic=False,
)
def best_offsets(records: Sequence[TensorUsageRecord]) -> OffsetsPlan:
    bound = offsets_lower_bound(records)
    plan, label = _portfolio(records, "offsets", bound)
    assert isinstance(plan, OffsetsPlan)
    return OffsetsPlan(plan.arena_size, dict(plan.offsets), "best", lower_bound=bound, note=label)
