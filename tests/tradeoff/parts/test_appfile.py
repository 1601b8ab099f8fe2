"""Application files: loading, and errors that name the malformed field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from layerfit.errors import TradeoffError
from layerfit.tradeoff.parts.appfile import application_from_dict, load_application

from .single_thread import single_thread  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("single_thread")

PAPER_APP = """
name: adaptive-classification
precision: fp32
fanout: edge
cnns:
  - name: cnn1
    layers:
      - {name: l1, op: input, shape: [1, 3, 32, 32]}
      - {name: l2, op: conv, shape: [1, 8, 32, 32], kernel: 5, padding: 2, params: [[8, 3, 5, 5], [8]]}
      - {name: l3, op: conv, shape: [1, 8, 32, 32], kernel: 3, padding: 1, params: 584}
      - {name: l4, op: concat, inputs: [l2, l3], shape: [1, 16, 32, 32]}
      - {name: l5, op: fc, shape: [1, 10], params: 163850}
  - name: cnn2
    layers:
      - {name: l1, op: input, shape: [1, 3, 32, 32]}
      - {name: l2, op: conv, shape: [1, 8, 28, 28], kernel: 5, params: 608}
      - {name: l3, op: fc, shape: [1, 10], params: 62730}
      - {name: l4, op: softmax, shape: [1, 10]}
    partitions: [[l1, l2], [2, 3]]
constraints: {memory: 1MB, throughput: {cnn1: 5}}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "app.yaml"
    path.write_text(text)
    return path


def test_load_paper_application(tmp_path):
    app, constraints = load_application(write(tmp_path, PAPER_APP))
    assert [c.name for c in app.cnns] == ["cnn1", "cnn2"]
    assert [p.name for p in app.partitions] == ["cnn1.p0", "cnn2.p0", "cnn2.p1"]
    assert app.is_parallel("cnn2.p0", "cnn2.p1")  # default: a split CNN is pipelined
    assert constraints.memory == 1_000_000 and constraints.throughput == {"cnn1": 5.0}
    assert app.cnns[0].layers[1].params == 608
    assert sum(b.size for b in app.derive(order="paper").buffers) == 32_778


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(precision="fp8"), "precision"),
        (lambda d: d.update(colour="red"), r"^colour: unknown field; known: cnns, constraints"),
        (lambda d: d.pop("cnns"), "cnns"),
        (lambda d: d["cnns"][0]["layers"][1].update(kernel="x"), r"cnns\[0\]\.layers\[1\]\.kernel"),
        (lambda d: d["cnns"][0]["layers"][1].update(shape=[1, -8]), r"cnns\[0\]\.layers\[1\]\.shape"),
        (lambda d: d["cnns"][0]["layers"][2].update(op="lstm"), r"cnns\[0\]\.layers\[2\]\.op"),
        (lambda d: d["cnns"][0]["layers"][3].update(inputs=["nope"]), r"cnns\[0\]\.layers.*'nope'"),
        (lambda d: d["cnns"][0]["layers"][1].update(params=[[8, "a"]]), r"layers\[1\]\.params"),
        (lambda d: d["cnns"][1].update(partitions=[[0, 1], [3, 3]]), "must start at layer 2"),
        (lambda d: d["cnns"][1].update(partitions=[[0, 9]]), r"cnns\[1\]\.partitions\[0\]"),
        (lambda d: d["cnns"][1].update(partitions=0), r"cnns\[1\]\.partitions"),
        (lambda d: d["cnns"][1].update(model="mobilenet_v2"), "exactly one of"),
        (lambda d: d.update(parallel=[["cnn2.p0", "cnn9.p0"]]), r"parallel\[0\]"),
        (lambda d: d.update(parallel="all"), "parallel"),
        (lambda d: d.update(constraints={"memory": "lots"}), "constraints.memory"),
        (lambda d: d.update(constraints={"throughput": {"cnn7": 3}}), "constraints.throughput.cnn7"),
        (lambda d: d.update(schedules={"cnn1.p0": "l1"}), r"schedules\[cnn1.p0\]"),
        (lambda d: d["cnns"][0].update(name="a.b"), r"cnns\[0\]\.name"),
    ],
)
def test_malformed_application_names_the_field(edit, message):
    data = yaml.safe_load(PAPER_APP)
    edit(data)
    with pytest.raises(TradeoffError, match=message):
        application_from_dict(data)


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(TradeoffError, match="cannot read"):
        load_application(tmp_path / "missing.yaml")
    with pytest.raises(TradeoffError, match=r"app\.yaml, line 2: not valid YAML") as info:
        load_application(write(tmp_path, "cnns: [\n"))
    assert "\n" not in str(info.value)
    with pytest.raises(TradeoffError, match=r"app\.yaml, line 2: 'name': appears twice in the same mapping"):
        load_application(write(tmp_path, "name: a\nname: b\ncnns: []\n"))
    with pytest.raises(TradeoffError, match=r"app\.yaml, line 1: cnns: expected a non-empty list"):
        load_application(write(tmp_path, "cnns: []\n"))


def test_zoo_model_entry(tmp_path):
    text = """
cnns:
  - name: mb
    model: mobilenet_v1_025
    input: [1, 3, 32, 32]
    partitions: 2
"""
    app, constraints = load_application(write(tmp_path, text))
    cnn = app.cnns[0]
    assert cnn.runner is not None and len(cnn.layers) > 20
    assert len(app.partitions) == 2 and constraints.memory is None
    with pytest.raises(TradeoffError, match=r"cnns\[0\]\.model"):
        application_from_dict({"cnns": [{"name": "x", "model": "mobilenet_v9"}]})


@pytest.mark.parametrize(
    "throughput",
    [float("nan"), float("inf"), -1, {"cnn1": float("nan")}, {"cnn1": float("-inf")}, pytest.param(10**400, id="1e400")],
)
def test_non_finite_or_negative_throughput_constraint_is_refused(throughput):
    data = yaml.safe_load(PAPER_APP)
    data["constraints"] = {"throughput": throughput}
    with pytest.raises(TradeoffError, match=r"constraints\.throughput.*finite number of frames per second >= 0"):
        application_from_dict(data)


def test_yaml_nan_throughput_in_a_file_is_refused(tmp_path):
    text = PAPER_APP.replace("throughput: {cnn1: 5}", "throughput: {cnn1: .nan}")
    with pytest.raises(TradeoffError, match=r"app\.yaml, line \d+: constraints\.throughput\.cnn1"):
        load_application(write(tmp_path, text))


def test_binary_application_file_is_a_clean_error(tmp_path):
    path = tmp_path / "app.yaml"
    path.write_bytes(b"\xff\xfe\x00\x00binary")
    with pytest.raises(TradeoffError, match="app.yaml: not a text file"):
        load_application(path)


def test_errors_give_the_line_of_the_field(tmp_path):
    text = PAPER_APP.replace("kernel: 3, padding: 1, params: 584", "kernel: three, padding: 1, params: 584")
    with pytest.raises(TradeoffError, match=r"app\.yaml, line 10: cnns\[0\]\.layers\[2\]\.kernel: "):
        load_application(write(tmp_path, text))
    text = PAPER_APP.replace("partitions: [[l1, l2], [2, 3]]", "partitions: [[l1, l2], [2, 9]]")
    with pytest.raises(TradeoffError, match=r"app\.yaml, line 19: cnns\[1\]\.partitions\[1\]: "):
        load_application(write(tmp_path, text))


def test_messages_survive_the_cli_console(tmp_path, capsys):
    """The CLI prints errors through rich: `[word, ...]` in a message would vanish as markup."""
    from layerfit.cli import main

    text = "cnns:\n  - name: a\n    model: mobilenet_v1_025\n    input: [1, 3, 32]\n"
    assert main(["tradeoff", "parts", str(write(tmp_path, text)), "--budget", "1MB"]) == 2
    assert "line 4: cnns[0].input: expected four positive integers (batch, channels, height, width), got [1, 3, 32]" in capsys.readouterr().err
