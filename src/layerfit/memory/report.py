"""Run strategies side by side and collect what the paper's tables report.

:func:`plan_report` is what ``layerfit plan`` prints and what the benchmark stores: per
approach the lower bound, the naive total, and per strategy its total, status, planning
time and (optionally) the full assignment per tensor id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from layerfit.memory.bounds import naive_total, objects_lower_bound, offsets_lower_bound
from layerfit.memory.plans import Plan
from layerfit.memory.records import TensorUsageRecord
from layerfit.memory.registry import APPROACHES, check_approach, get_strategy, plan, strategy_names
from layerfit.memory.validate import validate_plan

MIB = 2**20  # the paper's "MB" are mebibytes (MobileNet v1: 112·112·96·4 B = 4.594)


def plan_report(
    records: Sequence[TensorUsageRecord],
    approaches: Sequence[str] = APPROACHES,
    strategies: Sequence[str] | str = "all",
    *,
    time_limit: float = 10.0,
    workers: int = 2,
    assignments: bool = False,
) -> dict[str, Any]:
    """Plans of ``strategies`` (names, or ``"all"``) for each approach, checked legal."""
    records = list(records)
    out: dict[str, Any] = {"tensors": len(records), "approaches": {}}
    for approach in approaches:
        check_approach(approach)
        names = strategy_names(approach) if strategies == "all" else list(strategies)
        if "cpsat" in names:  # solve last, seeded with the portfolio's plan when there is one
            names = [n for n in names if n != "cpsat"] + ["cpsat"]
        for name in names:
            get_strategy(approach, name)  # unknown names fail before any work
        bound = (
            objects_lower_bound(records) if approach == "objects" else offsets_lower_bound(records)
        )
        rows = []
        done: dict[str, Plan] = {}
        for name in names:
            options: dict[str, Any] = {}
            if name == "cpsat":
                options = {"time_limit": time_limit, "workers": workers}
                if "best" in done:
                    options["hint"] = done["best"]
            result = plan(records, approach, name, **options)
            validate_plan(records, result)
            done[name] = result
            row = result.to_dict()
            if not assignments:
                row.pop("assignment", None)
                row.pop("object_sizes", None)
            row["vs_lower_bound"] = 0.0 if bound == 0 else result.total / bound - 1
            rows.append(row)
        out["approaches"][approach] = {
            "lower_bound": bound,
            "naive": naive_total(records),
            "strategies": rows,
        }
    return out
