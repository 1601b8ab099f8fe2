"""Prove a memory plan legal, or say exactly why it is not.

A shared-objects plan is legal when every tensor has exactly one object, that object is
at least as large as the tensor, and no two tensors of one object have intersecting
usage intervals. An offsets plan is legal when every tensor lies inside the arena and
no two tensors with intersecting usage intervals overlap in bytes.

Both checks sweep the operators in order and compare a starting tensor only with the
tensors still live, so they cost ``O(n · breadth)`` rather than ``O(n²)``.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from layerfit.errors import PlanError
from layerfit.memory.plans import OffsetsPlan, Plan, SharedObjectsPlan
from layerfit.memory.records import TensorUsageRecord, check_records


class IllegalPlanError(PlanError):
    """A plan that lets two live tensors share bytes, or misses or misplaces a tensor."""


def plan_violations(records: Sequence[TensorUsageRecord], plan: Plan, limit: int = 10) -> list[str]:
    """Up to ``limit`` human-readable reasons why ``plan`` is illegal (empty when legal)."""
    check_records(records)
    if isinstance(plan, SharedObjectsPlan):
        return _objects_violations(records, plan, limit)
    if isinstance(plan, OffsetsPlan):
        return _offsets_violations(records, plan, limit)
    raise PlanError(f"not a memory plan: {type(plan).__name__}")


def validate_plan(records: Sequence[TensorUsageRecord], plan: Plan) -> None:
    """Raise :class:`IllegalPlanError` listing the first violations unless ``plan`` is legal."""
    problems = plan_violations(records, plan)
    if problems:
        raise IllegalPlanError(
            f"{plan.approach} plan of strategy {plan.strategy!r} is illegal: " + "; ".join(problems)
        )


def _coverage(
    records: Sequence[TensorUsageRecord], assigned: dict[int, int], what: str
) -> list[str]:
    ids = {r.id for r in records}
    out = [f"tensor {r.id} has no {what}" for r in records if r.id not in assigned]
    out += [f"{what} given for unknown tensor {t}" for t in assigned if t not in ids]
    return out


def _live_sweep(records: Sequence[TensorUsageRecord]):
    """Yield (record, live records started before it whose intervals intersect it)."""
    order = sorted(records, key=lambda r: (r.first_op, r.last_op, r.id))
    heap: list[tuple[int, int, TensorUsageRecord]] = []
    live: dict[int, TensorUsageRecord] = {}
    for rec in order:
        while heap and heap[0][0] < rec.first_op:
            live.pop(heapq.heappop(heap)[1], None)
        yield rec, list(live.values())
        live[rec.id] = rec
        heapq.heappush(heap, (rec.last_op, rec.id, rec))


def _objects_violations(
    records: Sequence[TensorUsageRecord], plan: SharedObjectsPlan, limit: int
) -> list[str]:
    out = _coverage(records, plan.object_ids, "shared object")
    n_obj = len(plan.object_sizes)
    for size in plan.object_sizes:
        if size < 0:
            out.append(f"object size {size} is negative")
    for rec in records:
        obj = plan.object_ids.get(rec.id)
        if obj is None:
            continue
        if not 0 <= obj < n_obj:
            out.append(
                f"tensor {rec.id} is assigned to object {obj}, but there are {n_obj} objects"
            )
        elif plan.object_sizes[obj] < rec.size:
            out.append(
                f"tensor {rec.id} ({rec.size} B) does not fit object {obj} ({plan.object_sizes[obj]} B)"
            )
    for rec, live in _live_sweep(records):
        if len(out) >= limit:
            break
        obj = plan.object_ids.get(rec.id)
        for other in live:
            if obj is not None and plan.object_ids.get(other.id) == obj:
                out.append(
                    f"tensors {other.id} [{other.first_op}, {other.last_op}] and {rec.id} "
                    f"[{rec.first_op}, {rec.last_op}] are live together in object {obj}"
                )
    return out[:limit]


def _offsets_violations(
    records: Sequence[TensorUsageRecord], plan: OffsetsPlan, limit: int
) -> list[str]:
    out = _coverage(records, plan.offsets, "offset")
    for rec in records:
        off = plan.offsets.get(rec.id)
        if off is None:
            continue
        if off < 0:
            out.append(f"tensor {rec.id} has negative offset {off}")
        elif off + rec.size > plan.arena_size:
            out.append(
                f"tensor {rec.id} at [{off}, {off + rec.size}) ends beyond the arena of "
                f"{plan.arena_size} B"
            )
    for rec, live in _live_sweep(records):
        if len(out) >= limit:
            break
        off = plan.offsets.get(rec.id)
        if off is None or rec.size == 0:
            continue
        for other in live:
            o2 = plan.offsets.get(other.id)
            if o2 is None or other.size == 0:
                continue
            if off < o2 + other.size and o2 < off + rec.size:
                out.append(
                    f"tensors {other.id} (bytes [{o2}, {o2 + other.size}), ops "
                    f"[{other.first_op}, {other.last_op}]) and {rec.id} (bytes "
                    f"[{off}, {off + rec.size}), ops [{rec.first_op}, {rec.last_op}]) overlap"
                )
    return out[:limit]
