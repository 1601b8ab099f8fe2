"""Bad input to the planner and to ``layerfit plan``: one-line PlanErrors, never a traceback
or a silently wrong plan."""

from __future__ import annotations

import json

import pytest

from layerfit.cli import main
from layerfit.errors import PlanError
from layerfit.memory import (
    TensorUsageRecord,
    check_records,
    load_records,
    make_records,
    plan_objects,
    plan_offsets,
    validate_plan,
)
from layerfit.memory.records import MAX_BYTES, MAX_OP, check_alignment

OK = [
    {"id": 0, "first_op": 0, "last_op": 1, "size": 64},
    {"id": 1, "first_op": 1, "last_op": 2, "size": 64},
]


def _write(tmp_path, content: str | bytes, name: str = "records.json") -> str:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return str(path)


def _plan_error(capsys, args: list[str]) -> str:
    """Run ``layerfit plan ARGS``: it must fail with exit 2 and a one-line error."""
    assert main(["plan", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "Traceback" not in err, err
    return err


def test_unknown_record_fields_are_refused() -> None:
    # a typo ("sise") used to be ignored silently
    with pytest.raises(PlanError, match=r"record #0 .*unknown field.*'sise'"):
        make_records([{"id": 0, "first_op": 0, "last_op": 1, "size": 8, "sise": 9}])


@pytest.mark.parametrize(
    ("item", "words"),
    [
        ((7, 0, 1, 2**63), ["record 7", "size", "2**63 - 1"]),
        ((7, 0, 1, 2**70), ["record 7", "size"]),
        ((7, 0, 2**80, 8), ["record 7", "last_op", "2**31 - 1"]),
        ((7, 2**40, 2**41, 8), ["record 7", "first_op"]),
    ],
)
def test_sizes_and_ops_beyond_int64_name_the_record(item, words) -> None:
    with pytest.raises(PlanError) as err:
        make_records([item], alignment=1)
    for word in words:
        assert word in str(err.value)


def test_sizes_that_add_up_beyond_int64_are_refused() -> None:
    records = [TensorUsageRecord(0, 0, 1, MAX_BYTES), TensorUsageRecord(1, 0, 1, 64)]
    with pytest.raises(PlanError, match=r"add up to .* bytes.*record 0"):
        check_records(records)
    with pytest.raises(PlanError, match="add up to"):
        plan_offsets(records, "greedy_by_size")
    with pytest.raises(PlanError, match="rounded up to 64"):
        make_records([(0, 0, 1, MAX_BYTES - 3)])


def test_largest_legal_sizes_plan_without_overflow() -> None:
    one = make_records([(0, 0, MAX_OP, MAX_BYTES)], alignment=1)
    assert plan_offsets(one, "best").total == MAX_BYTES
    half = MAX_BYTES // 2
    two = make_records([(0, 0, 1, half), (1, 1, 2, half), (2, 3, 4, 1)], alignment=1)
    for name in ("greedy_by_size", "greedy_in_order", "greedy_by_breadth", "strip_packing", "best"):
        assert plan_offsets(two, name).total == 2 * half, name
    for name in ("greedy_by_size_improved", "min_cost_flow", "greedy_by_breadth", "best"):
        assert plan_objects(two, name).total == 2 * half, name
    # the exact models, started from the no-sharing plan: solved while CP-SAT's ±2**62
    # domains hold the sizes, else the start plan is kept and the note says why
    for exponent in (60, 62):
        size = 2**exponent - 1
        recs = make_records([(0, 0, 1, size), (1, 1, 2, size), (2, 3, 4, 1)], alignment=1)
        for result in (
            plan_offsets(recs, "cpsat", hint=plan_offsets(recs, "naive"), time_limit=5),
            plan_objects(recs, "cpsat", hint=plan_objects(recs, "naive"), time_limit=5),
        ):
            validate_plan(recs, result)
            if exponent == 60:
                assert result.status == "optimal" and result.total == 2 * size
            elif result.status != "optimal":
                assert "cannot take this model" in result.note and result.lower_bound == 2 * size


@pytest.mark.parametrize("alignment", [0, -64, 3, 96, 2**31, True, 2.0])
def test_alignment_must_be_a_small_power_of_two(alignment) -> None:
    with pytest.raises(PlanError, match="power of two"):
        check_alignment(alignment)
    with pytest.raises(PlanError, match="power of two"):
        make_records([(0, 0, 1, 8)], alignment=alignment)


def test_solver_time_limit_must_be_finite() -> None:
    records = make_records([(0, 0, 1, 64), (1, 1, 2, 128), (2, 2, 3, 64)])
    for bad in (float("inf"), float("nan"), "5", True):
        with pytest.raises(PlanError, match="time_limit"):
            plan_offsets(records, "cpsat", time_limit=bad)


def test_deeply_nested_json_is_a_plan_error(tmp_path) -> None:
    path = _write(tmp_path, "[" * 100_000 + "]" * 100_000)
    with pytest.raises(PlanError, match="as JSON"):
        load_records(path)


def test_records_directory_is_a_plan_error(tmp_path) -> None:
    with pytest.raises(PlanError, match="is a directory"):
        load_records(tmp_path)


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (json.dumps([{**OK[0], "size": 2**70}]), ["record 0", "size"]),
        (json.dumps([{**OK[0], "last_op": 2**80}]), ["record 0", "last_op"]),
        (json.dumps([{**OK[0], "extra": 1}]), ["unknown field", "'extra'"]),
        ("[]", ["no tensor usage records"]),
        ("[" * 50_000 + "]" * 50_000, ["as JSON"]),
        (b"\x00\xff\xfe\x89PNG", ["as JSON"]),
    ],
)
def test_plan_records_file_errors(tmp_path, capsys, content, words) -> None:
    err = _plan_error(capsys, ["--records", _write(tmp_path, content), "--time-limit", "1"])
    for word in words:
        assert word in err


@pytest.mark.parametrize(
    ("option", "words"),
    [
        (["--align", "3"], ["--align", "power of two"]),
        (["--align", "0"], ["--align"]),
        (["--align", str(2**64)], ["--align"]),
        (["--time-limit", "inf"], ["--time-limit", "finite"]),
        (["--time-limit", "nan"], ["--time-limit"]),
        (["--time-limit", "0"], ["--time-limit"]),
        (["--time-limit", "-1"], ["--time-limit"]),
        (["--strategy", ""], ["--strategy"]),
        (["--strategy", " , "], ["--strategy"]),
        (["--order", "searched"], ["--order", "MODEL"]),
        (["--approach", "textures"], ["approach", "objects, offsets"]),
    ],
)
def test_plan_option_errors(tmp_path, capsys, option, words) -> None:
    err = _plan_error(capsys, ["--records", _write(tmp_path, json.dumps(OK)), *option])
    for word in words:
        assert word in err


def test_plan_json_of_huge_sizes_is_strict(tmp_path, capsys) -> None:
    rows = [
        {"id": 0, "first_op": 0, "last_op": 1, "size": 2**62},
        {"id": 1, "first_op": 1, "last_op": 2, "size": 2**62 - 64},
        {"id": 2, "first_op": 3, "last_op": 3, "size": 0},
    ]
    path = _write(tmp_path, json.dumps(rows))
    assert main(["plan", "--records", path, "--json", "--time-limit", "2"]) == 0
    text = capsys.readouterr().out

    def refuse(constant: str) -> None:
        raise AssertionError(f"non-strict JSON constant {constant}")

    report = json.loads(text, parse_constant=refuse)
    offsets = report["approaches"]["offsets"]
    assert offsets["lower_bound"] == 2**63 - 64
    assert all(row["total"] >= offsets["lower_bound"] for row in offsets["strategies"])


def test_min_cost_flow_takes_sizes_whose_scaled_costs_overflow_ortools() -> None:
    # past SPFA_ARC_LIMIT reuse arcs OR-Tools solves the flow; it refused costs near
    # 2**56 (BAD_COST_RANGE), which failed min_cost_flow and the objects portfolio
    rows = [(i, i, i + (i * 7) % 4, 2**56 - 1 - (i * 104729) % 2**40) for i in range(120)]
    records = make_records(rows, alignment=1)
    for name in ("min_cost_flow", "best"):
        result = plan_objects(records, name)
        validate_plan(records, result)


def test_plan_of_a_file_as_model_points_at_records(tmp_path, capsys) -> None:
    path = _write(tmp_path, json.dumps(OK))
    err = _plan_error(capsys, [path])
    assert "--records" in err and "is a file" in err
