"""Activation memory planning (Pisarchyk & Lee): where each intermediate tensor lives.

Two approaches, each with strategies registered by name in :data:`STRATEGIES`:

* **shared objects** — :func:`plan_objects` → :class:`SharedObjectsPlan`
  (``naive``, ``greedy_in_order``, ``greedy_by_breadth``, ``greedy_by_size``,
  ``greedy_by_size_improved``, ``min_cost_flow``, ``cpsat``, ``best``);
* **offsets** in one arena — :func:`plan_offsets` → :class:`OffsetsPlan`
  (``naive``, ``greedy_in_order``, ``greedy_by_size``, ``greedy_by_breadth``,
  ``strip_packing``, ``objects:<objects heuristic>``, ``cpsat``, ``best``).

Inputs are :class:`TensorUsageRecord` lists (:func:`make_records`, :func:`load_records`);
:func:`validate_plan` proves a plan legal; :func:`objects_lower_bound` and
:func:`offsets_lower_bound` are the paper's theoretical bounds. Captured graphs become
records with :func:`records_from_graph` (views and in-place reuse folded in), zoo models
with :func:`zoo_records`; :func:`activation_bytes` is what a graph's activations occupy
(every estimate of a network's activation memory uses it); :func:`search_operator_order`
finds the execution order with the smallest offsets bound; :func:`plan_report` runs
strategies side by side.
"""

from __future__ import annotations

# strategy modules register themselves on import; the order is the registry order
# isort: off
from layerfit.memory import (  # noqa: F401
    objects_naive,
    objects_greedy_in_order,
    objects_greedy_by_breadth,
    objects_greedy_by_size,
    objects_greedy_by_size_improved,
    objects_min_cost_flow,
    offsets_naive,
    offsets_greedy_in_order,
    offsets_greedy_by_size,
    offsets_greedy_by_breadth,
    offsets_strip_packing,
    offsets_from_objects,
    cpsat_objects,
    cpsat_offsets,
    best,
)

# isort: on
from layerfit.memory.activations import activation_bytes, activation_records
from layerfit.memory.bounds import (
    lower_bound,
    naive_total,
    objects_lower_bound,
    offsets_lower_bound,
)
from layerfit.memory.from_graph import GraphRecords, check_order, records_from_graph
from layerfit.memory.operator_order import (
    OrderSearchResult,
    breadth_first_order,
    search_operator_order,
)
from layerfit.memory.plans import FEASIBLE, HEURISTIC, OPTIMAL, OffsetsPlan, Plan, SharedObjectsPlan
from layerfit.memory.profiles import (
    max_breadth,
    maximal_cliques,
    operator_profiles,
    positional_maximums,
)
from layerfit.memory.records import (
    DEFAULT_ALIGNMENT,
    TensorUsageRecord,
    align_up,
    check_alignment,
    check_records,
    check_time_limit,
    load_records,
    make_records,
    mirror,
)
from layerfit.memory.registry import (
    APPROACHES,
    STRATEGIES,
    Strategy,
    get_strategy,
    plan,
    plan_objects,
    plan_offsets,
    strategy_names,
)
from layerfit.memory.report import plan_report
from layerfit.memory.validate import IllegalPlanError, plan_violations, validate_plan
from layerfit.memory.zoo_records import capture_zoo_model, zoo_records

__all__ = [
    "APPROACHES",
    "DEFAULT_ALIGNMENT",
    "FEASIBLE",
    "GraphRecords",
    "HEURISTIC",
    "OPTIMAL",
    "STRATEGIES",
    "IllegalPlanError",
    "OffsetsPlan",
    "OrderSearchResult",
    "Plan",
    "SharedObjectsPlan",
    "Strategy",
    "TensorUsageRecord",
    "activation_bytes",
    "activation_records",
    "align_up",
    "breadth_first_order",
    "capture_zoo_model",
    "check_alignment",
    "check_time_limit",
    "check_order",
    "check_records",
    "get_strategy",
    "load_records",
    "lower_bound",
    "make_records",
    "max_breadth",
    "maximal_cliques",
    "mirror",
    "naive_total",
    "objects_lower_bound",
    "offsets_lower_bound",
    "operator_profiles",
    "plan",
    "plan_objects",
    "plan_offsets",
    "plan_report",
    "plan_violations",
    "positional_maximums",
    "records_from_graph",
    "search_operator_order",
    "strategy_names",
    "validate_plan",
    "zoo_records",
]
