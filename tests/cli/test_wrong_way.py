"""Messages that sent the user the wrong way (issue 52 item 13): each now says what is
wrong first, in one line, from the command line and as a ``LayerfitError`` from Python."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import tinymodels

import layerfit
from layerfit.errors import BudgetError, LayerfitError, ManifestError
from layerfit.schedule.runtime.executor import Runtime
from layerfit.sizes import Budget
from layerfit.store import prepare, read_manifest

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A zoo CNN and a tiny GPT-2 prepared, the GPT-2's Hugging Face folder as published,
    and a model repository holding the prepared GPT-2 and that raw folder."""
    root = tmp_path_factory.mktemp("wrong-way")
    made = {"zoo": root / "mobilenet", "raw": root / "gpt2-raw", "repo": root / "repo"}
    prepare("mobilenet_v1_025", made["zoo"], input_shape=(1, 3, 32, 32))
    tinymodels.tiny_gpt2().save_pretrained(made["raw"])
    made["lm"] = made["repo"] / "lm"
    prepare("tinymodels:tiny_gpt2", made["lm"], input_shape=(1, 8), input_dtype="int64")
    shutil.copytree(made["raw"], made["repo"] / "raw")
    return made


def cli(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "layerfit.cli", *argv], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)


def one_line(result: subprocess.CompletedProcess[str], *words: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr and len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-3000:]
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


# --- generate on a folder that is not a prepared language model -------------------------


def test_generate_says_what_the_folder_is_before_asking_for_a_tokenizer(folders, tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = {
        str(tmp_path / "nothere"): "does not exist",
        str(a_file): "is not a directory",
        str(empty): "is not a prepared model",
        str(folders["raw"]): f"is a Hugging Face model folder, not a prepared model: run `layerfit prepare hf:{folders['raw']}",
        str(folders["zoo"]): f"{folders['zoo']} holds mobilenet_v1_025, not a language model",
    }
    for folder, words in cases.items():
        line = one_line(cli("generate", folder, "--prompt", "hi"), words)
        assert "tokenizer" not in line, line


# --- serve --repository -----------------------------------------------------------------


def test_a_prepared_model_given_as_the_repository_is_refused_at_start(folders) -> None:
    one_line(cli("serve", "--repository", str(folders["lm"]), "--port", "0"),
             "is itself a prepared model", "pass its parent folder")
    with pytest.raises(LayerfitError, match="is itself a prepared model"):
        Runtime(folders["lm"], "50MB", workers=1)


def test_a_raw_hugging_face_folder_in_a_repository_says_to_prepare_it(folders) -> None:
    runtime = Runtime(folders["repo"], "50MB", workers=1)
    try:
        with pytest.raises(LayerfitError, match=r"run `layerfit prepare hf:.*raw -o FOLDER`"):
            runtime.load_model("raw")
        states = {row["name"]: row for row in runtime.index()}
        assert states["raw"]["state"] == "UNAVAILABLE" and "layerfit prepare hf:" in states["raw"]["reason"]
        assert states["lm"]["state"] == "READY"
    finally:
        runtime.shutdown()


# --- a manifest.json that is not a regular file -----------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_manifest_that_is_not_a_regular_file_says_so_without_blocking(folders, tmp_path: Path, kind: str) -> None:
    folder = tmp_path / "model"
    shutil.copytree(folders["zoo"], folder)
    (folder / "manifest.json").unlink()
    if kind == "fifo":
        os.mkfifo(folder / "manifest.json")  # a blocking open would wait for a writer forever
    else:
        (folder / "manifest.json").mkdir()
    caught: list[BaseException] = []

    def read() -> None:
        try:
            read_manifest(folder)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            caught.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), "read_manifest blocked on a FIFO"
    assert len(caught) == 1 and isinstance(caught[0], ManifestError), caught
    words = "a FIFO (named pipe)" if kind == "fifo" else "a folder"
    assert "is not a regular file" in str(caught[0]) and words in str(caught[0]) and "missing" not in str(caught[0])
    one_line(cli("inspect", str(folder), timeout=60), "is not a regular file", words)
    for load in (layerfit.load, layerfit.from_pretrained):  # the Python API says the same
        with pytest.raises(ManifestError, match=f"is not a regular file but {re.escape(words)}"):
            load(folder)


# --- a budget above 100 % ---------------------------------------------------------------


def test_a_share_above_100_percent_is_refused(folders) -> None:
    assert Budget.parse("100%").percent == 100
    for share in ("150%", "100.5%", "1000%"):
        with pytest.raises(BudgetError, match="100% already keeps every weight resident \\(preload\\)"):
            Budget.parse(share)
    with pytest.raises(BudgetError, match="more than all of them"):
        layerfit.load(folders["zoo"], budget="150%")
    one_line(cli("run", str(folders["zoo"]), "--budget", "150%"), "150% of the model's weights is more than all of them")
