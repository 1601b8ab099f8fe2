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
from layerfit.extras import require
from layerfit.memory.records import TensorUsageRecord, check_time_limit

DEFAULT_TIME_LIMIT = 10.0
DEFAULT_WORKERS = 2


def size_unit(records: Sequence[TensorUsageRecord]) -> int:
    """Greatest common divisor of the sizes (1 when all are zero)."""
    g = 0
    for r in records:
        g = math.gcd(g, r.size)
    return g or 1


def check_solver_options(time_limit: float, workers: int) -> None:
    """PlanError unless ``time_limit`` is a positive, finite number of seconds (an infinite
    one would let the solver run for hours) and ``workers`` a positive integer."""
    check_time_limit(time_limit)
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
    require("ortools")  # the plan extra
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
    invalid: str = ""  # why CP-SAT refused the model (values beyond its range), if it did

    def bound_units(self) -> int:
        """The proven objective bound as an integer that is certainly not above the true one.

        CP-SAT reports it as a double: past 2**53 units the rounding may go up, so the
        bound is lowered by its precision before rounding up to an integer.
        """
        slack = max(1e-6, abs(self.proven_bound) * 2.0**-50)
        return max(0, math.ceil(self.proven_bound - slack))

    def failure(self, time_limit: float) -> str:
        """The note of a plan kept from the heuristic hint because CP-SAT found none."""
        if self.invalid:
            return f"CP-SAT cannot take this model ({self.invalid}); best heuristic kept"
        return f"no CP-SAT solution within {time_limit:g} s; best heuristic kept"


def solve(model: Any, lower_bound: int, time_limit: float, workers: int) -> SolveResult:
    """Solve the CP-SAT ``model`` within ``time_limit`` seconds on ``workers`` threads.

    A model CP-SAT refuses (values beyond ±2**62, which sizes near 2**63 bytes with a
    small greatest common divisor reach) gives no solution and says why in ``invalid``.
    """
    module = cp_model()
    invalid = model.validate()
    if invalid:
        return SolveResult(None, False, False, float("-inf"), invalid.split(". ")[0])
    solver = module.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = int(workers)
    solver.parameters.random_seed = 0
    solver.parameters.log_search_progress = False
    status = solver.solve(model, _stop_at_bound(lower_bound))
    has_solution = status in (module.OPTIMAL, module.FEASIBLE)
    bound = solver.best_objective_bound if has_solution else float("-inf")
    return SolveResult(solver, status == module.OPTIMAL, has_solution, bound)
