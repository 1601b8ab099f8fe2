"""The ``layerfit`` entry point: how it prints errors and ``--json`` output."""

from __future__ import annotations

import json
import math

import pytest

from layerfit import strict_json
from layerfit.cli import main, print_json


def _refuse_constant(name: str) -> None:
    raise AssertionError(f"not strict JSON: {name}")


def test_an_error_message_is_printed_whole_even_with_brackets(tmp_path, capsys):
    # rich reads "[such]" as a style tag and drops it unless the message is escaped
    missing = tmp_path / "no[such]dir"
    assert main(["inspect", str(missing)]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err.replace("\n", "")
    assert "Traceback" not in err


def test_json_output_is_strict_with_no_figure_for_a_missing_value(capsys):
    print_json({"mean": math.nan, "ratios": [1.5, math.inf, -math.inf], "nested": ({"x": 2.0},)})
    out = capsys.readouterr().out
    assert json.loads(out, parse_constant=_refuse_constant) == {
        "mean": None,
        "ratios": [1.5, None, None],
        "nested": [{"x": 2.0}],
    }


@pytest.mark.parametrize("value", [math.nan, math.inf, [math.nan], {"a": -math.inf}])
def test_strict_json_never_writes_a_bare_nan(value):
    text = strict_json.dumps(value)
    json.loads(text, parse_constant=_refuse_constant)
    assert "NaN" not in text and "Infinity" not in text


def test_a_budget_is_budget_everywhere_and_the_old_names_warn_once(tmp_path, capsys) -> None:
    """serve, schedule run and tradeoff parts took --memory-budget / --memory: still read,
    with one warning each, and refused beside --budget."""
    from layerfit.cli.app import _WARNED

    _WARNED.clear()
    workload = tmp_path / "w.yaml"
    assert main(["schedule", "generate", "small-3", "-o", str(workload)]) == 0
    capsys.readouterr()
    for flag, warns in (("--budget", False), ("--memory", True), ("--memory", False)):  # once per process
        assert main(["schedule", "run", "--workload", str(workload), flag, "2GB", "--simulate", "--json"]) == 0
        assert ("warning: --memory is now --budget" in capsys.readouterr().err) == warns
    assert main(["schedule", "run", "--workload", str(workload), "--budget", "2GB", "--memory", "1GB", "--simulate"]) == 2
    assert "--memory is the old name of --budget: give --budget only" in capsys.readouterr().err
    assert main(["serve", "--repository", str(tmp_path / "none"), "--memory-budget", "1GB"]) == 2
    err = capsys.readouterr().err
    assert "warning: --memory-budget is now --budget" in err and "is not a directory" in err


def test_help_lists_the_commands_in_order() -> None:
    """Registration order is ``layerfit --help``'s: the commands on one model from its
    folder to its outputs, ``generate`` right after ``run``, then the groups."""
    import click
    import typer

    from layerfit.cli import app

    group = typer.main.get_command(app)
    assert group.list_commands(click.Context(group)) == [
        "serve", "zoo", "plan", "profile", "partition", "prepare", "inspect", "verify", "run", "generate",
        "plot-trace", "schedule", "tradeoff",
    ]
