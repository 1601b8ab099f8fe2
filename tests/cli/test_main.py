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
