"""What the two exact CP-SAT models share: solver settings, stopping at the lower
bound, and turning a solver status into a plan status.

Sizes are divided by their greatest common divisor (the alignment, usually) before
they reach the solver: smaller domains, same optimum. OR-Tools is imported on first use
only, so importing :mod:`layerfit.memory` stays cheap.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from layerfit.errors import PlanError
from layerfit.memory.records import TensorUsageRecord

DEFAULT_TIME_LIMIT = 10.0
DEFAULT_WORKERS = 2


def size_unit(records: Sequence[TensorUsageRecord]) -> int:
    """Greatest common divisor of the sizes (1 when all are zero)."""
    g = 0
    for r in records:
        g = math.gcd(g, r.size)
    return g or 1


def check_solver_options(time_limit: float, workers: int) -> None:
    if not time_limit > 0:
        raise PlanError(f"time_limit must be a positive number of seconds, got {time_limit!r}")
    if not isinstance(workers, int) or workers < 1:
        raise PlanError(f"workers must be a positive integer, got {workers!r}")


def legal_hint(
    records: Sequence[TensorUsageRecord], hint: Any, kind: type, best: Callable[[Sequence[TensorUsageRecord]], Any]
) -> Any:
    """The plan the search starts from: ``best(records)`` when no hint is given, else the
    hint, which must be a legal plan of ``kind`` for these records."""
    from layerfit.memory.validate import plan_violations

    if hint is None:
        return best(records)
    if not isinstance(hint, kind) or plan_violations(records, hint, limit=1):
        raise PlanError(f"the hint of the {kind.approach} CP-SAT model must be a legal {kind.__name__} of these records")
    return hint


def cp_model() -> Any:
    """The ``ortools.sat.python.cp_model`` module (imported on first use)."""
    from ortools.sat.python import cp_model as module

    return module


def _stop_at_bound(bound: int) -> Any:
    """A solution callback that stops the search once a solution reaches ``bound``."""

    class StopAtBound(cp_model().CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            if self.objective_value <= bound:
                self.stop_search()

    return StopAtBound()


@dataclass(frozen=True)
class SolveResult:
    solver: Any  # cp_model.CpSolver
    optimal: bool
    has_solution: bool
    proven_bound: float  # the solver's best objective bound (in model units)


def solve(model: Any, lower_bound: int, time_limit: float, workers: int) -> SolveResult:
    """Solve the CP-SAT ``model`` within ``time_limit`` seconds on ``workers`` threads."""
    module = cp_model()
    solver = module.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = int(workers)
    solver.parameters.random_seed = 0
    solver.parameters.log_search_progress = False
    status = solver.solve(model, _stop_at_bound(lower_bound))
    has_solution = status in (module.OPTIMAL, module.FEASIBLE)
    bound = solver.best_objective_bound if has_solution else float("-inf")
    return SolveResult(solver, status == module.OPTIMAL, has_solution, bound)
