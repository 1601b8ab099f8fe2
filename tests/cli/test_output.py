"""Output people read: piped output is whole (no 80-column cut, no "…"), ``inspect``
explains its columns, and progress bars show on stderr where it is a terminal only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from layerfit.cli import app, main
from layerfit.store import prepare

LONG = (
    "transformer_decoder_stack.layer_zero.attention_query_projection_of_the_first_decoder_layer",
    "transformer_decoder_stack.layer_zero.attention_output_projection_of_the_first_decoder_layer",
)
TERMINAL_ENV = ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE", "TERMINAL_WIDTH")


@pytest.fixture(scope="module")
def long_names(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("output") / "long"
    prepare("tinymodels:long_names", out, input_shape=(1, 8))
    return out


@pytest.fixture()
def piped(monkeypatch: pytest.MonkeyPatch) -> None:
    """No terminal, and nothing in the environment that says there is one."""
    for name in TERMINAL_ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture()
def terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """TTY_COMPATIBLE=1: rich takes stdout and stderr for terminals (as under a real one)."""
    for name in TERMINAL_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TTY_COMPATIBLE", "1")


def layerfit_piped(*args: str, **env: str) -> subprocess.CompletedProcess:
    """``layerfit ARGS | ...`` in a fresh process, stdout and stderr pipes."""
    clean = {k: v for k, v in os.environ.items() if k not in TERMINAL_ENV}
    return subprocess.run([sys.executable, "-m", "layerfit.cli", *args], capture_output=True, text=True,
                          env={**clean, **env}, timeout=120, check=False)


def test_a_piped_table_prints_every_name_whole(long_names: Path) -> None:
    done = layerfit_piped("inspect", str(long_names))
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout
    for name in LONG:
        assert name in done.stdout
    # the summary lines are not wrapped at 80 columns either: one line each
    assert any(line.startswith("tinymodels:long_names input") and "minimum budget" in line
               for line in done.stdout.splitlines())


def test_columns_in_the_environment_is_the_width_and_cells_wrap_rather_than_end_in_an_ellipsis(
    long_names: Path,
) -> None:
    done = layerfit_piped("inspect", str(long_names), COLUMNS="60")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 60
    assert "…" not in done.stdout
    # the unit column's cells, read down the table, hold every name whole: folded, not cut
    units = "".join(line.split("│")[2].strip() for line in lines if line.startswith("│"))
    for name in LONG:
        assert name in units


def test_inspect_explains_its_columns_and_json_holds_no_legend(long_names: Path, piped, capsys) -> None:
    assert main(["inspect", str(long_names)]) == 0
    out = capsys.readouterr().out
    for column in ("#:", "bytes:", "offset:", "d: the unit's number of weight tensors", "MMACs: millions"):
        assert column in out
    assert "auto:" not in out  # the auto column is there with --budget only
    assert main(["inspect", str(long_names), "--budget", "100%"]) == 0
    assert "auto: with --budget" in capsys.readouterr().out
    assert main(["inspect", str(long_names), "--json"]) == 0
    out = capsys.readouterr().out
    json.loads(out)  # the output is the JSON document alone
    assert "MMACs" not in out
    assert main(["inspect", "--help"]) == 0
    assert "d: the unit's number of weight tensors" in " ".join(capsys.readouterr().out.split())


def test_no_bar_where_stderr_is_not_a_terminal(tmp_path: Path, piped, capsys) -> None:
    assert main(["prepare", "tinymodels:long_names", "-o", str(tmp_path / "m"), "--input-shape", "1,8"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.startswith("prepared tinymodels:long_names")


def test_a_bar_on_a_terminal_and_none_with_json(tmp_path: Path, terminal, capsys) -> None:
    assert main(["prepare", "tinymodels:long_names", "-o", str(tmp_path / "m"), "--input-shape", "1,8"]) == 0
    assert "preparing tinymodels:long_names" in capsys.readouterr().err
    argv = ["prepare", "tinymodels:long_names", "-o", str(tmp_path / "j"), "--input-shape", "1,8", "--json"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert json.loads(out)["units"] == 2


def test_the_delay_search_shows_a_bar_on_a_terminal_and_its_curve_either_way(long_names: Path, piped,
                                                                             monkeypatch, capsys) -> None:
    argv = ["tradeoff", "delay", str(long_names), "--step", "4KiB", "--repeats", "1", "--warmup", "0"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "minimal-delay search" not in err
    assert "8.2 kB" in out and "minimal delay:" in out
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "minimal-delay search" in err
    assert "minimal delay:" in out


def test_profile_shows_a_bar_on_a_terminal(long_names: Path, tmp_path: Path, terminal, capsys) -> None:
    argv = ["profile", str(long_names), "--profile", str(tmp_path / "p.json"), "--repeats", "1", "--warmup", "0"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "profiling models" in err
    assert "device profile written" in out


def _commands(group, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], list[str]]]:
    """Every command and group under ``group``: its words, and its options' names."""
    found = [(path, [o for p in group.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")])]
    for name, command in group.commands.items():
        if hasattr(command, "commands"):  # a group (typer may vendor its own click)
            found += _commands(command, (*path, name))
        else:
            options = [o for p in command.params if not getattr(p, "hidden", False)
                       for o in (*p.opts, *p.secondary_opts) if o.startswith("--")]
            found.append(((*path, name), options))
    return found


def test_every_help_names_every_option_whole_when_piped(piped, monkeypatch, capsys) -> None:
    import typer.rich_utils

    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", None)  # as a fresh process has it
    commands = _commands(typer.main.get_command(app))
    assert ("tradeoff", "delay") in [words for words, _ in commands]
    for words, options in commands:
        assert main([*words, "--help"]) == 0
        out = capsys.readouterr().out
        assert "Usage:" in out, words
        for option in options:  # at 80 columns typer cut them: "--cache-weig…"
            assert f"{option} " in out or f"{option}\n" in out, (words, option)
    main(["schedule"])  # a group alone prints its help (and exits 2, as click does): as wide
    assert max(map(len, capsys.readouterr().out.splitlines())) > 80


def test_track_gives_every_item_and_draws_only_on_a_terminal(piped, monkeypatch, capsys) -> None:
    from layerfit.console import track

    assert list(track(range(3), "counting")) == [0, 1, 2]
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    assert list(track(iter("ab"), "counting")) == ["a", "b"]  # no len: a bar without an end
    assert "counting" in capsys.readouterr().err
