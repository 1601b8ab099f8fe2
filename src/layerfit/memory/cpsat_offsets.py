"""Offsets, exact: an OR-Tools CP-SAT model with a time limit.

Model (sizes in units of their gcd):
  1. ``offset[i] ∈ [0, UB − size(i)]`` where ``UB`` is the best heuristic arena, whose
     plan also seeds the search as a hint.
  2. Each tensor is a rectangle: a *fixed* time interval ``[first_op, last_op + 1)`` and
     a memory interval ``[offset[i], offset[i] + size(i))``; ``NoOverlap2D`` over all of
     them (2D strip packing with the time axis fixed).
  3. Redundant ``NoOverlap`` on the memory intervals of every maximal set of tensors live
     at one operator (stronger propagation; together they imply constraint 2).
  4. ``arena ≥ offset[i] + size(i)``; minimise ``arena`` within ``[max breadth, UB]``.
  5. Stop at the time limit, at proven optimality, or as soon as ``arena`` meets the
     lower bound. The model is complete, so the solver's bound is a bound for every plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from layerfit.memory.bounds import offsets_lower_bound
from layerfit.memory.cpsat_common import (
    DEFAULT_TIME_LIMIT,
    DEFAULT_WORKERS,
    check_solver_options,
    cp_model,
    legal_hint,
    size_unit,
    solve,
)
from layerfit.memory.plans import FEASIBLE, OPTIMAL, OffsetsPlan
from layerfit.memory.profiles import maximal_cliques
from layerfit.memory.records import TensorUsageRecord
from layerfit.memory.registry import register


@register(
    "offsets",
    "cpsat",
    "exact CP-SAT NoOverlap2D model (optimal, or feasible with gap at the time limit)",
    options=("time_limit", "workers", "hint"),
    heuristic=False,
)
def cpsat_offsets(
    records: Sequence[TensorUsageRecord],
    time_limit: float = DEFAULT_TIME_LIMIT,
    workers: int = DEFAULT_WORKERS,
    hint: OffsetsPlan | None = None,
) -> OffsetsPlan:
    check_solver_options(time_limit, workers)
    lb = offsets_lower_bound(records)
    from layerfit.memory.best import best_offsets  # on use: it runs every strategy

    hint = legal_hint(records, hint, OffsetsPlan, best_offsets)
    if hint.total <= lb:
        return _done(hint, OPTIMAL, lb, "heuristic hint meets the lower bound")

    unit = size_unit(records)
    ub = hint.total // unit
    model = cp_model().CpModel()
    arena = model.new_int_var(lb // unit, ub, "arena")
    offset: dict[int, Any] = {}
    mem: dict[int, Any] = {}
    time_iv = []
    mem_iv = []
    for i, r in enumerate(records):
        size = r.size // unit
        offset[i] = model.new_int_var(0, ub - size if size else 0, f"o{i}")
        if size == 0:
            continue  # an empty tensor takes no bytes and conflicts with nothing
        mem[i] = model.new_fixed_size_interval_var(offset[i], size, f"m{i}")
        time_iv.append(
            model.new_fixed_size_interval_var(r.first_op, r.last_op - r.first_op + 1, f"t{i}")
        )
        mem_iv.append(mem[i])
        model.add(arena >= offset[i] + size)
    model.add_no_overlap_2d(time_iv, mem_iv)
    for clique in maximal_cliques(records):
        members = [mem[i] for i in clique.members if i in mem]
        if len(members) > 1:
            model.add_no_overlap(members)
    model.minimize(arena)
    for i, r in enumerate(records):
        model.add_hint(offset[i], hint.offsets[r.id] // unit)
    model.add_hint(arena, ub)

    result = solve(model, lb // unit, time_limit, workers)
    if not result.has_solution:
        return _done(hint, FEASIBLE, lb, result.failure(time_limit))
    solver = result.solver
    offsets = {r.id: solver.value(offset[i]) * unit for i, r in enumerate(records)}
    total = max((offsets[r.id] + r.size for r in records), default=0)
    plan = OffsetsPlan(total, offsets)
    bound = max(lb, result.bound_units() * unit)
    if plan.total <= bound or result.optimal:
        return _done(plan, OPTIMAL, plan.total, "proven optimal")
    return _done(plan, FEASIBLE, bound, "")


def _done(plan: OffsetsPlan, status: str, bound: int, note: str) -> OffsetsPlan:
    return OffsetsPlan(plan.arena_size, dict(plan.offsets), "cpsat", status, bound, note=note)
