"""`layerfit tradeoff parts`: constraints from the command line, JSON, exit codes."""

from __future__ import annotations

import json

import pytest

from layerfit.cli import main

from .single_thread import single_thread  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("single_thread")

APP = """
name: small
cnns:
  - name: net
    layers:
      - {name: x, op: input, shape: [1, 3, 32, 32]}
      - {name: c1, op: conv, shape: [1, 16, 32, 32], kernel: 3, padding: 1, params: 448, macs: 442368}
      - {name: r1, op: act, shape: [1, 16, 32, 32]}
      - {name: c2, op: conv, shape: [1, 16, 32, 32], kernel: 3, padding: 1, params: 2320, macs: 2359296}
      - {name: r2, op: act, shape: [1, 16, 32, 32]}
      - {name: gap, op: global_pool, shape: [1, 16, 1, 1]}
      - {name: fc, op: fc, shape: [1, 10], params: 170}
"""

ARGS = ["--model-throughput", "--generations", "5", "--population", "8"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_parts_command_json(tmp_path, capsys):
    path = tmp_path / "app.yaml"
    path.write_text(APP)
    code, out, _ = run(capsys, "tradeoff", "parts", str(path), "--budget", "120kB", "--json", *ARGS)
    assert code == 0
    data = json.loads(out)
    assert data["feasible"] and not data["early_exit"]
    assert data["chosen"]["memory_bytes"] <= 120_000 and data["chosen"]["by_parts"]
    assert set(data["baselines"]) == {"no_reduction", "reuse_only", "all_parts", "all_parts_reuse"}
    # taller phases: fewer, larger steps - more buffer memory, less per-phase overhead
    code, out, _ = run(capsys, "tradeoff", "parts", str(path), "--budget", "10MB", "--json", "--phase-rows", "4", *ARGS)
    tall = json.loads(out)["baselines"]["all_parts"]
    assert code == 0 and tall["buffer_bytes"] > data["baselines"]["all_parts"]["buffer_bytes"]
    assert tall["throughput_fps"]["net"] > data["baselines"]["all_parts"]["throughput_fps"]["net"]


def test_parts_command_table_early_exit_and_plot(tmp_path, capsys, monkeypatch):
    path = tmp_path / "app.yaml"
    path.write_text(APP)
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "tradeoff", "parts", str(path), "--budget", "10MB", "--plot", *ARGS)
    assert code == 0 and "buffer reuse alone fits" in out
    plot = (tmp_path / "app-pareto.png").read_bytes()
    assert plot
    # a second run keeps the first plot unless asked to replace it
    code, out, err = run(capsys, "tradeoff", "parts", str(path), "--budget", "10MB", "--plot", *ARGS)
    assert code == 2 and out == "" and "app-pareto.png already exists (pass --force" in err
    assert (tmp_path / "app-pareto.png").read_bytes() == plot
    code, _, _ = run(capsys, "tradeoff", "parts", str(path), "--budget", "10MB", "--plot", "--force", *ARGS)
    assert code == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["app-pareto.png", "app.yaml"]


def test_unsatisfiable_constraints_print_the_front_and_fail(tmp_path, capsys):
    path = tmp_path / "app.yaml"
    path.write_text(APP)
    code, out, err = run(capsys, "tradeoff", "parts", str(path), "--budget", "1kB", "--json", *ARGS)
    assert code == 2
    data = json.loads(out)
    assert not data["feasible"] and data["pareto"]
    assert data["violations"][0]["constraint"] == "memory" and data["violations"][0]["gap"] > 0
    assert "memory <= 1.0 kB cannot be met" in err and "over" in err
    code, out, err = run(capsys, "tradeoff", "parts", str(path), "--budget", "1MB", "--throughput", "1e9", *ARGS)
    assert code == 2 and "throughput of net >= 1000000000.0 fps cannot be met" in err


def test_bad_input_is_a_clean_error(tmp_path, capsys):
    path = tmp_path / "app.yaml"
    path.write_text(APP.replace("kernel: 3, padding: 1, params: 448", "kernel: three, padding: 1, params: 448"))
    code, _, err = run(capsys, "tradeoff", "parts", str(path), "--budget", "1MB", *ARGS)
    assert code == 2 and "cnns[0].layers[1].kernel" in err
    path.write_text(APP)
    code, _, err = run(capsys, "tradeoff", "parts", str(path), "--budget", "lots", *ARGS)
    assert code == 2 and "--budget" in err
    code, _, err = run(capsys, "tradeoff", "parts", str(path), *ARGS)
    assert code == 2 and "no memory constraint" in err
    code, _, err = run(capsys, "tradeoff", "parts", str(path), "--budget", "1MB", "--throughput", "x=3", *ARGS)
    assert code == 2 and "unknown CNN" in err


@pytest.mark.parametrize("value", ["nan", "inf", "net=nan", "net=-inf"])
def test_non_finite_throughput_option_is_refused(tmp_path, capsys, value):
    path = tmp_path / "app.yaml"
    path.write_text(APP)
    code, out, err = run(capsys, "tradeoff", "parts", str(path), "--budget", "1MB", "--throughput", value, "--json", *ARGS)
    assert code == 2 and out == ""
    assert "--throughput" in err and "finite number of frames per second >= 0" in err


def test_plot_over_a_directory_fails_before_the_search(tmp_path, capsys, monkeypatch):
    import layerfit.cli.parts_search as cli_support

    path = tmp_path / "app.yaml"
    path.write_text(APP)
    (tmp_path / "app-pareto.png").mkdir()
    (tmp_path / "app-pareto.png" / "keep.txt").write_text("mine")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli_support, "reduce_buffers", lambda *a, **k: pytest.fail("searched before checking --plot"))
    code, out, err = run(capsys, "tradeoff", "parts", str(path), "--budget", "1MB", "--plot", *ARGS)
    assert code == 2 and "app-pareto.png" in err and "is a directory" in err and "Traceback" not in err
    assert (tmp_path / "app-pareto.png" / "keep.txt").read_text() == "mine"


def test_the_ga_shows_its_generations_on_a_terminal_and_nothing_piped_or_with_json(tmp_path, capsys, monkeypatch):
    path = tmp_path / "app.yaml"
    path.write_text(APP)
    for name in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE", "TERMINAL_WIDTH"):
        monkeypatch.delenv(name, raising=False)
    code, out, err = run(capsys, "tradeoff", "parts", str(path), "--budget", "120kB", *ARGS)
    assert code == 0 and "GA generations" not in err and "memory-throughput trade-off" in out
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich takes stderr for a terminal
    code, out, err = run(capsys, "tradeoff", "parts", str(path), "--budget", "120kB", *ARGS)
    assert code == 0 and "GA generations" in err
    code, out, err = run(capsys, "tradeoff", "parts", str(path), "--budget", "120kB", "--json", *ARGS)
    assert code == 0 and err == "" and json.loads(out)["feasible"]
