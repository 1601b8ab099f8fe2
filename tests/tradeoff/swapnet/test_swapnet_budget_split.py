"""SwapNet Eq. 1: the budget split between several DNNs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerfit.errors import BudgetError
from layerfit.tradeoff.swapnet.budget_split import equation_1, performance_score, split_budget


def test_demands_that_fit_are_given_in_full():
    assert split_budget(1000, [400, 300, 200], [1.0, 5.0, 0.1]) == [400, 300, 200]


def test_equation_1_as_printed_when_no_clamp_applies():
    demands, scores = [600, 600, 300], [1.0, 1.0, 2.0]
    got = split_budget(1000, demands, scores)
    exact = equation_1(1000, demands, scores)
    # (M_i / 1500) * (2/3) * 1000 + (PS_i / 4) * (1/3) * 1000
    assert exact == pytest.approx([600 / 1500 * 2 / 3 * 1000 + 1 / 4 / 3 * 1000] * 2 + [300 / 1500 * 2 / 3 * 1000 + 2 / 4 / 3 * 1000])
    assert sum(got) == 1000
    assert all(abs(g - e) <= 2 for g, e in zip(got, exact, strict=True))


def test_model_whose_demand_fits_gets_it_and_no_more():
    # the small urgent model's Eq. 1 share exceeds its demand: it gets its demand and
    # the others share the rest in Eq. 1's proportions
    got = split_budget(1000, [600, 600, 30], [1.0, 1.0, 50.0])
    assert got[2] == 30
    assert sum(got) == 1000
    assert got[0] == pytest.approx(got[1], abs=1)


def test_minimum_budgets_are_honoured():
    got = split_budget(1000, [600, 700], [1.0, 1.0], minimums=[560, 100])
    assert got[0] == 560 and sum(got) == 1000


def test_minimums_above_the_total_are_refused_with_names():
    with pytest.raises(BudgetError, match="yolo"):
        split_budget(100, [80, 90], [1, 1], minimums=[60, 50], names=["yolo", "resnet"])


def test_performance_score_is_urgency_times_latency_per_byte():
    assert performance_score(0.5, 100, 2.0) == pytest.approx(0.01)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 10**9), st.floats(0.0, 10.0), st.floats(0.0, 1.0)), min_size=1, max_size=6),
    st.floats(0.05, 1.5),
)
def test_split_sums_to_total_within_bounds(models, fraction):
    demands = [d for d, _, _ in models]
    scores = [s for _, s, _ in models]
    mins = [int(d * m) for d, _, m in models]
    total = int(sum(demands) * fraction)
    if sum(mins) > total:
        with pytest.raises(BudgetError):
            split_budget(total, demands, scores, mins)
        return
    got = split_budget(total, demands, scores, mins)
    if sum(demands) <= total:
        assert got == demands
        return
    assert sum(got) == total
    for g, d, m in zip(got, demands, mins, strict=True):
        assert m <= g <= d
