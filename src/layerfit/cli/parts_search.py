"""``layerfit tradeoff parts`` past its options: the constraints the command line adds to the
application file's, then Algorithm 2. Imported when the command runs (it needs the
``tradeoff`` extra), not with the command line."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from layerfit.errors import BudgetError, TradeoffError
from layerfit.sizes import parse_bytes
from layerfit.tradeoff.parts.appfile import load_application, parse_throughput
from layerfit.tradeoff.parts.report import describe, summary_rows
from layerfit.tradeoff.parts.search import GAParams, TradeoffResult, reduce_buffers
from layerfit.tradeoff.parts.throughput import estimator_for


def parse_throughput_options(values: Sequence[str], cnn_names: set[str]) -> dict[str, float]:
    """``--throughput 40`` (every CNN) or ``--throughput name=40`` (repeatable)."""
    result: dict[str, float] = {}
    for value in values:
        name, sep, fps = value.partition("=")
        try:
            number = float(fps if sep else name)
        except ValueError:
            raise TradeoffError(f"--throughput {value!r}: expected a number of fps or CNN=fps") from None
        if sep:
            result.update(parse_throughput({name: number}, cnn_names, "--throughput"))
        else:
            result.update(parse_throughput(number, cnn_names, "--throughput"))
    return result


def run_parts_command(
    app_file: str,
    memory: str | None,
    throughput: Sequence[str],
    model_throughput: bool,
    generations: int,
    population: int,
    seed: int,
    select: str,
    phase_rows: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[TradeoffResult, list[str], list[dict[str, Any]]]:
    """Load the application, apply command-line constraints over the file's, search
    (``progress(done, total)`` after each GA generation)."""
    app, constraints = load_application(app_file)
    if memory is not None:
        try:
            constraints = replace(constraints, memory=parse_bytes(memory))
        except BudgetError as exc:
            raise TradeoffError(f"--budget: {exc}") from exc
    if throughput:
        merged = dict(constraints.throughput)
        merged.update(parse_throughput_options(throughput, {c.name for c in app.cnns}))
        constraints = replace(constraints, throughput=merged)
    if constraints.memory is None:
        raise TradeoffError("no memory constraint: pass --budget (e.g. 15MB) or set constraints.memory in the file")
    if select not in ("throughput", "memory"):
        raise TradeoffError(f"--select: expected 'throughput' or 'memory', got {select!r}")
    result = reduce_buffers(
        app,
        constraints,
        estimator_for(app, model_throughput, phase_rows),
        GAParams(population=population, generations=generations, seed=seed),
        select=select,  # type: ignore[arg-type]
        phase_rows=phase_rows,
        progress=progress,
    )
    return result, describe(result), summary_rows(result)
