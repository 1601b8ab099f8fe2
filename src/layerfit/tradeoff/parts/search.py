"""Algorithm 2 (Minakova & Stefanov, Section 6): buffer reduction by a genetic search.

1. Apply buffer reuse alone (Algorithm 1). If the memory constraint ``M^c`` is met (and
   the throughput constraints, which reuse does not change), exit early: no layer
   processes by parts (lines 1-5).
2. Otherwise search with NSGA-II (pymoo) over the binary chromosome "layer ``l_i^n``
   processes by parts" - one gene per layer of every CNN; genes of layers that cannot
   process by parts are fixed to 0 - minimising ``(M, -T_1, ..., -T_N)`` subject to
   ``M <= M^c`` and ``T_n >= T_n^c`` (lines 6-8). Two-point crossover and bit-flip
   mutation (one gene per chromosome on average) are the paper's "two-parent crossover
   and single-gene mutation". The initial population holds the all-zero and all-one
   chromosomes besides random ones.
3. Every chromosome is evaluated by ``DeriveApplicationWithReducedBufs``: minimum
   buffers and schedules of each partition from the row analysis, then Algorithm 1
   (:meth:`Application.derive`); memory by Eq. 1, throughput by an estimator.
4. From the Pareto front of everything evaluated, pick a chromosome meeting all
   constraints (lines 9-14). The paper picks the one with the least memory; by
   default we pick the one with the *highest throughput* among those meeting the
   constraints (the paper's stated aim of no unnecessary throughput decrease; its
   Table 12 reports such points), ``select="memory"`` is line 14 literally. If none
   meets them, return the least-memory chromosome of the front (line 16) and say which
   constraint fails and by how much.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from layerfit.errors import TradeoffError
from layerfit.extras import require
from layerfit.sizes import format_bytes
from layerfit.tradeoff.parts.appfile import Constraints
from layerfit.tradeoff.parts.application import Application, DerivedApplication, MemoryCost
from layerfit.tradeoff.parts.reuse import ReuseOrder
from layerfit.tradeoff.parts.throughput import ThroughputEstimator, estimator_for

Selection = Literal["throughput", "memory"]


@dataclass(frozen=True)
class GAParams:
    """Standard GA parameters ``GA_par``; ``mutation`` is the per-gene flip probability
    (default ``1 / genes``: one flipped gene per chromosome on average)."""

    population: int = 40
    generations: int = 30
    crossover: float = 0.9
    mutation: float | None = None
    seed: int = 0


@dataclass(frozen=True)
class Evaluation:
    """Memory (Eq. 1) and per-CNN throughput of one chromosome."""

    bits: tuple[bool, ...]
    memory: MemoryCost
    throughput: dict[str, float]

    @property
    def parts(self) -> int:
        """Number of layers processing by parts."""
        return sum(self.bits)

    def objectives(self, cnns: Sequence[str]) -> tuple[float, ...]:
        return (float(self.memory.total), *(-self.throughput[c] for c in cnns))

    def meets(self, constraints: Constraints) -> bool:
        if constraints.memory is not None and self.memory.total > constraints.memory:
            return False
        return all(self.throughput.get(c, 0.0) >= t for c, t in constraints.throughput.items())

    def to_dict(self, names: Sequence[str] | None = None) -> dict[str, Any]:
        data: dict[str, Any] = {
            "memory_bytes": self.memory.total,
            "param_bytes": self.memory.params,
            "buffer_bytes": self.memory.buffers,
            "throughput_fps": dict(self.throughput),
            "layers_by_parts": self.parts,
        }
        if names is not None:
            data["by_parts"] = [n for n, b in zip(names, self.bits, strict=True) if b]
        return data


@dataclass(frozen=True)
class Violation:
    """A constraint no evaluated configuration meets, and by how much it misses."""

    constraint: str  # "memory" or "throughput:<cnn>"
    required: float
    best: float  # least memory found / most fps found (with memory met, when possible)

    @property
    def gap(self) -> float:
        return self.best - self.required if self.constraint == "memory" else self.required - self.best

    def message(self) -> str:
        if self.constraint == "memory":
            return (
                f"memory <= {format_bytes(self.required)} cannot be met: the smallest configuration "
                f"found needs {format_bytes(self.best)} ({format_bytes(self.gap)} over)"
            )
        cnn = self.constraint.split(":", 1)[1]
        return (
            f"throughput of {cnn} >= {self.required:.1f} fps cannot be met: the best found is "
            f"{self.best:.1f} fps ({self.gap:.1f} fps short)"
        )


@dataclass
class TradeoffResult:
    """What Algorithm 2 returns, plus the baselines it is compared with."""

    chosen: Evaluation
    derived: DerivedApplication
    pareto: list[Evaluation]
    feasible: bool
    early_exit: bool
    violations: list[Violation]
    baselines: dict[str, Evaluation]
    evaluations: int
    constraints: Constraints = field(default_factory=Constraints)

    def to_dict(self) -> dict[str, Any]:
        app = self.derived.app
        names = app.layer_names()
        return {
            "application": app.name,
            "precision": app.precision,
            "constraints": {
                "memory_bytes": self.constraints.memory,
                "throughput_fps": dict(self.constraints.throughput),
            },
            "feasible": self.feasible,
            "early_exit": self.early_exit,
            "violations": [
                {"constraint": v.constraint, "required": v.required, "best": v.best, "gap": v.gap, "message": v.message()}
                for v in self.violations
            ],
            "chosen": self.chosen.to_dict(names),
            "phases": {f"{c}:{n}": k for (c, n), k in self.derived.phases.items() if k > 1},
            "buffers": [
                {"size_elems": b.size, "edges": [e.label for e in b.edges]} for b in self.derived.buffers
            ],
            "baselines": {k: v.to_dict() for k, v in self.baselines.items()},
            "pareto": [e.to_dict() for e in self.pareto],
            "evaluations": self.evaluations,
        }


@dataclass(eq=False)
class Evaluator:
    """``EvalMemory`` and ``EvalThroughput`` of Algorithm 2, cached per chromosome."""

    app: Application
    estimator: ThroughputEstimator
    order: ReuseOrder = "best"
    phase_rows: int = 1
    cache: dict[tuple[bool, ...], Evaluation] = field(default_factory=dict)

    def __call__(self, bits: Sequence[bool] | None) -> Evaluation:
        key = self.app.bits_of(bits)
        if key not in self.cache:
            derived = self.app.derive(key, order=self.order, phase_rows=self.phase_rows)
            self.cache[key] = Evaluation(key, derived.memory(), self.estimator.throughput(self.app, derived))
        return self.cache[key]

    def final(self, bits: Sequence[bool] | None, reuse: bool = True) -> tuple[Evaluation, DerivedApplication]:
        """Evaluation, not cached, with the most thorough reuse (Algorithm 1 and the memory
        planner), or none (``reuse=False``: the naive allocation); throughput as cached."""
        key = self.app.bits_of(bits)
        derived = self.app.derive(key, reuse, order="planner", phase_rows=self.phase_rows)
        return Evaluation(key, derived.memory(), self(key).throughput), derived


def pareto_front(evaluations: Sequence[Evaluation], cnns: Sequence[str]) -> list[Evaluation]:
    """Non-dominated evaluations on (memory, -T_1, ..., -T_N), sorted by memory."""
    points = [e.objectives(cnns) for e in evaluations]
    front = [
        e for e, f in zip(evaluations, points, strict=True)
        if not any(g != f and all(a <= b for a, b in zip(g, f, strict=True)) for g in points)
    ]
    return sorted(front, key=lambda e: e.objectives(cnns))


def baselines(evaluator: Evaluator) -> dict[str, Evaluation]:
    """No reduction, reuse only ([23]-style), all layers by parts without reuse ([17]) and with."""
    every = [True] * evaluator.app.n_layers
    return {
        "no_reduction": evaluator.final(None, reuse=False)[0],
        "reuse_only": evaluator.final(None)[0],
        "all_parts": evaluator.final(every, reuse=False)[0],
        "all_parts_reuse": evaluator.final(every)[0],
    }


def reduce_buffers(
    app: Application,
    constraints: Constraints,
    estimator: ThroughputEstimator | None = None,
    ga: GAParams | None = None,
    select: Selection = "throughput",
    order: ReuseOrder = "best",
    phase_rows: int = 1,
    evaluator: Evaluator | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> TradeoffResult:
    """Algorithm 2: the configuration meeting ``constraints`` (see the module docstring).

    Passing the ``evaluator`` of an earlier call on the same application reuses every
    chromosome it evaluated (e.g. to search several constraints). ``progress(done,
    total)`` is called after each GA generation.
    """
    if select not in ("throughput", "memory"):
        raise TradeoffError(f"select must be 'throughput' or 'memory', got {select!r}")
    unknown = set(constraints.throughput) - {c.name for c in app.cnns}
    if unknown:
        raise TradeoffError(f"throughput constraint for unknown CNN(s) {sorted(unknown)}")
    ga = ga or GAParams()
    if evaluator is None:
        evaluator = Evaluator(app, estimator or estimator_for(app), order, phase_rows)
    elif evaluator.app is not app:
        raise TradeoffError("the evaluator belongs to another application")
    base = baselines(evaluator)
    cnns = [c.name for c in app.cnns]
    reuse_only = base["reuse_only"]
    if reuse_only.meets(constraints):  # lines 1-5: buffer reuse alone is enough
        return TradeoffResult(
            reuse_only, evaluator.final(None)[1], [reuse_only], True, True, [], base,
            len(evaluator.cache), constraints,
        )
    mask = np.array(app.tileable_mask(), dtype=bool)
    if mask.any():
        _run_ga(evaluator, constraints, mask, ga, progress)
    front = pareto_front(list(evaluator.cache.values()), cnns)
    feasible = [e for e in front if e.meets(constraints)]
    if feasible:
        picked = _select(feasible, base["reuse_only"], select, cnns)
        violations: list[Violation] = []
    else:
        picked = min(front, key=lambda e: e.objectives(cnns))
        violations = _violations(list(evaluator.cache.values()), constraints)
    chosen, derived = evaluator.final(picked.bits)  # never more memory than ``picked``
    return TradeoffResult(
        chosen, derived, front, bool(feasible), False, violations, base, len(evaluator.cache), constraints,
    )


def _select(feasible: list[Evaluation], reference: Evaluation, select: Selection, cnns: Sequence[str]) -> Evaluation:
    if select == "memory":
        return min(feasible, key=lambda e: e.objectives(cnns))

    def relative(e: Evaluation) -> float:
        return min(e.throughput[c] / reference.throughput[c] for c in cnns)

    return min(feasible, key=lambda e: (-relative(e), e.memory.total))


def _violations(evaluations: list[Evaluation], constraints: Constraints) -> list[Violation]:
    """The constraints no evaluation meets (throughput among those meeting the memory
    constraint, when some do); every throughput constraint when each alone can be met."""
    result = []
    memory_ok = [e for e in evaluations if constraints.memory is None or e.memory.total <= constraints.memory]
    if constraints.memory is not None and not memory_ok:
        result.append(Violation("memory", float(constraints.memory), float(min(e.memory.total for e in evaluations))))
    pool = memory_ok or evaluations
    throughput = [
        Violation(f"throughput:{cnn}", required, max(e.throughput[cnn] for e in pool))
        for cnn, required in constraints.throughput.items()
    ]
    return result + [v for v in throughput if v.best < v.required] or throughput


def _run_ga(
    evaluator: Evaluator, constraints: Constraints, mask: np.ndarray, ga: GAParams,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """NSGA-II over the tileable genes; every evaluation lands in ``evaluator.cache``."""
    require("pymoo")  # the tradeoff extra
    from pymoo.algorithms.moo.nsga2 import NSGA2
    from pymoo.core.callback import Callback
    from pymoo.core.problem import Problem
    from pymoo.operators.crossover.pntx import TwoPointCrossover
    from pymoo.operators.mutation.bitflip import BitflipMutation
    from pymoo.optimize import minimize

    app = evaluator.app
    genes = int(mask.sum())
    cnns = [c.name for c in app.cnns]
    limited = [c for c in cnns if constraints.throughput.get(c, 0.0) > 0]
    memory_limit = constraints.memory

    def expand(x: np.ndarray) -> list[bool]:
        full = np.zeros(len(mask), dtype=bool)
        full[mask] = x
        return full.tolist()

    class BufferReduction(Problem):
        def __init__(self) -> None:
            super().__init__(n_var=genes, n_obj=1 + len(cnns), n_ieq_constr=1 + len(limited), xl=0, xu=1, vtype=bool)

        def _evaluate(self, X: np.ndarray, out: dict[str, Any], *args: Any, **kwargs: Any) -> None:
            F, G = [], []
            for x in np.asarray(X, dtype=bool):
                e = evaluator(expand(x))
                F.append(e.objectives(cnns))
                g = [e.memory.total - memory_limit if memory_limit is not None else -1.0]
                g += [constraints.throughput[c] - e.throughput[c] for c in limited]
                G.append(g)
            out["F"] = np.array(F, dtype=float)
            out["G"] = np.array(G, dtype=float)

    rng = np.random.default_rng(ga.seed)
    population = max(ga.population, 4)
    initial = rng.random((population, genes)) < rng.random((population, 1))
    initial[0] = False
    initial[1] = True
    algorithm = NSGA2(
        pop_size=population,
        sampling=initial,
        crossover=TwoPointCrossover(prob=ga.crossover),
        mutation=BitflipMutation(prob=1.0, prob_var=ga.mutation or 1.0 / genes),
        eliminate_duplicates=True,
    )
    generations = max(ga.generations, 1)

    class Generations(Callback):  # pymoo calls it after each generation
        def notify(self, algorithm: Any) -> None:
            if progress is not None:
                progress(min(int(algorithm.n_gen), generations), generations)

    minimize(BufferReduction(), algorithm, ("n_gen", generations), seed=ga.seed, verbose=False, callback=Generations())
