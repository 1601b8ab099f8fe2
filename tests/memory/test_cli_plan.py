"""``layerfit plan``: records files, zoo models, JSON output and clear errors."""

from __future__ import annotations

import json

from layerfit.cli import main

COMPLEX = [
    (32, 0, 1), (32, 1, 4), (8, 2, 5), (16, 3, 5), (8, 4, 5), (64, 5, 7), (8, 6, 8), (8, 7, 8), (16, 8, 9),
]  # fmt: skip


def _records_file(tmp_path):
    path = tmp_path / "records.json"
    rows = [
        {"id": i, "first_op": f, "last_op": last, "size": s}
        for i, (s, f, last) in enumerate(COMPLEX)
    ]
    path.write_text(json.dumps(rows))
    return str(path)


def test_plan_records_json_has_totals_bounds_and_assignments(tmp_path, capsys) -> None:
    path = _records_file(tmp_path)
    assert main(["plan", "--records", path, "--align", "1", "--json", "--time-limit", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    objects = report["approaches"]["objects"]
    offsets = report["approaches"]["offsets"]
    assert (
        objects["lower_bound"] == 112 and offsets["lower_bound"] == 96 and offsets["naive"] == 192
    )
    by_name = {row["strategy"]: row for row in offsets["strategies"]}
    assert by_name["greedy_by_size"]["assignment"] == {
        str(i): o for i, o in enumerate([0, 32, 80, 64, 88, 0, 64, 72, 0])
    }
    assert by_name["cpsat"]["status"] == "optimal" and by_name["best"]["total"] == 96
    assert {row["strategy"] for row in objects["strategies"]} >= {
        "greedy_by_size_improved",
        "min_cost_flow",
    }


def test_plan_table_for_one_strategy(tmp_path, capsys) -> None:
    path = _records_file(tmp_path)
    assert (
        main(["plan", "--records", path, "--approach", "offsets", "--strategy", "strip_packing"])
        == 0
    )
    out = capsys.readouterr().out
    assert "strip_packing" in out and "lower bound" in out and "naive" in out


def test_plan_errors_are_one_line_and_exit_2(tmp_path, capsys) -> None:
    path = _records_file(tmp_path)
    assert main(["plan", "--records", path, "--strategy", "magic"]) == 2
    assert "valid names" in capsys.readouterr().err
    assert main(["plan"]) == 2
    assert "either a MODEL" in capsys.readouterr().err
    assert main(["plan", "--records", str(tmp_path / "nope.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"id": 1, "first_op": 3, "last_op": 1, "size": 8}]))
    assert main(["plan", "--records", str(bad)]) == 2
    assert "record 1" in capsys.readouterr().err
    assert main(["plan", "no_such_net"]) == 2
    assert "unknown model" in capsys.readouterr().err


def test_plan_zoo_model_with_searched_order(capsys) -> None:
    argv = [
        "plan",
        "mobilenet_v1_025",
        "--approach",
        "offsets",
        "--strategy",
        "greedy_by_size,best",
    ]
    assert main([*argv, "--order", "searched", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    part = report["approaches"]["offsets"]
    assert part["strategies"][0]["total"] >= part["lower_bound"] > 0
    assert report["order_search"]["peak"] <= report["order_search"]["captured_peak"]
    buffers = {str(r["strategy"]): r for r in part["strategies"]}["best"]["assignment"]
    assert set(report["buffer_of_tensor"].values()) == {int(b) for b in buffers}


def test_plan_a_prepared_model_as_the_engine_plans_it(tmp_path, capsys) -> None:
    from layerfit.engine.arena import plan_activations
    from layerfit.store import prepare, read_manifest

    directory = tmp_path / "mnv1"
    prepare("mobilenet_v1_025", directory, input_shape=(1, 3, 32, 32))
    argv = ["plan", str(directory), "--approach", "offsets", "--strategy", "best", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    best = report["approaches"]["offsets"]["strategies"][0]
    assert best["total"] == plan_activations(read_manifest(directory).graph).arena_bytes > 0
    # the prepared shape is the one planned; another needs another prepare
    assert main([*argv, "--input-shape", "1,3,64,64"]) == 2
    assert "prepared for one input shape" in capsys.readouterr().err


def test_plan_a_zoo_model_at_another_input_shape(capsys) -> None:
    argv = ["plan", "mobilenet_v1_025", "--approach", "offsets", "--strategy", "best", "--json"]
    totals = []
    for shape in ("1,3,32,32", "1,3,64,64"):
        assert main([*argv, "--input-shape", shape]) == 0
        totals.append(json.loads(capsys.readouterr().out)["approaches"]["offsets"]["lower_bound"])
    assert 0 < totals[0] < totals[1]  # four times the pixels, larger activations
    assert main([*argv, "--input-shape", "1,3"]) == 2
    assert "fails on the example input" in capsys.readouterr().err
    assert main(["plan", "missing/model"]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert main(["plan", "--records", "r.json", "--input-shape", "1,3,8,8"]) == 2
    assert "--input-shape applies to a zoo MODEL" in capsys.readouterr().err
