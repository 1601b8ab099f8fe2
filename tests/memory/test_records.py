"""Records, alignment, JSON loading, and the errors bad input raises."""

from __future__ import annotations

import json

import pytest

from layerfit.errors import LayerfitError, PlanError
from layerfit.memory import (
    IllegalPlanError,
    OffsetsPlan,
    SharedObjectsPlan,
    TensorUsageRecord,
    align_up,
    load_records,
    make_records,
    mirror,
    plan_objects,
    plan_offsets,
    validate_plan,
)


def test_sizes_are_aligned_to_64_bytes_by_default() -> None:
    records = make_records(
        [
            (0, 0, 1, 1),
            (1, 1, 2, 64),
            (2, 2, 3, 65),
            {"id": 3, "first_op": 3, "last_op": 3, "size": 0},
        ]
    )
    assert [r.size for r in records] == [64, 64, 128, 0]
    assert [r.size for r in make_records([(0, 0, 1, 100)], alignment=1)] == [100]
    assert align_up(100, 256) == 256


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ((7, 3, 2, 8), ["record 7", "first_op 3", "last_op 2"]),
        ((7, 0, 2, -8), ["record 7", "size -8", "negative"]),
        ((7, -1, 2, 8), ["record 7", "first_op -1"]),
        ((7, 0, 2.5, 8), ["record 7", "last_op", "integer"]),
        ({"id": 7, "first_op": 0}, ["last_op", "size"]),
        ("nonsense", ["neither"]),
    ],
)
def test_bad_records_name_the_record(item, words) -> None:
    with pytest.raises(PlanError) as err:
        make_records([item])
    assert isinstance(err.value, LayerfitError)
    for word in words:
        assert word in str(err.value)


def test_duplicate_ids_are_refused() -> None:
    with pytest.raises(PlanError, match="duplicate tensor id 4"):
        make_records([(4, 0, 1, 8), (4, 1, 2, 8)])
    records = [TensorUsageRecord(4, 0, 1, 8), TensorUsageRecord(4, 1, 2, 8)]
    with pytest.raises(PlanError, match="duplicate tensor id 4"):
        plan_offsets(records, "greedy_by_size")


def test_unknown_strategy_lists_the_valid_names() -> None:
    records = make_records([(0, 0, 1, 8)])
    with pytest.raises(PlanError) as err:
        plan_objects(records, "greedy_by_magic")
    assert "greedy_by_magic" in str(err.value) and "greedy_by_size_improved" in str(err.value)
    with pytest.raises(PlanError, match="strip_packing"):
        plan_offsets(records, "nope")
    with pytest.raises(PlanError, match="approach"):
        from layerfit.memory import plan

        plan(records, "textures", "naive")


def test_unknown_options_are_refused() -> None:
    records = make_records([(0, 0, 1, 8)])
    with pytest.raises(PlanError, match="does not take option"):
        plan_objects(records, "greedy_by_size", time_limit=3)
    with pytest.raises(PlanError, match="priority"):
        plan_offsets(records, "strip_packing", priority="colour")
    with pytest.raises(PlanError, match="time_limit"):
        plan_offsets(records, "cpsat", time_limit=0)
    with pytest.raises(PlanError, match="solver"):
        plan_objects(records, "min_cost_flow", solver="simplex")
    with pytest.raises(PlanError, match="legal"):
        plan_offsets(records, "cpsat", hint=OffsetsPlan(8, {0: 0}))
    with pytest.raises(PlanError, match="legal"):
        plan_objects(records, "cpsat", hint=plan_offsets(records, "naive"))


def test_load_records_from_json(tmp_path) -> None:
    path = tmp_path / "records.json"
    path.write_text(json.dumps([{"id": 0, "first_op": 0, "last_op": 1, "size": 100}]))
    assert load_records(path) == [TensorUsageRecord(0, 0, 1, 128)]
    with pytest.raises(PlanError, match="does not exist"):
        load_records(tmp_path / "missing.json")
    path.write_text("{not json")
    with pytest.raises(PlanError, match="as JSON"):
        load_records(path)
    path.write_text(json.dumps({"tensors": []}))
    with pytest.raises(PlanError, match="list"):
        load_records(path)


def test_validator_names_the_clash() -> None:
    records = make_records([(0, 0, 2, 64), (1, 1, 3, 64), (2, 3, 4, 64)])
    with pytest.raises(IllegalPlanError, match="tensors 0 .* and 1 .* overlap"):
        validate_plan(records, OffsetsPlan(128, {0: 0, 1: 32, 2: 64}))
    with pytest.raises(IllegalPlanError, match="live together in object 0"):
        validate_plan(records, SharedObjectsPlan((64,), {0: 0, 1: 0, 2: 0}))
    with pytest.raises(IllegalPlanError, match="tensor 2 has no offset"):
        validate_plan(records, OffsetsPlan(128, {0: 0, 1: 64}))
    with pytest.raises(IllegalPlanError, match="beyond the arena"):
        validate_plan(records, OffsetsPlan(100, {0: 0, 1: 64, 2: 0}))
    with pytest.raises(IllegalPlanError, match="does not fit"):
        validate_plan(records, SharedObjectsPlan((64, 32), {0: 0, 1: 1, 2: 0}))
    validate_plan(records, OffsetsPlan(128, {0: 0, 1: 64, 2: 0}))


def test_mirror_reverses_time() -> None:
    records = make_records([(0, 0, 2, 64), (1, 1, 5, 64)])
    assert mirror(records) == [TensorUsageRecord(0, 3, 5, 64), TensorUsageRecord(1, 0, 4, 64)]


def test_plans_serialise_with_every_assignment() -> None:
    records = make_records([(10, 0, 1, 64), (11, 1, 2, 64), (12, 2, 3, 64)])
    objects = plan_objects(records, "greedy_by_size_improved").to_dict()
    assert objects["total"] == 128 and set(objects["assignment"]) == {"10", "11", "12"}
    offsets = plan_offsets(records, "greedy_by_size").to_dict()
    assert offsets["total"] == 128 and offsets["assignment"]["11"] == 64
    assert offsets["seconds"] >= 0


def test_the_public_align_up_keeps_its_default_and_its_check():
    from layerfit.errors import PlanError
    from layerfit.memory import align_up

    assert align_up(65) == 128 and align_up(5, 8) == 8 and align_up(0) == 0
    with pytest.raises(PlanError, match="power of two"):
        align_up(5, 3)
