"""``layerfit zoo``."""

from __future__ import annotations

import json

import pytest

from layerfit import zoo
from layerfit.cli import main


def test_zoo_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["zoo", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == zoo.names()
    by_name = {r["name"]: r for r in rows}
    assert by_name["resnet152"]["params"] == 60_192_808
    assert by_name["yolov4"]["input_shape"] == [1, 3, 608, 608]
    assert by_name["vgg19"]["param_mb"] == pytest.approx(574.67, abs=0.01)
    assert {"name", "params", "param_mb", "input_shape"} <= set(rows[0])


def test_zoo_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["zoo"]) == 0
    out = capsys.readouterr().out
    assert "resnet152" in out and "60,192,808" in out and "1x3x608x608" in out
