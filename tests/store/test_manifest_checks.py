"""A manifest edited by hand, or a damaged weights header, is refused with one clear line.

Before these checks such edits gave tracebacks (KeyError, AttributeError, RuntimeError
from the ring) or, worse, an output that was not ``model(x)`` (NaN from a tensor left on
the meta device, a tensor read from another tensor's bytes).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import tinymodels
import torch

from layerfit.cli import main
from layerfit.engine import load
from layerfit.errors import CorruptStoreError, FactoryImportError, ManifestError
from layerfit.store import example_input, prepare, read_manifest

TINY = "tinymodels:tiny_cnn"
SHAPE = (1, 3, 16, 16)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("m") / "tiny"
    prepare(TINY, out, input_shape=SHAPE)
    return out


@pytest.fixture()
def tiny(pristine: Path, tmp_path: Path) -> Path:
    out = tmp_path / "tiny"
    out.mkdir()
    for f in pristine.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    return out


def _edit(directory: Path, change: Callable[[dict], None]) -> None:
    path = directory / "manifest.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _tensor(data: dict, unit: int, name: str) -> dict:
    return next(t for t in data["units"][unit]["tensors"] if t["name"] == name)


def _swap_offsets(data: dict) -> None:  # bn1: weight and bias have the same size
    w, b = _tensor(data, 1, "bn1.weight"), _tensor(data, 1, "bn1.bias")
    w["offset"], b["offset"] = b["offset"], w["offset"]


EDITS: dict[str, tuple[Callable[[dict], None], str]] = {
    "tensor bound nowhere": (lambda d: d["units"][0]["tensors"][0].update(places=[]), "bound nowhere"),
    "tensor offsets swapped": (_swap_offsets, "disagree about tensor 'bn1.weight'"),
    "tensor outside its segment": (lambda d: d["units"][0]["tensors"][0].update(offset=4000), "outside the segment"),
    "unknown tensor dtype": (lambda d: d["units"][0]["tensors"][0].update(dtype="foo"), "dtype 'foo'"),
    "unit dropped": (lambda d: d["units"].pop(2), "not the captured ones"),
    "units swapped": (lambda d: d["units"].reverse(), "not the captured ones"),
    "unit renamed": (lambda d: d["units"][0].update(name="nosuch"), "not the captured ones"),
    "graph not an object": (lambda d: d.update(graph="x"), "graph is not a JSON object"),
    "negative input dimension": (lambda d: d["input"].update(shape=[1, -3, 16, 16]), "dimension below 1"),
    "input dtype changed": (lambda d: d["input"].update(dtype="int64"), "differs from the captured input"),
    "unaligned segment": (lambda d: d["units"][0].update(offset=4097), "4096-byte boundaries"),
    "segment past the end": (lambda d: d["units"][0].update(offset=4096 * 1000), "within the"),
    "place bound twice": (lambda d: d["units"][0]["tensors"][0].update(places=["conv2.weight"]), "bound to both"),
    "input keyword of an unknown dtype": (
        lambda d: d["input"].update(keywords=[{"name": "x", "shape": [1, 3, 16, 16], "dtype": "complex64"}]),
        "input keyword's dtype",
    ),
    "input keyword without a shape": (lambda d: d["input"].update(keywords=[{"name": "x"}]), "KeyError: 'shape'"),
    "negative pass peak": (lambda d: d["graph"].update(pass_peak_bytes=-1), "negative number of bytes"),
    "pass peak not a number": (lambda d: d["graph"].update(pass_peak_bytes="lots"), "ValueError"),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_hand_edited_manifest_is_refused_not_run(tiny: Path, edit: str, capsys):
    change, message = EDITS[edit]
    _edit(tiny, change)
    with pytest.raises(ManifestError, match=message):
        read_manifest(tiny)
    for command in (["inspect"], ["verify"], ["run"], ["run", "--pipeline", "async", "--budget", "30kB"]):
        assert main([command[0], str(tiny), *command[1:]]) == 2, command
        err = capsys.readouterr().err
        assert "error:" in err and "Traceback" not in err
        assert "prepare the model again" in err


def test_unedited_manifest_still_runs_bit_identically(tiny: Path):
    x = example_input(SHAPE)
    with torch.no_grad():
        y = tinymodels.tiny_cnn().eval()(x)
    with load(tiny, pipeline="async", budget="30kB") as engine:
        assert torch.equal(engine(x), y)


def test_factory_arguments_edited_in_the_manifest(tiny: Path, capsys):
    _edit(tiny, lambda d: d["model"].update(kwargs={"zz": 1}))
    with pytest.raises(FactoryImportError, match="unexpected keyword argument 'zz'"):
        load(tiny)
    assert main(["run", str(tiny)]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_factory_that_gained_a_layer_since_prepare_is_refused(tiny: Path):
    """The factory now builds one more layer than was stored: left on the meta device it
    ran as garbage (a CPU conv2d reads a meta weight as uninitialised memory) and the
    output, 1e31-sized values, was returned as the model's."""
    _edit(tiny, lambda d: d["model"].update(name="tinymodels:scaled_tiny_cnn"))
    with pytest.raises(ManifestError, match="stores no weights for pre.weight, pre.bias"):
        load(tiny, pipeline="preload")


def test_damaged_safetensors_header_fails_verify(tiny: Path, capsys):
    path = tiny / "weights.safetensors"
    data = bytearray(path.read_bytes())
    data[8:9] = b"#"  # the first byte of the JSON header
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptStoreError, match="corrupt safetensors header"):
        read_manifest(tiny)
    assert main(["verify", str(tiny)]) == 2
    assert "corrupt safetensors header" in capsys.readouterr().err


def test_a_raw_hugging_face_folder_says_to_prepare_it(tmp_path: Path, capsys):
    """run, inspect and layerfit.load on a Hugging Face folder as published (config.json,
    its weights, no manifest.json) said only "manifest.json is missing: ... is not a
    prepared model"; they say what it is and the command to run, worded as generate's."""
    raw = tmp_path / "gpt2-raw"
    raw.mkdir()
    (raw / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    (raw / "model.safetensors").write_bytes(b"\0" * 16)
    hint = f"{raw} is a Hugging Face model folder, not a prepared model: run `layerfit prepare hf:{raw} -o OUT`"
    with pytest.raises(ManifestError) as refused:
        read_manifest(raw)
    assert str(refused.value) == f"{raw / 'manifest.json'} is missing: {hint}"
    with pytest.raises(ManifestError, match=f"run `layerfit prepare hf:{raw} -o OUT`"):
        load(raw)
    for command in (["inspect"], ["run"]):
        assert main([command[0], str(raw)]) == 2, command
        err = capsys.readouterr().err.strip()
        assert hint in err and "\n" not in err and "Traceback" not in err, err
    (raw / "config.json").unlink()  # a folder of anything else: as before
    with pytest.raises(ManifestError, match=f"is missing: {raw} is not a prepared model$"):
        read_manifest(raw)
