"""Split one memory budget between several DNNs: SwapNet's Eq. 1 (Section 6.2.2).

If every model's demand fits in the total ``M``, each gets its demand. Otherwise

    A_i = M_i / sum(M) * (1 - 1/n) * M  +  PS_i / sum(PS) * (1/n) * M,

proportional to demand on ``(1 - 1/n)`` of the budget and to the performance score
``PS_i = u_i * latency_i / memory_i`` (urgency times predicted latency per byte) on the
reserved ``1/n``. Eq. 1 is linear in ``M``: ``A_i = c_i * M``. Two clamps make the
result usable - a model is never given more than its demand (models whose demand fits
get all they need, and no more) nor less than its minimum budget (below which no
partition runs). The split is therefore ``A_i = clip(c_i * t, minimum_i, demand_i)``
with the one ``t`` (found by bisection) for which the ``A_i`` sum to ``M``: when no clamp
applies ``t = M`` and this is Eq. 1 exactly; otherwise what a clamped model does not
take, or must be given, is shared by the others in Eq. 1's proportions.

Allocations are whole bytes and sum to exactly ``M`` whenever demand exceeds it.

:func:`split_between_models` applies this to prepared models' SwapNet plans (demand,
minimum budget, predicted direct latency, an urgency each); each model then runs as a
:class:`~layerfit.tradeoff.swapnet.model.SwapNet` within its share, and
:func:`~layerfit.tradeoff.swapnet.model.set_budgets` re-partitions them all when the
total changes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from layerfit.errors import BudgetError, LayerfitError
from layerfit.sizes import format_bytes

if TYPE_CHECKING:
    from layerfit.tradeoff.swapnet.partition import SwapNetPlan


def performance_score(latency_s: float, memory_bytes: int, urgency: float = 1.0) -> float:
    """``PS = u * latency / memory``: high for slow, memory-lean (hard to partition) models."""
    return urgency * latency_s / max(memory_bytes, 1)


def equation_1(total: float, demands: Sequence[float], scores: Sequence[float]) -> list[float]:
    """Eq. 1 exactly as printed (real numbers, no clamps)."""
    n = len(demands)
    if n == 0:
        return []
    sum_m, sum_ps = float(sum(demands)), float(sum(scores))
    out = []
    for m, ps in zip(demands, scores, strict=True):
        by_demand = m / sum_m if sum_m > 0 else 1.0 / n
        by_score = ps / sum_ps if sum_ps > 0 else 1.0 / n
        out.append(by_demand * (1 - 1 / n) * total + by_score * (1 / n) * total)
    return out


def split_budget(
    total: int,
    demands: Sequence[int],
    scores: Sequence[float],
    minimums: Sequence[int] | None = None,
    names: Sequence[str] | None = None,
) -> list[int]:
    """Bytes for each model: demands if they fit, else Eq. 1 with the clamps above."""
    n = len(demands)
    if len(scores) != n or (minimums is not None and len(minimums) != n):
        raise BudgetError("demands, scores and minimums must have one entry per model")
    names = list(names) if names is not None else [f"model {i}" for i in range(n)]
    mins = list(minimums) if minimums is not None else [0] * n
    if any(d < 0 for d in demands) or any(s < 0 for s in scores):
        raise BudgetError("demands and performance scores cannot be negative")
    if sum(demands) <= total:
        return list(demands)
    if sum(mins) > total:
        listing = ", ".join(f"{nm} {format_bytes(m)}" for nm, m in zip(names, mins, strict=True))
        raise BudgetError(
            f"total budget {format_bytes(total)} is below the sum of the models' minimum budgets "
            f"{format_bytes(sum(mins))} ({listing}): raise it or run fewer models"
        )
    weights = equation_1(1.0, demands, scores)

    def allocation(t: float) -> list[float]:
        return [min(max(c * t, lo), hi) for c, lo, hi in zip(weights, mins, demands, strict=True)]

    lo_t, hi_t = 0.0, float(total)
    while sum(allocation(hi_t)) < total:
        hi_t *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo_t + hi_t)
        if sum(allocation(mid)) < total:
            lo_t = mid
        else:
            hi_t = mid
    shares = allocation(hi_t)
    alloc = [int(a) for a in shares]
    # whole bytes that sum to the total: hand the rounding remainder out (or take it
    # back) where the clamps leave room, unclamped models and larger shares first
    clamped = [not (lo < a < hi) for a, lo, hi in zip(shares, mins, demands, strict=True)]
    order = sorted(range(n), key=lambda i: (clamped[i], -alloc[i]))
    rest = total - sum(alloc)
    for i in order:
        if rest == 0:
            break
        step = min(rest, demands[i] - alloc[i]) if rest > 0 else max(rest, mins[i] - alloc[i])
        alloc[i] += step
        rest -= step
    return alloc


def model_names(plans: Sequence[SwapNetPlan]) -> list[str]:
    """Each plan's model name; replicas of one model are told apart as ``name#1``, ``name#2``."""
    names = [p.name for p in plans]
    seen: dict[str, int] = {}
    out = []
    for nm in names:
        seen[nm] = seen.get(nm, 0) + 1
        out.append(nm if names.count(nm) == 1 else f"{nm}#{seen[nm]}")
    return out


def check_urgency(urgency: Any, model: object) -> float:
    """``urgency`` as a float, if it is a finite number above zero; else LayerfitError
    naming ``model``."""
    try:
        value = float(urgency)
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise LayerfitError(f"urgency of {model} must be a finite number above 0, got {urgency!r}")
    return value


def split_between_models(
    total: int | None, plans: Sequence[SwapNetPlan], urgencies: Sequence[float] | None = None
) -> list[int]:
    """Each model's budget out of ``total`` bytes by Eq. 1 (its demand when ``total`` is None).

    ``urgencies`` (default 1 each) scale each model's performance score
    ``u * predicted direct latency / demand``; a total below the sum of the models'
    minimum budgets raises :class:`~layerfit.errors.BudgetError` naming each.
    """
    urgencies = [1.0] * len(plans) if urgencies is None else list(urgencies)
    if len(urgencies) != len(plans):
        raise LayerfitError(f"{len(urgencies)} urgencies for {len(plans)} models")
    urgencies = [check_urgency(u, p.directory) for u, p in zip(urgencies, plans, strict=True)]
    demands = [p.demand for p in plans]
    if total is None:
        return demands
    scores = [performance_score(p.costs.direct_s, p.demand, u) for p, u in zip(plans, urgencies, strict=True)]
    return split_budget(total, demands, scores, [p.minimum_budget for p in plans], model_names(plans))
