"""SwapNet (Wang et al.): block swapping under a memory budget, for one model or several.

* :mod:`.profile` - the delay model (Section 6.1): per-layer read, bind, kernel and
  unbind times of a prepared model and the device coefficients fitted to them
  (:class:`DeviceProfile`, :func:`profile_for`).
* :mod:`.partition` - the block partition under a budget (Section 6.2.2, Eq. 2-4): the
  reserve, the exact dynamic program and the lookup tables (:class:`SwapNetPlan`).
* :mod:`.model` - a prepared model run by block swapping, re-partitioned without
  reloading when its budget changes (:class:`SwapNet`).
* :mod:`.budget_split` - one memory budget split between several models (Eq. 1,
  :func:`split_between_models`); each runs as a :class:`SwapNet` within its share and
  :func:`set_budgets` re-partitions them together when the total changes. Running them
  concurrently and timing them is the paper's evaluation (``bench/swapnet.py``), not a
  second runtime: :class:`layerfit.Runtime` is the one that serves several models
  within one budget (its scheduler shares the budget task by task, not by a fixed split).
"""

from layerfit.tradeoff.swapnet.budget_split import (
    equation_1,
    performance_score,
    split_between_models,
    split_budget,
)
from layerfit.tradeoff.swapnet.model import (
    Adaptation,
    SwapNet,
    partition_report,
    set_budgets,
    swapnet_engine_config,
)
from layerfit.tradeoff.swapnet.partition import Decision, SwapNetPlan, optimal_partition
from layerfit.tradeoff.swapnet.profile import (
    DeviceProfile,
    fit_profile,
    load_profile,
    measure_model,
    profile_for,
    profile_models,
)

__all__ = [
    "Adaptation",
    "Decision",
    "DeviceProfile",
    "SwapNet",
    "SwapNetPlan",
    "equation_1",
    "fit_profile",
    "load_profile",
    "measure_model",
    "optimal_partition",
    "partition_report",
    "performance_score",
    "profile_for",
    "profile_models",
    "set_budgets",
    "split_between_models",
    "split_budget",
    "swapnet_engine_config",
]
