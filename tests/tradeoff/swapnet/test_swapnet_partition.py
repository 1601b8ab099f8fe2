"""SwapNet partition search: the dynamic program is exact, the tables agree with it."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerfit.tradeoff.swapnet.partition import (
    LayerCosts,
    PartitionTables,
    candidate_points,
    max_pair_bytes,
    min_capacity,
    optimal_partition,
    predict,
)

PAGE = 4096


@st.composite
def layer_lists(draw, max_layers: int = 8):
    n = draw(st.integers(2, max_layers))
    pages = draw(st.lists(st.integers(1, 12), min_size=n, max_size=n))
    reads = draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))
    works = draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))
    kr = draw(st.sampled_from([0.0, 0.05, 0.3]))
    kw = draw(st.sampled_from([0.0, 0.05, 0.3]))
    costs = LayerCosts.from_arrays([p * PAGE for p in pages], reads, works, read_overhead_s=kr, work_overhead_s=kw)
    cap = draw(st.integers(min_capacity(costs) // PAGE, costs.total_bytes // PAGE + 2)) * PAGE
    return costs, cap


def brute_force(costs: LayerCosts, cap: int, points=None, blocks=None) -> float | None:
    """Least predicted latency over every partition with >= 2 blocks (None if none fits)."""
    pool = list(range(1, costs.layers)) if points is None else list(points)
    best = None
    for k in range(1, len(pool) + 1):
        if blocks is not None and k != blocks - 1:
            continue
        for pts in itertools.combinations(pool, k):
            if max_pair_bytes(costs, pts) <= cap:
                t = predict(costs, pts)
                best = t if best is None else min(best, t)
    return best


def test_predict_is_two_blocks_in_flight():
    # reads 1,2,3 / work 5,1,4: read 1, then max(5, 2) + max(1, 3) + 4
    costs = LayerCosts.from_arrays([PAGE] * 3, [1, 2, 3], [5, 1, 4])
    assert predict(costs, [1, 2]) == 1 + 5 + 3 + 4
    assert max_pair_bytes(costs, [1, 2]) == 2 * PAGE
    assert predict(costs, [2]) == 3 + max(6, 3) + 4
    with_overheads = LayerCosts.from_arrays([PAGE] * 3, [1, 2, 3], [5, 1, 4], read_overhead_s=1, work_overhead_s=2)
    assert predict(with_overheads, [2]) == (3 + 1) + max(6 + 2, 3 + 1) + (4 + 2)


@settings(max_examples=150, deadline=None)
@given(layer_lists(), st.sampled_from([None, 2, 3, 4]))
def test_dp_optimum_equals_brute_force(case, blocks):
    costs, cap = case
    expected = brute_force(costs, cap, blocks=blocks)
    got = optimal_partition(costs, cap, blocks=blocks)
    if expected is None:
        assert got is None
        return
    assert got is not None
    assert math.isclose(got.predicted_s, expected, rel_tol=1e-9, abs_tol=1e-12)
    assert got.max_pair_bytes <= cap
    assert got.predicted_s == predict(costs, got.points)
    if blocks is not None:
        assert got.blocks == blocks


@settings(max_examples=60, deadline=None)
@given(layer_lists(max_layers=10), st.data())
def test_dp_restricted_to_candidates_equals_brute_force(case, data):
    costs, cap = case
    cands = data.draw(st.sets(st.integers(1, costs.layers - 1), max_size=costs.layers - 1))
    expected = brute_force(costs, cap, points=sorted(cands))
    got = optimal_partition(costs, cap, candidates=sorted(cands))
    assert (got is None) == (expected is None)
    if got is not None:
        assert set(got.points) <= cands
        assert math.isclose(got.predicted_s, expected, rel_tol=1e-9, abs_tol=1e-12)


@settings(max_examples=60, deadline=None)
@given(layer_lists(max_layers=12), st.sampled_from([3, 10, 40]))
def test_table_choice_equals_dp_within_the_tables_candidates(case, rows):
    costs, cap = case
    tables = PartitionTables.build(costs, min_capacity=min_capacity(costs), rows_per_table=rows, anchors=0)
    overall = None
    for n, table in tables.tables.items():
        row = table.lookup(cap)
        exact = optimal_partition(costs, cap, candidates=table.candidates, blocks=n)
        assert (row is None) == (exact is None)
        if row is not None:
            assert math.isclose(table.latency_s[row], exact.predicted_s, rel_tol=1e-9, abs_tol=1e-12)
            assert table.max_bytes[row] <= cap
            overall = exact.predicted_s if overall is None else min(overall, exact.predicted_s)
    choice = tables.lookup(costs, cap)
    assert (choice is None) == (overall is None)
    if choice is not None:
        assert math.isclose(choice.predicted_s, overall, rel_tol=1e-9, abs_tol=1e-12)
        assert choice.predicted_s == pytest.approx(predict(costs, choice.points))
        # the tables never beat the exact optimum over every point
        assert choice.predicted_s >= optimal_partition(costs, cap).predicted_s - 1e-12


def test_anchors_give_every_feasible_budget_a_row():
    rng = np.random.default_rng(1)
    n = 60
    costs = LayerCosts.from_arrays(rng.integers(1, 50, n) * PAGE, rng.random(n), rng.random(n))
    low = min_capacity(costs)
    tables = PartitionTables.build(costs, min_capacity=low, rows_per_table=50, anchors=4)
    for cap in (low, low + PAGE, costs.total_bytes // 3, costs.total_bytes):
        choice = tables.lookup(costs, cap)
        assert choice is not None and choice.max_pair_bytes <= cap
    assert tables.lookup(costs, low - PAGE) is None


def test_candidate_points_are_sorted_inner_points():
    costs = LayerCosts.from_arrays([PAGE] * 30, [0.1] * 30, [0.2] * 30)
    assert candidate_points(costs, 100) == tuple(range(1, 30))
    pts = candidate_points(costs, 5)
    assert list(pts) == sorted(set(pts)) and all(0 < p < 30 for p in pts) and len(pts) == 5


def test_more_blocks_only_when_they_pay():
    # reads dominate: splitting hides reads behind work; with a large hand-over cost
    # per block the optimum uses fewer blocks
    costs = LayerCosts.from_arrays([PAGE] * 6, [1.0] * 6, [1.0] * 6)
    cheap = optimal_partition(costs, 6 * PAGE)
    dear = optimal_partition(
        LayerCosts.from_arrays([PAGE] * 6, [1.0] * 6, [1.0] * 6, work_overhead_s=5.0), 6 * PAGE
    )
    assert cheap.blocks > dear.blocks == 2
