"""Several prepared models running concurrently within one total memory budget.

SwapNet's multi-DNN scheme (Section 6.2): the total budget is split between the models
by Eq. 1 (:func:`layerfit.tradeoff.swapnet.budget_split.split_budget`: proportional to demand on
``1 - 1/n`` of it, to performance score x urgency on ``1/n``; models whose demand fits get
all they need), each model gets its own partition for its share
(:class:`~layerfit.tradeoff.swapnet.model.SwapNet`) and runs on its own thread, optionally
pinned to CPUs (``os.sched_setaffinity`` on the thread's native id, which Linux applies
to that thread alone). Threads start together at a barrier and report their latencies.

    runner = MultiRunner([ModelTask("yolo"), ModelTask("resnet", urgency=2)], "300MB")
    report = runner.run(iterations=3)
    runner.set_total_budget("250MB")   # re-split and re-partition, no reload
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from layerfit.errors import BudgetError, LayerfitError
from layerfit.sizes import parse_bytes
from layerfit.store import example_call
from layerfit.tradeoff.swapnet.budget_split import performance_score, split_budget
from layerfit.tradeoff.swapnet.model import Adaptation, SwapNet
from layerfit.tradeoff.swapnet.partition import SwapNetPlan
from layerfit.tradeoff.swapnet.profile import DeviceProfile, profile_for


@dataclass(frozen=True)
class ModelTask:
    """One model to run: its prepared directory, urgency ``u`` and optional CPU set.

    ``urgency`` scales the model's share of the budget (Eq. 1): finite and above zero.
    ``cpus`` must be CPUs this process may run on (``os.sched_getaffinity(0)``).
    """

    directory: str | Path
    urgency: float = 1.0
    name: str | None = None
    cpus: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        try:
            urgency = float(self.urgency)
        except (TypeError, ValueError):
            urgency = math.nan
        if not (math.isfinite(urgency) and urgency > 0):
            raise LayerfitError(f"urgency of {self.directory} must be a finite number above 0, got {self.urgency!r}")
        if self.cpus is not None:
            allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
            if not self.cpus or any(
                not isinstance(c, int) or isinstance(c, bool) or (allowed is not None and c not in allowed)
                for c in self.cpus
            ):
                raise LayerfitError(
                    f"cpus of {self.directory} must name CPUs this process may use "
                    f"({', '.join(map(str, allowed)) if allowed is not None else 'any'}), got {self.cpus!r}"
                )


@dataclass
class ModelRun:
    """What one model's thread measured."""

    name: str
    budget: int | None
    blocks: int
    points: tuple[int, ...]
    latencies_s: list[float] = field(default_factory=list)
    weights_peak_bytes: int = 0
    accounted_peak_bytes: int = 0
    output: Any = None

    @property
    def latency_s(self) -> float:
        return statistics.median(self.latencies_s) if self.latencies_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "budget_bytes": self.budget,
            "blocks": self.blocks,
            "points": list(self.points),
            "latency_s": self.latency_s,
            "latencies_s": self.latencies_s,
            "weights_peak_bytes": self.weights_peak_bytes,
            "accounted_peak_bytes": self.accounted_peak_bytes,
        }


def _pin(cpus: Sequence[int] | None) -> None:
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(threading.get_native_id(), set(cpus))


class MultiRunner:
    """Load every task within ``total_budget`` (split by Eq. 1); run them concurrently.

    ``total_budget=None`` runs every model with all its weights resident (direct
    inference, the baseline). The plans (tables) are built once - or given, one per
    task - and reused by :meth:`set_total_budget`.
    """

    def __init__(
        self,
        tasks: Sequence[ModelTask],
        total_budget: int | str | None,
        *,
        profile: DeviceProfile | None = None,
        profile_path: str | Path | None = None,
        binding: str = "reference",
        plans: Sequence[SwapNetPlan] | None = None,
    ) -> None:
        if not tasks:
            raise LayerfitError("give at least one model to run")
        self.tasks = list(tasks)
        if plans is not None:
            if len(plans) != len(self.tasks):
                raise LayerfitError(f"{len(plans)} plans for {len(self.tasks)} models")
            self.plans = list(plans)
        else:
            self.plans = [
                SwapNetPlan.build(t.directory, profile or profile_for(t.directory, profile_path)) for t in self.tasks
            ]
        names = [t.name or p.name for t, p in zip(self.tasks, self.plans, strict=True)]
        seen: dict[str, int] = {}
        self.names = []
        for nm in names:  # two replicas of a model get distinct names
            seen[nm] = seen.get(nm, 0) + 1
            self.names.append(nm if names.count(nm) == 1 else f"{nm}#{seen[nm]}")
        self.total_budget = None if total_budget is None else parse_bytes(total_budget)
        self.budgets = self.split(self.total_budget)
        self.models: list[SwapNet] = []
        try:
            for plan, budget in zip(self.plans, self.budgets, strict=True):
                self.models.append(SwapNet(plan.directory, budget, plan=plan, binding=binding))
        except BaseException:
            self.close()
            raise

    # --- budget -------------------------------------------------------------------------

    def scores(self) -> list[float]:
        """Performance scores ``u * predicted direct latency / demand``."""
        return [
            performance_score(p.costs.direct_s, p.demand, t.urgency)
            for t, p in zip(self.tasks, self.plans, strict=True)
        ]

    def split(self, total: int | None) -> list[int]:
        """Each model's budget for ``total`` (its demand when ``total`` is None)."""
        demands = [p.demand for p in self.plans]
        if total is None:
            return demands
        return split_budget(total, demands, self.scores(), [p.minimum_budget for p in self.plans], self.names)

    def set_total_budget(self, total: int | str) -> list[Adaptation]:
        """Re-split a new total and re-partition every model (between inferences).

        Every model's new decision is checked before any engine changes, so a total
        that cannot be served leaves every model as it was.
        """
        total_bytes = parse_bytes(total)
        budgets = self.split(total_bytes)
        for plan, budget in zip(self.plans, budgets, strict=True):
            plan.choose(budget)  # raises before any model is touched
        out = [m.set_budget(b) for m, b in zip(self.models, budgets, strict=True)]
        self.total_budget, self.budgets = total_bytes, budgets
        return out

    def allocation(self) -> list[dict[str, Any]]:
        """Per model: demand, minimum, score, budget and the chosen partition."""
        return [
            {
                "name": nm,
                "demand_bytes": p.demand,
                "minimum_budget_bytes": p.minimum_budget,
                "performance_score": s,
                "urgency": t.urgency,
                "budget_bytes": b,
                **m.decision.to_dict(),
            }
            for nm, t, p, s, b, m in zip(
                self.names, self.tasks, self.plans, self.scores(), self.budgets, self.models, strict=True
            )
        ]

    # --- running ------------------------------------------------------------------------

    def run(self, iterations: int = 3, warmup: int = 1, inputs: Sequence[Any] | None = None) -> list[ModelRun]:
        """Run every model ``warmup + iterations`` times, all concurrently, one thread each.

        ``inputs``: per model, its input, a tuple of its arguments or a dict of its
        keyword arguments (default: each model's example call — its example input, or
        the keyword arguments it was prepared from).
        """
        if not self.models:
            raise LayerfitError("this MultiRunner is closed: create a new one to run again")
        if iterations < 1 or warmup < 0:
            raise LayerfitError(f"iterations must be at least 1 and warmup at least 0, got {iterations} and {warmup}")
        if inputs is not None and len(inputs) != len(self.models):
            raise LayerfitError(f"{len(inputs)} inputs for {len(self.models)} models: give one tuple per model")
        if inputs is None:
            calls = [example_call(p.manifest) for p in self.plans]
        else:  # a bare tensor is one argument (unpacking it would split its batch dimension)
            calls = [
                ((), dict(inp)) if isinstance(inp, Mapping) else (inp if isinstance(inp, tuple) else (inp,), {})
                for inp in inputs
            ]
        runs = [
            ModelRun(nm, m.decision.budget if self.total_budget is not None else None, m.decision.choice.blocks,
                     m.decision.points)
            for nm, m in zip(self.names, self.models, strict=True)
        ]
        barrier = threading.Barrier(len(self.models))
        errors: list[BaseException] = []

        def work(i: int) -> None:
            model, run, task = self.models[i], runs[i], self.tasks[i]
            try:
                _pin(task.cpus)
                args, kwargs = calls[i]
                for _ in range(warmup):
                    model(*args, **kwargs)
                barrier.wait()
                for _ in range(iterations):
                    t0 = time.perf_counter()
                    run.output = model(*args, **kwargs)
                    run.latencies_s.append(time.perf_counter() - t0)
                    run.weights_peak_bytes = max(run.weights_peak_bytes, model.engine.last_weights_peak)
                    run.accounted_peak_bytes = max(run.accounted_peak_bytes, model.accounted_peak_bytes)
            except BaseException as exc:  # re-raised in the caller's thread
                barrier.abort()
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,), name=f"layerfit-{nm}") for i, nm in enumerate(self.names)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
        if real or errors:
            raise (real or errors)[0]
        return runs

    def close(self) -> None:
        for m in self.models:
            m.close()
        self.models = []

    def __enter__(self) -> MultiRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["BudgetError", "ModelRun", "ModelTask", "MultiRunner"]
