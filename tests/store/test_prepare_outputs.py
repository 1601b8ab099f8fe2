"""``prepare``: what it may replace, where it may write, and which factories and
checkpoints it accepts — each refusal one line, nothing of the user's lost."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import tinymodels
from safetensors import safe_open
from safetensors.torch import save_file

import layerfit
from layerfit.cli import main
from layerfit.errors import FactoryImportError, LayerfitError, OutputExistsError
from layerfit.store import prepare, read_manifest

TINY = "tinymodels:tiny_cnn"
SHAPE = (1, 3, 8, 8)


def test_force_never_deletes_a_folder_that_is_not_a_prepared_model(tmp_path: Path, capsys):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match="notes.txt"):
        prepare(TINY, folder, input_shape=SHAPE, force=True)
    assert main(["prepare", TINY, "-o", str(folder), "--input-shape", "1,3,8,8", "--force"]) == 2
    assert "not a prepared model" in capsys.readouterr().err
    assert (folder / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project"]


def test_force_never_replaces_a_file(tmp_path: Path):
    target = tmp_path / "model"
    target.write_text("mine")
    with pytest.raises(OutputExistsError, match="a file"):
        prepare(TINY, target, input_shape=SHAPE, force=True)
    assert target.read_text() == "mine"


def test_force_refuses_the_working_directory(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match="working directory"):
        prepare(TINY, ".", input_shape=SHAPE, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_force_replaces_a_prepared_model_even_a_damaged_one(tmp_path: Path):
    out = tmp_path / "m"
    prepare(TINY, out, input_shape=SHAPE)
    (out / "manifest.json").write_text("{damaged")
    prepare(TINY, out, input_shape=(1, 3, 16, 16), force=True)
    assert read_manifest(out).input_shape == (1, 3, 16, 16)
    empty = tmp_path / "empty"
    empty.mkdir()
    prepare(TINY, empty, input_shape=SHAPE, force=True)
    assert read_manifest(empty).input_shape == SHAPE


def test_output_below_a_file_is_one_line_error(tmp_path: Path, capsys):
    (tmp_path / "afile").write_text("mine")
    assert main(["prepare", TINY, "-o", str(tmp_path / "afile" / "m"), "--input-shape", "1,3,8,8"]) == 2
    err = capsys.readouterr().err
    assert "is a file" in err and "Traceback" not in err
    assert (tmp_path / "afile").read_text() == "mine"


def test_prepared_directory_follows_the_umask(tmp_path: Path):
    old = os.umask(0o022)
    try:
        prepare(TINY, tmp_path / "m", input_shape=SHAPE)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "m").stat().st_mode) == 0o755  # mkdtemp alone gives 0700


def test_factory_that_fails_when_called(tmp_path: Path, capsys):
    with pytest.raises(FactoryImportError, match="missing 1 required positional argument"):
        prepare("tinymodels:needs_width", tmp_path / "x", input_shape=(1, 4))
    assert main(["prepare", "tinymodels:needs_width", "-o", str(tmp_path / "y"), "--input-shape", "1,4"]) == 2
    err = capsys.readouterr().err
    assert "fails when called" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_full_state_dict_checkpoint_of_a_model_with_an_unused_module(tmp_path: Path):
    """The spare module never runs, so it is not stored; its tensors in a checkpoint (a
    plain ``state_dict()``) are the model's own and must not be called foreign."""
    model = tinymodels.with_unused()
    state = {k: v + 1 for k, v in model.state_dict().items()}
    save_file(state, str(tmp_path / "full.safetensors"))
    m = prepare("tinymodels:with_unused", tmp_path / "m", input_shape=(1, 4), checkpoint=tmp_path / "full.safetensors")
    assert m.graph.unused == ["spare.bias", "spare.weight"]
    with safe_open(str(tmp_path / "m" / "weights.safetensors"), "pt") as f:
        assert f.get_tensor("used.weight").equal(state["used.weight"])
    save_file({**state, "extra": state["used.bias"].clone()}, str(tmp_path / "extra.safetensors"))
    with pytest.raises(LayerfitError, match="tensors the model does not have: extra"):
        prepare("tinymodels:with_unused", tmp_path / "e", input_shape=(1, 4), checkpoint=tmp_path / "extra.safetensors")


def test_seed_beyond_64_bits_is_one_line_error(tmp_path: Path, capsys):
    args = ["prepare", TINY, "-o", str(tmp_path / "m"), "--input-shape", "1,3,8,8", "--seed", str(2**70)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "64-bit integer" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


_FACTORY = "import torch\n\n\ndef build():\n    return torch.nn.Linear(4, 4)\n"


def _layerfit_script(args: list[str], cwd: Path, pythonpath: str) -> subprocess.CompletedProcess:
    """``layerfit ARGS`` as the console script runs it: the working directory is not on
    its import path (``python -c`` would put it there; without the script, the
    interpreter runs with that entry removed)."""
    script = Path(sys.executable).parent / "layerfit"
    command = (
        [str(script), *args] if script.is_file()
        else [sys.executable, "-c", "import sys; sys.path.remove(''); from layerfit.cli import main; sys.exit(main())", *args]
    )
    env = {**os.environ, "PYTHONPATH": pythonpath}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize(("files", "factory", "where"), [
    ({"myfactory.py": _FACTORY}, "myfactory:build", "myfactory.py"),
    ({"mypkg/__init__.py": "", "mypkg/models.py": _FACTORY}, "mypkg.models:build", os.path.join("mypkg", "__init__.py")),
])
def test_a_factory_in_the_working_directory_says_why_it_does_not_import(tmp_path: Path, files, factory: str, where: str):
    """The ``layerfit`` script does not import from the working directory; the error says
    the factory is there and what to do, and the advice works. The import path is left as it is."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    src = str(Path(layerfit.__file__).parents[1])
    args = ["prepare", factory, "-o", "out", "--input-shape", "1,4"]
    refused = _layerfit_script(args, tmp_path, src)
    assert refused.returncode == 2, refused.stderr
    err = refused.stderr.strip()
    assert "Traceback" not in err and "\n" not in err, err
    assert f"{where} is in the working directory, which is not on Python's import path: run with PYTHONPATH=. or install it" in err
    assert not (tmp_path / "out").exists()
    done = _layerfit_script(args, tmp_path, os.pathsep.join([".", src]))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "manifest.json").is_file()


def test_a_missing_factory_module_gets_no_working_directory_hint(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "elsewhere.py").write_text(_FACTORY)  # another module's file is no reason
    with pytest.raises(FactoryImportError, match="No module named 'myfactory'") as refused:
        prepare("myfactory:build", tmp_path / "x", input_shape=(1, 4))
    assert "working directory" not in str(refused.value)
