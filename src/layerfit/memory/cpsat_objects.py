"""Shared objects, exact: an OR-Tools CP-SAT model with a time limit.

Model (sizes in units of their gcd; tensors sorted by non-increasing size):
  1. ``x[i, k]`` — tensor ``i`` lives in object ``k``; only ``k ≤ i`` (symmetry breaking:
     objects are numbered by their first, hence largest, tensor, so object ``k``'s size
     is that of its first tensor and sizes are non-increasing in ``k``).
  2. Every tensor has exactly one object.
  3. For every maximal set of tensors live at one operator (a maximal clique of the
     interval graph) and every object: at most one of them in the object. These clique
     constraints are exactly the "no intersecting intervals share an object" rule.
  4. ``size[k] ≥ size(i)`` when ``x[i, k]``; ``size[k] ≥ size[k + 1]``; and
     ``size[k] ≥`` the ``k``-th positional maximum (valid because sizes are sorted).
  5. Minimise ``Σ size[k]`` with the objective bounded below by the sum of positional
     maxima and above by the best heuristic, which also seeds the search as a hint.
  6. Stop at the time limit, at proven optimality, or as soon as a solution meets the
     lower bound.

With ``n`` tensors the full model has up to ``n(n+1)/2`` booleans, so past
``full_model_limit`` tensors the number of objects is capped (``max_objects``,
default ``2 × hint objects + 8``). A capped model can still *reach* the lower bound
(then the plan is optimal); otherwise it reports ``feasible`` with the gap to the
positional-maxima bound, never a solver bound it could not prove for all plans.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from layerfit.memory.bounds import objects_lower_bound
from layerfit.memory.cpsat_common import (
    DEFAULT_TIME_LIMIT,
    DEFAULT_WORKERS,
    check_solver_options,
    cp_model,
    legal_hint,
    size_unit,
    solve,
)
from layerfit.memory.plans import FEASIBLE, OPTIMAL, SharedObjectsPlan
from layerfit.memory.profiles import maximal_cliques, positional_maximums
from layerfit.memory.records import TensorUsageRecord
from layerfit.memory.registry import register

FULL_MODEL_LIMIT = 150


@register(
    "objects",
    "cpsat",
    "exact CP-SAT model (optimal, or feasible with gap at the time limit)",
    options=("time_limit", "workers", "hint", "max_objects"),
    heuristic=False,
)
def cpsat_objects(
    records: Sequence[TensorUsageRecord],
    time_limit: float = DEFAULT_TIME_LIMIT,
    workers: int = DEFAULT_WORKERS,
    hint: SharedObjectsPlan | None = None,
    max_objects: int | None = None,
) -> SharedObjectsPlan:
    """The shared-objects plan CP-SAT finds for ``records`` within ``time_limit``,
    started from ``hint`` (the best heuristic's plan by default) and with at most
    ``max_objects`` objects. One model stated in one place (about 90 lines): its
    variables, constraints, symmetry breaking and hint read best beside each other, and
    pieces would pass a dozen parallel arrays between them."""
    check_solver_options(time_limit, workers)
    n = len(records)
    lb = objects_lower_bound(records)
    from layerfit.memory.best import best_objects  # on use: it runs every strategy

    hint = legal_hint(records, hint, SharedObjectsPlan, best_objects)
    if hint.total <= lb:
        return _done(hint, OPTIMAL, lb, "heuristic hint meets the lower bound")

    unit = size_unit(records)
    order = sorted(range(n), key=lambda i: (-records[i].size, i))
    pos = {i: p for p, i in enumerate(order)}
    size = [records[i].size // unit for i in order]

    # relabel the hint's objects by their first tensor in size order
    first: dict[int, int] = {}
    for p, i in enumerate(order):
        first.setdefault(hint.object_ids[records[i].id], p)
    relabel = {obj: k for k, obj in enumerate(sorted(first, key=first.__getitem__))}
    pmax = [v // unit for v in positional_maximums(records)]
    if max_objects is None:
        max_objects = n if n <= FULL_MODEL_LIMIT else 2 * len(relabel) + 8
    k_max = min(n, max(max_objects, len(relabel), len(pmax)))
    complete = k_max >= n

    model = cp_model().CpModel()
    x: dict[tuple[int, int], Any] = {}
    for p in range(n):
        for k in range(min(p, k_max - 1) + 1):
            x[p, k] = model.new_bool_var(f"x{p}_{k}")
    obj_size = [model.new_int_var(0, size[k], f"s{k}") for k in range(k_max)]  # k-th largest tensor
    for p in range(n):
        model.add_exactly_one(x[p, k] for k in range(min(p, k_max - 1) + 1))
        for k in range(min(p, k_max - 1) + 1):
            model.add(obj_size[k] >= size[p]).only_enforce_if(x[p, k])
    for clique in maximal_cliques(records):
        members = [pos[i] for i in clique.members]
        for k in range(k_max):
            lits = [x[p, k] for p in members if (p, k) in x]
            if len(lits) > 1:
                model.add_at_most_one(lits)
    for k in range(k_max - 1):
        model.add(obj_size[k] >= obj_size[k + 1])
    for k, v in enumerate(pmax[:k_max]):
        model.add(obj_size[k] >= v)
    total = sum(obj_size)
    model.add(total >= lb // unit)
    model.add(total <= hint.total // unit)
    model.minimize(total)

    hint_size = [0] * k_max
    for p, i in enumerate(order):
        k = relabel[hint.object_ids[records[i].id]]
        hint_size[k] = max(hint_size[k], size[p])
        for kk in range(min(p, k_max - 1) + 1):
            model.add_hint(x[p, kk], kk == k)
    for k in range(k_max):
        model.add_hint(obj_size[k], hint_size[k])

    result = solve(model, lb // unit, time_limit, workers)
    if not result.has_solution:
        return _done(hint, FEASIBLE, lb, result.failure(time_limit))
    solver = result.solver
    object_ids: dict[int, int] = {}
    sizes = [0] * k_max
    for p, i in enumerate(order):
        for k in range(min(p, k_max - 1) + 1):
            if solver.boolean_value(x[p, k]):
                object_ids[records[i].id] = k
                sizes[k] = max(sizes[k], records[i].size)
                break
    used = sorted({k for k in object_ids.values()})
    renum = {k: j for j, k in enumerate(used)}
    plan = SharedObjectsPlan(
        tuple(sizes[k] for k in used), {t: renum[k] for t, k in object_ids.items()}
    )
    bound = lb
    if complete:
        bound = max(lb, result.bound_units() * unit)
    if plan.total <= bound or (complete and result.optimal):
        return _done(plan, OPTIMAL, plan.total, "proven optimal")
    note = "" if complete else f"objects capped at {k_max}; gap is to the positional-maxima bound"
    return _done(plan, FEASIBLE, bound, note)


def _done(plan: SharedObjectsPlan, status: str, bound: int, note: str) -> SharedObjectsPlan:
    return SharedObjectsPlan(
        plan.object_sizes, dict(plan.object_ids), "cpsat", status, bound, note=note
    )
