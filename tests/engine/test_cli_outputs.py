"""Files ``layerfit run`` and ``layerfit plot-trace`` read and write: checked before the
run, written where the user said (never with an extension appended), never
half-overwritten, and anything unreadable is one line, not a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tinymodels
import torch

from layerfit.cli import main
from layerfit.engine.trace import Timeline, load_timeline
from layerfit.errors import InputError, LayerfitError
from layerfit.store import example_input, prepare

SHAPE = (1, 3, 16, 16)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("m") / "tiny"
    prepare("tinymodels:tiny_cnn", out, input_shape=SHAPE)
    return out


@pytest.fixture()
def trace(tmp_path_factory) -> Path:
    return _layerfit_trace(tmp_path_factory.mktemp("t"))


def _one_line_error(capsys, *needles: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error:" in err, err
    for needle in needles:
        assert needle in err, err
    return err


@pytest.mark.parametrize(
    ("name", "needle"),
    [("y.txt", "end the name with one of .npy, .npz"), ("y", "no extension")],
)
def test_run_output_keeps_the_name_given(tiny: Path, tmp_path: Path, capsys, name: str, needle: str):
    """numpy appends .npy to any other name: the output went to y.txt.npy (or, for a
    folder such as /tmp, to /tmp.npy) while the user looked for y.txt."""
    assert main(["run", str(tiny), "--output", str(tmp_path / name)]) == 2
    _one_line_error(capsys, needle)
    assert list(tmp_path.iterdir()) == []


def test_run_output_paths_are_checked_before_the_run(tiny: Path, tmp_path: Path, capsys):
    (tmp_path / "d.npy").mkdir()
    assert main(["run", str(tiny), "--output", str(tmp_path / "d.npy")]) == 2
    _one_line_error(capsys, "is a directory")
    assert main(["run", str(tiny), "--output", str(tmp_path / "no" / "y.npy")]) == 2
    _one_line_error(capsys, "does not exist")
    assert main(["run", str(tiny), "--trace", str(tmp_path / "no" / "t.json")]) == 2
    _one_line_error(capsys, "does not exist")
    assert main(["run", str(tiny), "--trace", str(tmp_path)]) == 2
    _one_line_error(capsys, "is a directory")


def test_run_trace_does_not_overwrite_the_prepared_model(tiny: Path, tmp_path: Path, capsys):
    manifest = tiny / "manifest.json"
    before = manifest.read_bytes()
    assert main(["run", str(tiny), "--trace", str(manifest)]) == 2
    _one_line_error(capsys, "already exists", "--force")
    assert manifest.read_bytes() == before
    out = tmp_path / "y.npy"
    out.write_bytes(b"mine")
    assert main(["run", str(tiny), "--output", str(out)]) == 2
    assert out.read_bytes() == b"mine"
    assert main(["run", str(tiny), "--output", str(out), "--force"]) == 0
    x = example_input(SHAPE)
    with torch.no_grad():
        assert np.array_equal(np.load(out), tinymodels.tiny_cnn().eval()(x).numpy())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["y.npy"]  # no temporary file left


def test_run_input_npz_is_one_line_error(tiny: Path, tmp_path: Path, capsys):
    np.savez(tmp_path / "x.npz", x=np.zeros(SHAPE, np.float32))
    assert main(["run", str(tiny), "--input", str(tmp_path / "x.npz")]) == 2
    _one_line_error(capsys, ".npz archive")


def test_run_input_in_the_other_byte_order_gives_the_same_output(tiny: Path, tmp_path: Path):
    x = example_input(SHAPE, seed=5)
    np.save(tmp_path / "be.npy", x.numpy().astype(">f4"))
    assert main(["run", str(tiny), "--input", str(tmp_path / "be.npy"), "--output", str(tmp_path / "y.npy")]) == 0
    with torch.no_grad():
        assert np.array_equal(np.load(tmp_path / "y.npy"), tinymodels.tiny_cnn().eval()(x).numpy())


@pytest.mark.parametrize(("name", "needle"), [("g.xyz", "'.xyz'"), ("g", "no extension")])
def test_plot_trace_needs_an_image_extension(trace: Path, tmp_path: Path, capsys, name: str, needle: str):
    """matplotlib appends .png to a name without extension (and wrote /tmp.png for
    ``-o /tmp`` while saying "wrote /tmp"), and raised a traceback for an unknown one."""
    assert main(["plot-trace", str(trace), "-o", str(tmp_path / name)]) == 2
    _one_line_error(capsys, needle, ".png")
    assert list(tmp_path.iterdir()) == []


def test_plot_trace_output_paths(trace: Path, tmp_path: Path, capsys):
    assert main(["plot-trace", str(trace), "-o", str(tmp_path)]) == 2
    _one_line_error(capsys, "is a directory")
    assert main(["plot-trace", str(trace), "-o", str(tmp_path / "no" / "g.png")]) == 2
    _one_line_error(capsys, "does not exist")
    png = tmp_path / "g.png"
    png.write_bytes(b"mine")
    assert main(["plot-trace", str(trace), "-o", str(png)]) == 2
    _one_line_error(capsys, "already exists")
    assert png.read_bytes() == b"mine"
    assert main(["plot-trace", str(trace), "-o", str(png), "--force"]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_plot_failure_leaves_the_existing_image(trace: Path, tmp_path: Path, monkeypatch):
    import matplotlib.figure

    from layerfit.engine.plot import plot_timeline

    png = tmp_path / "g.png"
    png.write_bytes(b"mine")

    def broken(self, fname, **kwargs):
        Path(fname).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", broken)
    with pytest.raises(LayerfitError, match="No space left"):
        plot_timeline(load_timeline(trace), png)
    assert png.read_bytes() == b"mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.png"]


def _layerfit_trace(tmp_path: Path, **changes) -> Path:
    body = Timeline("async", 1000).to_dict()
    body["events"] = [{"unit": 0, "name": "a", "stage": "read", "start": 0.0, "end": 0.001, "nbytes": 10}]
    body["occupancy"] = [[0.0, 10]]
    body.update(changes)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [], "layerfit": body}))
    return path


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"budget_bytes": "a"}, "budget_bytes is 'a'"),
        ({"occupancy": [[1]]}, "occupancy point 0"),
        ({"events": [{"unit": 0, "name": "a", "stage": "read", "start": "x", "end": 1}]}, "event 0 start"),
        ({"events": [{"unit": 0, "name": "a", "stage": "bogus", "start": 0, "end": 1}]}, "stage 'bogus'"),
        ({"events": [{"unit": 0}]}, "missing field 'name'"),
    ],
)
def test_malformed_trace_is_one_line_error(tmp_path: Path, capsys, changes: dict, needle: str):
    path = _layerfit_trace(tmp_path, **changes)
    with pytest.raises(InputError, match=needle):
        load_timeline(path)
    assert main(["plot-trace", str(path), "-o", str(tmp_path / "g.png")]) == 2
    _one_line_error(capsys, "is not a layerfit trace", needle)


def test_binary_file_as_trace_is_one_line_error(tiny: Path, tmp_path: Path, capsys):
    assert main(["plot-trace", str(tiny / "weights.safetensors"), "-o", str(tmp_path / "g.png")]) == 2
    _one_line_error(capsys, "not a UTF-8 text file")


@pytest.mark.parametrize("name", ["Y.NPY", "Y.NPZ"])
def test_run_output_with_an_upper_case_extension_is_the_file_written(tiny: Path, tmp_path: Path, name: str):
    # numpy appends '.npy' to a name that does not end in it (case-sensitively)
    assert main(["run", str(tiny), "--output", str(tmp_path / name)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == [name]
    loaded = np.load(tmp_path / name, allow_pickle=False)
    first = loaded if isinstance(loaded, np.ndarray) else loaded["arr_0"]
    assert first.size > 0
