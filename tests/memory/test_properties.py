"""Hypothesis-generated record sets: every plan is legal and sits between the bounds.

Checked for every registered strategy: the plan validates; heuristics are ≥ the
theoretical lower bound, ≤ the naive total, and ≥ CP-SAT's optimum when CP-SAT proves
one; ``best`` is ≤ every heuristic. The validator itself is checked against a brute
force pairwise test on arbitrary (mostly illegal) plans.
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerfit.memory import (
    STRATEGIES,
    OffsetsPlan,
    SharedObjectsPlan,
    TensorUsageRecord,
    lower_bound,
    naive_total,
    plan,
    plan_violations,
    strategy_names,
    validate_plan,
)

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def record_sets(draw, max_tensors: int = 12) -> list[TensorUsageRecord]:
    n = draw(st.integers(0, max_tensors))
    records = []
    for i in range(n):
        first = draw(st.integers(0, 10))
        length = draw(st.integers(0, 4))
        size = draw(st.integers(0, 9))
        records.append(
            TensorUsageRecord(i * 3 + 1, first, first + length, size)
        )  # ids need not be 0..n-1
    return records


def _heuristics(approach: str) -> list[str]:
    return strategy_names(approach, heuristic_only=True)


@SETTINGS
@given(record_sets(), st.sampled_from(["objects", "offsets"]))
def test_every_heuristic_is_legal_and_between_the_bounds(records, approach) -> None:
    bound = lower_bound(records, approach)
    naive = naive_total(records)
    totals = {}
    for name in _heuristics(approach):
        result = plan(records, approach, name)
        validate_plan(records, result)
        assert bound <= result.total <= naive, name
        totals[name] = result.total
    best = plan(records, approach, "best")
    validate_plan(records, best)
    assert best.total <= min(totals.values(), default=0) or not records
    assert best.total >= bound


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record_sets(max_tensors=9), st.sampled_from(["objects", "offsets"]))
def test_cpsat_optimum_bounds_every_heuristic(records, approach) -> None:
    exact = plan(records, approach, "cpsat", time_limit=5)
    validate_plan(records, exact)
    bound = lower_bound(records, approach)
    assert exact.total >= bound
    assert exact.lower_bound is not None and bound <= exact.lower_bound <= exact.total
    assert exact.total <= plan(records, approach, "best").total
    if exact.status == "optimal":
        assert exact.lower_bound == exact.total
        for name in _heuristics(approach):
            assert plan(records, approach, name).total >= exact.total, name


def _brute_force_legal(records: list[TensorUsageRecord], p) -> bool:
    if isinstance(p, SharedObjectsPlan):
        if set(p.object_ids) != {r.id for r in records}:
            return False
        for r in records:
            obj = p.object_ids[r.id]
            if not 0 <= obj < len(p.object_sizes) or p.object_sizes[obj] < r.size:
                return False
        return all(
            not a.intersects(b) or p.object_ids[a.id] != p.object_ids[b.id]
            for a, b in itertools.combinations(records, 2)
        )
    if set(p.offsets) != {r.id for r in records}:
        return False
    if any(p.offsets[r.id] < 0 or p.offsets[r.id] + r.size > p.arena_size for r in records):
        return False
    for a, b in itertools.combinations(records, 2):
        oa, ob = p.offsets[a.id], p.offsets[b.id]
        if a.size and b.size and a.intersects(b) and oa < ob + b.size and ob < oa + a.size:
            return False
    return True


@SETTINGS
@given(record_sets(max_tensors=8), st.data())
def test_validator_agrees_with_brute_force(records, data) -> None:
    if data.draw(st.booleans()):
        n_obj = data.draw(st.integers(1, 4))
        sizes = tuple(data.draw(st.lists(st.integers(0, 9), min_size=n_obj, max_size=n_obj)))
        ids = {r.id: data.draw(st.integers(0, n_obj)) for r in records}  # n_obj is out of range
        candidate = SharedObjectsPlan(sizes, ids)
    else:
        offsets = {r.id: data.draw(st.integers(-1, 20)) for r in records}
        candidate = OffsetsPlan(data.draw(st.integers(0, 30)), offsets)
    problems = plan_violations(records, candidate, limit=1000)
    assert (not problems) == _brute_force_legal(records, candidate), problems


def test_registry_lists_both_approaches() -> None:
    assert set(STRATEGIES) == {"objects", "offsets"}
    assert {
        "naive",
        "greedy_in_order",
        "greedy_by_breadth",
        "greedy_by_size",
        "greedy_by_size_improved",
    } <= set(STRATEGIES["objects"])
    assert {"min_cost_flow", "cpsat", "best"} <= set(STRATEGIES["objects"])
    assert {
        "naive",
        "greedy_by_size",
        "greedy_by_breadth",
        "strip_packing",
        "cpsat",
        "best",
    } <= set(STRATEGIES["offsets"])
    assert "objects:greedy_by_size_improved" in STRATEGIES["offsets"]


@SETTINGS
@given(record_sets())
def test_the_offsets_bound_is_the_most_bytes_live_at_any_operator(records) -> None:
    """max_breadth sweeps starts and ends; it equals the breadth of the busiest operator
    counted tensor by tensor."""
    from layerfit.memory.profiles import max_breadth

    ops = range(max((r.last_op for r in records), default=-1) + 1)
    busiest = max((sum(r.size for r in records if r.first_op <= op <= r.last_op) for op in ops), default=0)
    assert max_breadth(records) == busiest
