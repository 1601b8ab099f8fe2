"""A prepared model run by SwapNet block swapping, with run-time budget adaptation.

:class:`SwapNet` builds the model's :class:`~layerfit.tradeoff.swapnet.partition.SwapNetPlan`
(costs from the device profile, reserve, lookup tables), picks the partition for the
budget from the tables and runs it on the streaming engine: blocks as units, the
``async`` pipeline, a buffer of ``W = B - reserve`` that by construction holds any two
adjacent blocks (a model that fits entirely runs with every weight resident instead).

:meth:`SwapNet.set_budget` is the paper's adaptive re-partitioning (Section 6.2.2,
Fig. 18): a table lookup and :meth:`~layerfit.engine.Engine.reconfigure`, which swaps the
buffer and the grouping of layers into blocks without reloading the model; it waits for
a running inference to finish, so the new partition is in effect from the next one. A
budget below the minimum raises :class:`~layerfit.errors.PartitionError` and the old
partition keeps running.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerfit.engine import Engine, load
from layerfit.engine.config import EngineConfig
from layerfit.errors import LayerfitError
from layerfit.tradeoff.swapnet.partition import Decision, SwapNetPlan
from layerfit.tradeoff.swapnet.profile import DeviceProfile, profile_for


@dataclass(frozen=True)
class Adaptation:
    """One budget change: the old and new decisions and how long the switch took."""

    previous: Decision
    current: Decision
    lookup_s: float
    reconfigure_s: float

    @property
    def seconds(self) -> float:
        return self.lookup_s + self.reconfigure_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "lookup_s": self.lookup_s,
            "reconfigure_s": self.reconfigure_s,
            "from": {"budget_bytes": self.previous.budget, "blocks": self.previous.choice.blocks,
                     "points": list(self.previous.points)},
            "to": {"budget_bytes": self.current.budget, "blocks": self.current.choice.blocks,
                   "points": list(self.current.points)},
        }


class SwapNet:
    """A prepared model you call like the model, within ``budget`` bytes in all.

    ``profile`` is a :class:`DeviceProfile`; without one the profile at
    ``profile_path`` (default path if None) is used, or the model is measured when that
    profile is missing or from another device (with a warning). ``binding`` selects the
    engine's binding mode (the ablation's ``copy`` / ``instantiate``).
    """

    def __init__(
        self,
        directory: str | Path,
        budget: int | str,
        *,
        profile: DeviceProfile | None = None,
        profile_path: str | Path | None = None,
        plan: SwapNetPlan | None = None,
        binding: str = "reference",
        trace: bool = False,
        direct_io: bool = True,
    ) -> None:
        self.directory = Path(directory)
        if plan is None:
            plan = SwapNetPlan.build(self.directory, profile or profile_for(self.directory, profile_path))
        self.plan = plan
        self.decision: Decision = plan.choose(budget)
        settings = EngineConfig(binding=binding, trace=trace, direct_io=direct_io)
        self.engine: Engine = load(self.directory, self.decision.engine_config(settings))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.engine(*args, **kwargs)

    @property
    def budget(self) -> int:
        return self.decision.budget

    @property
    def accounted_peak_bytes(self) -> int:
        """Peak of the last inference as the budget counts it: weights ledger + reserve."""
        r = self.plan.reserve
        return self.engine.last_weights_peak + r.total - r.resident

    def set_budget(self, budget: int | str) -> Adaptation:
        """Re-partition for a new budget from the tables; in effect for the next inference."""
        t0 = time.perf_counter()
        decision = self.plan.choose(budget)  # refuses (PartitionError) before touching the engine
        t1 = time.perf_counter()
        self.engine.reconfigure(decision.engine_config(self.engine.config))
        t2 = time.perf_counter()
        previous, self.decision = self.decision, decision
        return Adaptation(previous, decision, t1 - t0, t2 - t1)

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> SwapNet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def set_budgets(models: Sequence[SwapNet], budgets: Sequence[int | str]) -> list[Adaptation]:
    """Re-partition several models for new budgets (between inferences), all or none.

    Every model's new decision is checked before any engine changes, so budgets that
    one model cannot run within leave every model as it was (PartitionError).
    """
    if len(budgets) != len(models):
        raise LayerfitError(f"{len(budgets)} budgets for {len(models)} models")
    for model, budget in zip(models, budgets, strict=True):
        model.plan.choose(budget)  # raises before any model is touched
    return [model.set_budget(budget) for model, budget in zip(models, budgets, strict=True)]


def swapnet_engine_config(
    directory: str | Path,
    budget: int | str | None,
    base: EngineConfig | None = None,
    *,
    profile_path: str | Path | None = None,
) -> EngineConfig:
    """``base`` with the weight budget, pipeline and block points SwapNet chooses for
    ``budget`` (the model's memory in all)."""
    from layerfit.errors import BudgetError
    from layerfit.sizes import is_share

    if budget is None:
        raise BudgetError("--units swapnet partitions the model for a budget: give one with --budget, e.g. 100MB")
    if is_share(budget):
        raise BudgetError(
            f"--units swapnet's budget is the model's memory in all (weights, activations and a reserve), "
            f"not a share of its weights: give a size, e.g. 100MB, instead of {budget}"
        )
    plan = SwapNetPlan.build(directory, profile_for(directory, profile_path))
    return plan.choose(budget).engine_config(base)


def _measure_points(
    plan: SwapNetPlan, decision: Decision, call: tuple[tuple, dict], repeats: int, warmup: int
) -> dict[str, Any]:
    from layerfit.engine import measure

    with load(plan.directory, decision.engine_config()) as engine:
        _, report = measure(engine, call[0], repeats=repeats, warmup=warmup, keywords=call[1])
    r = plan.reserve
    return {
        "latency_s": report["latency_s"],
        "weights_peak_bytes": report["weights_peak_bytes"],
        "accounted_peak_bytes": report["weights_peak_bytes"] + r.total - r.resident,
        "output_sha256": report["output_sha256"],
    }


def partition_report(
    directory: str | Path,
    budget: int | str,
    *,
    profile: DeviceProfile | None = None,
    profile_path: str | Path | None = None,
    measure_latency: bool = True,
    repeats: int = 3,
    warmup: int = 1,
) -> dict[str, Any]:
    """Table choice and exact optimum for ``budget``, predicted and (optionally) measured."""
    from dataclasses import replace

    from layerfit.store import example_call

    plan = SwapNetPlan.build(directory, profile or profile_for(directory, profile_path))
    decision = plan.choose(budget)
    t0 = time.perf_counter()
    exact = plan.optimal(budget)
    dp_s = time.perf_counter() - t0
    out: dict[str, Any] = {**plan.summary(), "decision": decision.to_dict()}
    out["dp"] = None if exact is None else {**exact.to_dict(), "seconds": dp_s}
    out["predicted_s"] = decision.choice.predicted_s
    if measure_latency:
        x = example_call(plan.manifest)
        measured = {"chosen": _measure_points(plan, decision, x, repeats, warmup)}
        if exact is not None and exact.points != decision.points:
            measured["dp"] = _measure_points(plan, replace(decision, choice=exact), x, repeats, warmup)
        if decision.pipeline != "preload":
            direct = plan.choose(plan.demand)
            measured["direct"] = _measure_points(plan, direct, x, repeats, warmup)
            measured["direct"]["predicted_s"] = plan.costs.direct_s
        out["measured"] = measured
    return out
