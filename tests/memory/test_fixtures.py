"""Every strategy on TFLite-style tiny fixtures, with exact expected plans."""

from __future__ import annotations

import pytest
from memory_fixtures import (
    CHAIN,
    COMPLEX,
    FIXTURES,
    TFLITE_OBJECTS,
    TFLITE_OBJECTS_TO_OFFSETS,
    TFLITE_OFFSETS,
    TFLITE_PROFILES,
)

from layerfit.memory import (
    STRATEGIES,
    OffsetsPlan,
    SharedObjectsPlan,
    make_records,
    objects_lower_bound,
    offsets_lower_bound,
    operator_profiles,
    plan_objects,
    plan_offsets,
    positional_maximums,
    strategy_names,
    validate_plan,
)

# -- ported from TFLite ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "strategy"),
    [(f, s) for f, table in TFLITE_OBJECTS.items() for s in table],
)
def test_tflite_objects_assignment(fixture: str, strategy: str) -> None:
    records = FIXTURES[fixture]
    ids, sizes = TFLITE_OBJECTS[fixture][strategy]
    plan = plan_objects(records, strategy)
    assert [plan.object_ids[r.id] for r in records] == ids
    assert list(plan.object_sizes) == sizes
    validate_plan(records, plan)


@pytest.mark.parametrize(
    ("fixture", "strategy"),
    [(f, s) for f, table in TFLITE_OFFSETS.items() for s in table],
)
def test_tflite_offsets_assignment(fixture: str, strategy: str) -> None:
    records = FIXTURES[fixture]
    offsets, total = TFLITE_OFFSETS[fixture][strategy]
    plan = plan_offsets(records, strategy)
    assert [plan.offsets[r.id] for r in records] == offsets
    assert plan.arena_size == total
    validate_plan(records, plan)


@pytest.mark.parametrize("fixture", list(TFLITE_PROFILES))
def test_tflite_profiles_and_positional_maximums(fixture: str) -> None:
    records = FIXTURES[fixture]
    expected_profiles, expected_max = TFLITE_PROFILES[fixture]
    profiles = operator_profiles(records)
    starts = {r.first_op for r in records}
    assert [p.op for p in profiles] == sorted(starts)
    for p in profiles:
        assert list(p.members) == expected_profiles[p.op]
        assert p.breadth == sum(records[i].size for i in p.members)
    # an operator where nothing starts has a profile inside the last start's profile
    for op, members in enumerate(expected_profiles):
        if op not in starts:
            latest = max(s for s in starts if s <= op)
            assert set(members) <= set(expected_profiles[latest])
    assert positional_maximums(records) == expected_max


@pytest.mark.parametrize(("sizes", "ids", "offsets", "total"), TFLITE_OBJECTS_TO_OFFSETS)
def test_tflite_objects_to_offsets(sizes, ids, offsets, total) -> None:
    plan = SharedObjectsPlan(tuple(sizes), dict(enumerate(ids)))
    converted = plan.to_offsets()
    assert [converted.offsets[i] for i in range(len(ids))] == offsets
    assert converted.arena_size == total


@pytest.mark.parametrize("approach", ["objects", "offsets"])
def test_empty_records_give_empty_plans(approach: str) -> None:
    for name in strategy_names(approach):
        plan = STRATEGIES[approach][name].function([])
        assert plan.total == 0, name
        assert (plan.object_ids if isinstance(plan, SharedObjectsPlan) else plan.offsets) == {}


@pytest.mark.parametrize("approach", ["objects", "offsets"])
def test_one_record_takes_its_own_size(approach: str) -> None:
    records = FIXTURES["ONE"]
    for name in strategy_names(approach):
        plan = STRATEGIES[approach][name].function(records)
        assert plan.total == 16, name
        validate_plan(records, plan)


# -- strategies TFLite does not have: expected plans worked out by hand --------------


def test_greedy_by_size_objects_paper_algorithm_2() -> None:
    # chain: 64 opens object 0; 32 meets it at op 3 -> object 1; 16 fits both, takes the
    # smaller (1); 8@[1,2] meets 16 and 64 -> object 2; 8@[4,5] meets 32 -> smallest free is 2
    plan = plan_objects(CHAIN, "greedy_by_size")
    assert [plan.object_ids[r.id] for r in CHAIN] == [1, 2, 0, 1, 2]
    assert plan.object_sizes == (64, 32, 8)
    plan = plan_objects(COMPLEX, "greedy_by_size")
    assert [plan.object_ids[r.id] for r in COMPLEX] == [0, 1, 3, 2, 4, 0, 3, 4, 2]
    assert plan.object_sizes == (64, 32, 16, 8, 8)


def test_strip_packing_best_fit_on_the_skyline() -> None:
    # traced by hand: 1 (longest, widest) at 0; lift [0,0]; 5 at 0; 8 at 0; lift; 0 at 32;
    # lift to 64; 2 at 64; 6 at 64; 3 at 72; 7 at 72; lifts; 4 at 88 -> arena 96 (= bound)
    plan = plan_offsets(COMPLEX, "strip_packing")
    assert [plan.offsets[r.id] for r in COMPLEX] == [32, 0, 64, 72, 88, 0, 64, 72, 0]
    assert plan.arena_size == 96 == offsets_lower_bound(COMPLEX)
    by_size = plan_offsets(CHAIN, "strip_packing", priority="size")
    validate_plan(CHAIN, by_size)
    assert [by_size.offsets[r.id] for r in CHAIN] == [0, 64, 0, 64, 0]


def test_greedy_by_breadth_offsets_section_5_3() -> None:
    plan = plan_offsets(COMPLEX, "greedy_by_breadth")
    assert [plan.offsets[r.id] for r in COMPLEX] == [0, 32, 80, 64, 88, 0, 64, 72, 0]
    assert plan.arena_size == 96


def test_greedy_in_order_offsets_is_an_online_best_fit() -> None:
    plan = plan_offsets(CHAIN, "greedy_in_order")
    # 16 at 0; 8 on top (16 live); 64 on top of 8 (8 live, gap [0,16) too small); 32 on
    # top of 64; the last 8 takes the freed hole at 0
    assert [plan.offsets[r.id] for r in CHAIN] == [0, 16, 24, 88, 0]
    assert plan.arena_size == 120


def test_objects_laid_end_to_end() -> None:
    plan = plan_offsets(COMPLEX, "objects:greedy_in_order")
    assert [plan.offsets[r.id] for r in COMPLEX] == [0, 32, 0, 96, 112, 32, 112, 96, 0]
    assert plan.arena_size == 120 == plan_objects(COMPLEX, "greedy_in_order").total
    assert plan.strategy == "objects:greedy_in_order"


def test_naive_is_the_sum_of_sizes() -> None:
    assert plan_objects(COMPLEX, "naive").total == plan_offsets(COMPLEX, "naive").total == 192


def test_lower_bounds_of_the_fixtures() -> None:
    assert objects_lower_bound(CHAIN) == 96 and offsets_lower_bound(CHAIN) == 96
    assert objects_lower_bound(COMPLEX) == 112 and offsets_lower_bound(COMPLEX) == 96


# -- exact solver and portfolio ------------------------------------------------------

# found by search: no objects plan reaches the positional-maxima bound 9
OBJECTS_ABOVE_BOUND = make_records(
    [(0, 4, 5, 2), (1, 5, 7, 3), (2, 1, 4, 1), (3, 0, 3, 7)], alignment=1
)
# found by search: the heuristics stop at 10, the exact model reaches the bound 9
OFFSETS_HEURISTICS_MISS = make_records(
    [(0, 1, 1, 1), (1, 3, 4, 2), (2, 5, 6, 1), (3, 4, 5, 7), (4, 6, 8, 2), (5, 7, 10, 7)],
    alignment=1,
)


def test_cpsat_objects_proves_an_optimum_above_the_bound() -> None:
    assert objects_lower_bound(OBJECTS_ABOVE_BOUND) == 9
    plan = plan_objects(OBJECTS_ABOVE_BOUND, "cpsat", time_limit=5)
    validate_plan(OBJECTS_ABOVE_BOUND, plan)
    assert (plan.total, plan.status, plan.lower_bound, plan.gap) == (10, "optimal", 10, 0.0)


def test_cpsat_offsets_beats_every_heuristic() -> None:
    records = OFFSETS_HEURISTICS_MISS
    best = plan_offsets(records, "best")
    assert best.total == 10
    plan = plan_offsets(records, "cpsat", time_limit=5)
    validate_plan(records, plan)
    assert (plan.total, plan.status) == (9, "optimal") and plan.total == offsets_lower_bound(
        records
    )


def test_cpsat_returns_at_once_when_the_hint_meets_the_bound() -> None:
    plan = plan_offsets(COMPLEX, "cpsat", time_limit=5)
    assert (plan.total, plan.status, plan.lower_bound) == (96, "optimal", 96)
    assert "meets the lower bound" in plan.note
    objects = plan_objects(COMPLEX, "cpsat", time_limit=5)
    assert (objects.total, objects.status) == (112, "optimal")


def test_cpsat_accepts_a_hint_and_a_capped_object_count() -> None:
    hint = plan_objects(OBJECTS_ABOVE_BOUND, "greedy_in_order")
    plan = plan_objects(OBJECTS_ABOVE_BOUND, "cpsat", time_limit=5, hint=hint, max_objects=3)
    validate_plan(OBJECTS_ABOVE_BOUND, plan)
    assert plan.total == 10


def test_cpsat_refuses_an_illegal_hint_or_one_of_the_other_kind() -> None:
    from layerfit.errors import PlanError

    offsets = plan_offsets(COMPLEX, "greedy_by_size")
    objects = plan_objects(COMPLEX, "greedy_by_size")
    overlapping = OffsetsPlan(offsets.total, dict.fromkeys(offsets.offsets, 0))  # everything at 0
    with pytest.raises(PlanError, match="offsets CP-SAT model must be a legal OffsetsPlan"):
        plan_offsets(COMPLEX, "cpsat", time_limit=5, hint=overlapping)
    with pytest.raises(PlanError, match="offsets CP-SAT model must be a legal OffsetsPlan"):
        plan_offsets(COMPLEX, "cpsat", time_limit=5, hint=objects)
    with pytest.raises(PlanError, match="objects CP-SAT model must be a legal SharedObjectsPlan"):
        plan_objects(COMPLEX, "cpsat", time_limit=5, hint=offsets)


def test_best_names_its_winner_and_carries_the_bound() -> None:
    plan = plan_objects(COMPLEX, "best")
    assert plan.total == 112 and plan.lower_bound == 112 and plan.strategy == "best"
    assert "greedy_by_size_improved" in plan.note or "min_cost_flow" in plan.note
    offsets = plan_offsets(COMPLEX, "best")
    assert isinstance(offsets, OffsetsPlan) and offsets.total == 96
