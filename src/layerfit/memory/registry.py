"""Strategies registered by name behind one signature.

Every strategy is a function ``(records, **options) -> plan`` registered under an
approach (``objects`` or ``offsets``) and a name; :data:`STRATEGIES` maps approach →
name → :class:`Strategy`. :func:`plan_objects` and :func:`plan_offsets` check the
records, look the strategy up, time it, and return its plan. Unknown names and options
raise :class:`~layerfit.errors.PlanError` listing what is valid.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from layerfit.errors import PlanError
from layerfit.memory.plans import OffsetsPlan, Plan, SharedObjectsPlan
from layerfit.memory.records import TensorUsageRecord, check_records

APPROACHES = ("objects", "offsets")


@dataclass(frozen=True)
class Strategy:
    """A planning algorithm: its approach, name, function and accepted options."""

    approach: str
    name: str
    function: Callable[..., Plan]
    description: str
    options: tuple[str, ...] = ()
    heuristic: bool = True  # False for the exact solver and the portfolio


STRATEGIES: dict[str, dict[str, Strategy]] = {a: {} for a in APPROACHES}


def check_approach(approach: str) -> None:
    if approach not in APPROACHES:
        raise PlanError(f"unknown approach {approach!r}; choose one of: {', '.join(APPROACHES)}")


def register(
    approach: str,
    name: str,
    description: str,
    options: tuple[str, ...] = (),
    heuristic: bool = True,
) -> Callable[[Callable[..., Plan]], Callable[..., Plan]]:
    """Decorator adding a strategy function to :data:`STRATEGIES`."""
    check_approach(approach)

    def decorate(function: Callable[..., Plan]) -> Callable[..., Plan]:
        if name in STRATEGIES[approach]:
            raise ValueError(f"strategy {approach}/{name} registered twice")
        STRATEGIES[approach][name] = Strategy(
            approach, name, function, description, options, heuristic
        )
        return function

    return decorate


def get_strategy(approach: str, name: str) -> Strategy:
    """The registered strategy, or PlanError listing the valid names."""
    check_approach(approach)
    try:
        return STRATEGIES[approach][name]
    except KeyError:
        raise PlanError(
            f"unknown {approach} strategy {name!r}; valid names: {', '.join(STRATEGIES[approach])}"
        ) from None


def strategy_names(approach: str, heuristic_only: bool = False) -> list[str]:
    """Names registered for ``approach`` in registration order."""
    check_approach(approach)
    return [n for n, s in STRATEGIES[approach].items() if s.heuristic or not heuristic_only]


def plan(
    records: Sequence[TensorUsageRecord], approach: str, strategy: str, **options: Any
) -> Plan:
    """Run one strategy on ``records`` and return its plan, timed."""
    entry = get_strategy(approach, strategy)
    unknown = sorted(set(options) - set(entry.options))
    if unknown:
        accepted = ", ".join(entry.options) or "none"
        raise PlanError(
            f"{approach} strategy {strategy!r} does not take option(s) {', '.join(unknown)}; "
            f"it accepts: {accepted}"
        )
    records = list(records)
    check_records(records)
    start = time.perf_counter()
    result = entry.function(records, **options)
    elapsed = time.perf_counter() - start
    return replace(result, strategy=result.strategy or strategy, seconds=elapsed)


def plan_objects(
    records: Sequence[TensorUsageRecord], strategy: str = "greedy_by_size_improved", **options: Any
) -> SharedObjectsPlan:
    """Assign every tensor to a shared object with ``strategy``."""
    result = plan(records, "objects", strategy, **options)
    assert isinstance(result, SharedObjectsPlan)
    return result


def plan_offsets(
    records: Sequence[TensorUsageRecord], strategy: str = "greedy_by_size", **options: Any
) -> OffsetsPlan:
    """Give every tensor an offset in one arena with ``strategy``."""
    result = plan(records, "offsets", strategy, **options)
    assert isinstance(result, OffsetsPlan)
    return result
