"""Minimal-delay search: walks budgets from 2x the largest unit up, picks per phase 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from layerfit.cli import main
from layerfit.engine import load
from layerfit.errors import LayerfitError
from layerfit.store import example_input, prepare, read_manifest
from layerfit.tradeoff.delay import minimal_delay_search


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("d") / "tiny"
    prepare("tinymodels:tiny_cnn", out, input_shape=(1, 3, 16, 16))
    return out


@pytest.mark.parametrize("stages", [2, 3])
def test_search_covers_start_to_model_size_and_applies_phase_two(tiny: Path, stages: int):
    x = example_input((1, 3, 16, 16))
    with load(tiny, pipeline="async", stages=stages) as engine:
        curve = minimal_delay_search(engine, (x,), step=4096, repeats=2, warmup=0)
        mem = engine.memory
    budgets = [p.budget_bytes for p in curve.points]
    assert budgets[0] == 2 * mem.largest_unit_bytes  # three stages: a read and a device buffer of it
    # the last point holds the whole model in each buffer: one, or a read and a device one
    assert budgets[-1] == mem.total_weight_bytes * (stages - 1)
    assert budgets == sorted(budgets) and len(set(budgets)) == len(budgets)
    for p in curve.points:
        assert p.min_s <= p.median_s <= p.max_s
        assert p.weights_peak_bytes <= p.budget_bytes
    minimum = min(p.mean_s for p in curve.points)
    first = next(p for p in curve.points if p.mean_s <= minimum * (1 + curve.tolerance))
    assert curve.minimal == first


def test_patience_stops_phase_one_early(tiny: Path):
    x = example_input((1, 3, 16, 16))
    with load(tiny, pipeline="async") as engine:
        curve = minimal_delay_search(engine, (x,), step=4096, repeats=1, warmup=0, patience=0)
    assert len(curve.points) == 1


def test_search_refuses_fixed_buffer_pipelines(tiny: Path):
    with load(tiny, pipeline="sync") as engine, pytest.raises(LayerfitError, match="async"):
        minimal_delay_search(engine, (example_input((1, 3, 16, 16)),))


def test_search_with_auto_runs_from_async_minimum_to_every_weight_resident(tiny: Path):
    m = read_manifest(tiny)
    x = example_input((1, 3, 16, 16))
    with load(tiny, pipeline="auto") as engine:
        curve = minimal_delay_search(engine, (x,), step=4096, repeats=1, warmup=0)
        assert (engine.pipeline, engine.policy.name) == ("auto", "preload")  # the last point holds them all
    budgets = [p.budget_bytes for p in curve.points]
    assert curve.pipeline == "auto"
    assert budgets[0] == 2 * m.largest_unit_bytes and budgets[-1] == m.total_bytes
    assert all(p.weights_peak_bytes <= p.budget_bytes for p in curve.points)
    with load(tiny, pipeline="auto", stages=3) as engine:  # one buffer holds it all from the model's size on
        curve = minimal_delay_search(engine, (x,), step=4096, repeats=1, warmup=0)
    assert curve.points[-1].budget_bytes == m.total_bytes


@pytest.mark.parametrize("pipeline", ["async", "auto"])
def test_search_stops_where_the_units_fit_beside_the_resident_tensors(tmp_path: Path, pipeline: str):
    # tied_lm keeps its tied embedding and position table resident: the last point is
    # every weight once, not the resident bytes counted twice.
    m = prepare("tinymodels:tied_lm", tmp_path / "lm", input_shape=(1, 8), input_dtype="int64")
    assert m.resident_bytes > 0
    with load(tmp_path / "lm", pipeline=pipeline) as engine:
        curve = minimal_delay_search(engine, (example_input((1, 8), "int64"),), step=4096, repeats=1, warmup=0)
    assert curve.points[-1].budget_bytes == m.total_bytes


def test_cli_writes_json_and_plot(tiny: Path, tmp_path: Path, capsys):
    png = tmp_path / "curve.png"
    assert main(["tradeoff", "delay", str(tiny), "--step", "16KiB", "--repeats", "1", "--warmup", "0", "--json", "--plot", str(png)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["minimal"]["budget_bytes"] in [p["budget_bytes"] for p in data["points"]]
    assert data["preload_s"] > 0
    assert png.stat().st_size > 1000


def test_cli_steps_by_a_share_of_the_weights(tiny: Path, capsys):
    total = read_manifest(tiny).total_bytes
    argv = ["tradeoff", "delay", str(tiny), "--step", "5%", "--until", "95%", "--repeats", "1", "--warmup", "0", "--json"]
    assert main(argv) == 0
    budgets = [p["budget_bytes"] for p in json.loads(capsys.readouterr().out)["points"]]
    steps = {b - a for a, b in zip(budgets[:-1], budgets[1:-1], strict=False)}
    assert len(budgets) >= 3 and steps == {total * 5 // 100} and budgets[-1] == total * 95 // 100  # clamped
    assert main(["tradeoff", "delay", str(tiny), "--step", "a quarter"]) == 2
    assert "e.g. 50%" in capsys.readouterr().err


def test_reference_scores_points_by_relative_delay(tiny: Path, monkeypatch):
    import layerfit.tradeoff.delay as delay

    x = example_input((1, 3, 16, 16))
    calls: list[str] = []
    real = delay.timed_call

    def spy(engine, inputs, keywords=None):
        calls.append(engine.policy.name)
        return real(engine, inputs, keywords)

    monkeypatch.setattr(delay, "timed_call", spy)
    with load(tiny, pipeline="preload") as pre, load(tiny, pipeline="async") as engine:
        curve = minimal_delay_search(engine, (x,), step=4096, repeats=2, warmup=0, reference=pre)
    # every measurement of the searched engine follows one of the reference
    assert calls == ["preload", "async"] * (2 * len(curve.points))
    for p in curve.points:
        assert p.relative is not None and p.relative > 0 and p.score == p.relative
    minimum = min(p.relative for p in curve.points)
    assert curve.minimal == next(p for p in curve.points if p.relative <= minimum * (1 + curve.tolerance))


@pytest.mark.parametrize(("tolerance", "patience"), [(float("nan"), None), (-0.5, None), (float("inf"), None), (0.01, -1)])
def test_search_refuses_nonsense_tolerance_and_patience(tiny: Path, tolerance: float, patience: int | None):
    x = example_input((1, 3, 16, 16))
    with load(tiny, pipeline="async") as engine, pytest.raises(LayerfitError, match="tolerance|patience"):
        minimal_delay_search(engine, (x,), step=4096, repeats=1, warmup=0, tolerance=tolerance, patience=patience)


@pytest.mark.parametrize("option", [["--tolerance", "nan"], ["--tolerance", "-1"], ["--patience", "-2"]])
def test_cli_bad_search_options_are_one_line_errors(tiny: Path, capsys, option: list[str]):
    code = main(["tradeoff", "delay", str(tiny), "--step", "16KiB", "--repeats", "1", "--warmup", "0", "--json", *option])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and option[0][2:] in err and "Traceback" not in err


@pytest.mark.parametrize(("name", "message"), [
    ("adir", "is a directory"),
    ("missing/curve.png", "does not exist"),
    ("curve.xyz", "'.xyz', which matplotlib does not write"),
    ("curve", "no extension"),
])
def test_cli_checks_the_plot_path_before_searching(tiny: Path, tmp_path: Path, capsys, monkeypatch, name, message):
    import layerfit.tradeoff.delay as delay

    (tmp_path / "adir").mkdir()
    monkeypatch.setattr(delay, "minimal_delay_search", lambda *a, **k: pytest.fail("searched before checking --plot"))
    code = main(["tradeoff", "delay", str(tiny), "--plot", str(tmp_path / name)])
    err = capsys.readouterr().err
    assert code == 2 and "--plot" in err and message in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"]  # nothing written


def test_cli_plot_format_follows_the_extension(tiny: Path, tmp_path: Path, capsys):
    svg = tmp_path / "curve.svg"
    argv = ["tradeoff", "delay", str(tiny), "--step", "64KiB", "--repeats", "1", "--warmup", "0", "--json", "--plot", str(svg)]
    assert main(argv) == 0
    capsys.readouterr()
    assert svg.read_text().lstrip().startswith("<?xml")
    assert [p.name for p in tmp_path.iterdir()] == ["curve.svg"]  # no temporary file left
    before = svg.read_bytes()
    assert main(argv) == 2  # an existing plot is replaced only with --force
    assert "curve.svg already exists (pass --force" in capsys.readouterr().err and svg.read_bytes() == before
    assert main([*argv, "--force"]) == 0


def test_cli_searches_a_model_prepared_from_keyword_arguments(tmp_path: Path, capsys):
    import torch

    example = {"input_features": torch.randn(1, 8, 32), "decoder_input_ids": torch.tensor([[0, 5]])}
    m = prepare("tinymodels:tiny_whisper", tmp_path / "w", example=example)
    argv = ["tradeoff", "delay", str(tmp_path / "w"), "--step", "25%", "--repeats", "1", "--warmup", "0", "--json"]
    assert main(argv) == 0, capsys.readouterr().err
    data = json.loads(capsys.readouterr().out)
    assert data["points"][-1]["budget_bytes"] == m.total_bytes and data["preload_s"] > 0
