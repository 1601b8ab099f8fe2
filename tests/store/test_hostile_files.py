"""Files made to break the readers: each gives one line and exit 2, never a traceback,
a hang or a half-written folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from layerfit.store import prepare

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hostile") / "m"
    prepare("mobilenet_v1_025", out, input_shape=(1, 3, 32, 32))
    return out


def cli(*argv: str, timeout: float = 120, preexec=None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "layerfit.cli", *argv], capture_output=True, text=True,
                          env=env, timeout=timeout, check=False, preexec_fn=preexec)


def one_line(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


def edited(prepared: Path, tmp_path: Path, edit) -> Path:
    folder = tmp_path / "edited"
    shutil.copytree(prepared, folder)
    path = folder / "manifest.json"
    path.write_text(edit(path.read_text()))
    return folder


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda s: s.replace('"seed": 0', '"seed": ' + "9" * 5000, 1), ["not valid JSON"]),
        (lambda s: s.replace('"seed": 0', '"seed": ' + "[" * 100_000 + "]" * 100_000, 1), ["nested too deeply"]),
        (lambda s: json.dumps({**json.loads(s), "input": {"shape": [1000000, 3, 100000, 100000], "dtype": "float32"}}),
         ["is not one prepare writes"]),
        (lambda s: json.dumps({**json.loads(s), "input": {"shape": [1.0e6, 3, 32, 32], "dtype": "float32"}}),
         ["not a whole number"]),
        (lambda s: _offset(s, 0.7), ["not a whole number"]),
        (lambda s: _offset(s, True), ["not a whole number"]),
    ],
    ids=["5000-digit integer", "100000-deep nesting", "huge input shape", "float shape", "fractional offset",
         "boolean offset"],
)
def test_a_hand_edited_manifest_is_one_line(prepared: Path, tmp_path: Path, edit, words: list[str]) -> None:
    folder = edited(prepared, tmp_path, edit)
    for argv in (["run", str(folder)], ["inspect", str(folder)], ["verify", str(folder)]):
        one_line(cli(*argv), *words)


def _offset(text: str, value: object) -> str:
    data = json.loads(text)
    unit = data["units"][1]
    unit["offset"] = unit["offset"] + value if isinstance(value, float) else value
    return json.dumps(data)


def test_a_fifo_as_weights_file_is_refused_not_waited_on(prepared: Path, tmp_path: Path) -> None:
    folder = tmp_path / "fifo"
    shutil.copytree(prepared, folder)
    (folder / "weights.safetensors").unlink()
    os.mkfifo(folder / "weights.safetensors")
    for argv in (["run", str(folder)], ["verify", str(folder)], ["inspect", str(folder)]):
        result = cli(*argv, timeout=60)  # a hang fails the test here
        if argv[0] != "inspect":
            one_line(result, "not a regular file")


def test_a_full_disk_during_prepare_keeps_nothing(tmp_path: Path) -> None:
    import resource
    import signal

    def small_files() -> None:  # writes past 1 MB fail with EFBIG, as on a full disk
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1_000_000, 1_000_000))

    out = tmp_path / "m"
    one_line(cli("prepare", "mobilenet_v2", "-o", str(out), "--input-shape", "1,3,32,32", preexec=small_files),
             "cannot write", "nothing was kept")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("budget", "words"),
    [("1" + "0" * 400 + "MB", ["more bytes than any machine has"]), ("١٢MB", ["cannot read"]),
     ("12.5", ["must be whole"]), ("1e3MB", ["cannot read"]), ("-4MB", ["cannot read"]), ("50000000%", ["share"])],
)
def test_a_bad_budget_is_one_line(prepared: Path, budget: str, words: list[str]) -> None:
    one_line(cli("run", str(prepared), "--budget", budget), *words)


def test_a_crafted_npy_header_is_one_line(prepared: Path, tmp_path: Path) -> None:
    huge = tmp_path / "huge.npy"
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000, 3, 100000, 100000), }"
    huge.write_bytes(b"\x93NUMPY\x01\x00" + len(header.ljust(118) + "\n").to_bytes(2, "little")
                     + (header.ljust(118) + "\n").encode())
    one_line(cli("run", str(prepared), "--input", str(huge)), "the model expects")
    objects = tmp_path / "objects.npy"
    header = "{'descr': '|O', 'fortran_order': False, 'shape': (1, 3, 32, 32), }"
    objects.write_bytes(b"\x93NUMPY\x01\x00" + len(header.ljust(118) + "\n").to_bytes(2, "little")
                        + (header.ljust(118) + "\n").encode() + b"\x80\x04N.")
    one_line(cli("run", str(prepared), "--input", str(objects)), "the model expects")
    garbage = tmp_path / "garbage.npy"
    garbage.write_bytes(b"\x93NUMPY\x01\x00\x10\x00{'descr': __import__('os') }\n")
    one_line(cli("run", str(prepared), "--input", str(garbage)), "header is not valid")


def test_a_safetensors_input_for_a_one_input_model_says_so(prepared: Path, tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    save_file({"x": np.zeros((1, 3, 32, 32), dtype=np.float32)}, str(path))
    result = cli("run", str(prepared), "--input", str(path))
    one_line(result, ".safetensors file", ".npy")
    assert "pickle" not in result.stderr
