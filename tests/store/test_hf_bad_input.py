"""A Hugging Face folder that is not what ``prepare hf:`` needs is one line: ``layerfit
prepare hf:FOLDER -o OUT`` prints it on stderr, exits with status 2 and creates nothing
(no OUT, no temporary folder beside it). Each folder is a tiny Llama written by
``save_pretrained`` (one file, or sharded) and then broken the way real folders are.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
from hf_folders import tiny_llama_folders

from layerfit.cli import main

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

WEIGHT = "model.layers.1.mlp.down_proj.weight"


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny Llama saved as one file and as shards of 40 KB."""
    return tiny_llama_folders(tmp_path_factory.mktemp("hf_bad"))


def _header(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


def _write_header(path: Path, header: dict, data: bytes) -> None:
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def _shard_of(folder: Path, name: str) -> Path:
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    return folder / index["weight_map"][name]


def no_config(folder: Path) -> None:
    (folder / "config.json").unlink()


def unknown_architecture(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "lama"
    (folder / "config.json").write_text(json.dumps(config))


def missing_weight(folder: Path) -> None:
    tensors = safetensors_torch.load_file(folder / "model.safetensors")
    del tensors[WEIGHT]
    safetensors_torch.save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


def missing_shard(folder: Path) -> None:
    _shard_of(folder, WEIGHT).unlink()


def corrupt_shard(folder: Path) -> None:
    shard = _shard_of(folder, WEIGHT)
    size = shard.stat().st_size
    shard.write_bytes((bytes(range(256)) * (size // 256 + 1))[:size])


def garbage_header(folder: Path) -> None:
    shard = _shard_of(folder, WEIGHT)
    _, data = _header(shard)
    garbage = b"{not json, only bytes..."
    shard.write_bytes(struct.pack("<Q", len(garbage)) + garbage + data)


def truncated_shard(folder: Path) -> None:
    shard = _shard_of(folder, WEIGHT)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size * 2 // 3])


def lying_size(folder: Path) -> None:
    """The header claims a shape twice the bytes its offsets hold."""
    path = folder / "model.safetensors"
    header, data = _header(path)
    rows, cols = header[WEIGHT]["shape"]
    header[WEIGHT]["shape"] = [rows, cols * 2]
    _write_header(path, header, data)


def wrong_shape(folder: Path) -> None:
    """The header's shape fits its bytes but not the model: transposed."""
    path = folder / "model.safetensors"
    header, data = _header(path)
    header[WEIGHT]["shape"] = header[WEIGHT]["shape"][::-1]
    _write_header(path, header, data)


def pickle_only(folder: Path) -> None:
    (folder / "model.safetensors").unlink()
    # Never opened: bytes that are no pickle at all would make a reader that tried fail loudly.
    (folder / "pytorch_model.bin").write_bytes(b"not a pickle: never unpickled")


CASES: dict[str, tuple[str, Callable[[Path], None], tuple[str, ...]]] = {
    "no config.json": ("single", no_config, ("holds no config.json", "not a Hugging Face model folder")),
    "unknown architecture": (
        "single", unknown_architecture,
        ("does not know the architecture 'lama'", "close: llama", "no trust_remote_code"),
    ),
    "missing weight": ("single", missing_weight, ("does not hold every weight of LlamaForCausalLM", f"missing weights: {WEIGHT}")),
    "index names a missing shard": ("sharded", missing_shard, ("model.safetensors.index.json names shard model-0000",
                                                                "which is not in")),
    "corrupt shard": ("sharded", corrupt_shard, ("is truncated or not a safetensors file",)),
    "header not JSON": ("sharded", garbage_header, ("is corrupt: its header is not JSON",)),
    "truncated shard": ("sharded", truncated_shard, ("is truncated: tensor",)),
    "header lies about a size": ("single", lying_size, (f"tensor {WEIGHT}: its header claims 8,192 bytes",
                                                        "shape [32, 128] of F32 needs 16,384")),
    "wrong shape": ("single", wrong_shape, (f"wrong shapes: {WEIGHT} (64, 32) (model: (32, 64))",)),
    "pytorch_model.bin only": ("single", pickle_only, ("holds no model.safetensors", "only pytorch_model.bin",
                                                       "never pickle")),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_folder_is_one_line_status_2_and_nothing_written(llama: dict[str, Path], tmp_path: Path, capsys, case: str):
    base, breaks, needles = CASES[case]
    folder = tmp_path / "model"
    shutil.copytree(llama[base], folder)
    breaks(folder)
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["prepare", "hf:" + str(folder), "-o", str(out)]) == 2
    _one_line(capsys.readouterr().err, *needles)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temporary folder left


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--class", "LlamaForCausalLMM"], ("transformers has no model class 'LlamaForCausalLMM'", "close: LlamaForCausalLM")),
        (["--dtype", "int8"], ("--dtype 'int8' is not a floating dtype",)),
        (["--seq-len", "65"], ("--seq-len 65 is outside 1..64",)),
    ],
)
def test_bad_options_are_one_line(llama: dict[str, Path], tmp_path: Path, capsys, argv: list[str], needles: tuple[str, ...]):
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["prepare", "hf:" + str(llama["single"]), "-o", str(out), *argv]) == 2
    _one_line(capsys.readouterr().err, *needles)
    assert not out.exists()


def test_a_path_that_is_not_a_folder_is_one_line(tmp_path: Path, capsys):
    (tmp_path / "file").write_text("{}")
    for path in (tmp_path / "absent", tmp_path / "file"):
        assert main(["prepare", f"hf:{path}", "-o", str(tmp_path / "out")]) == 2
        _one_line(capsys.readouterr().err, "is not a folder: hf: takes a local Hugging Face model folder")
    assert not (tmp_path / "out").exists()


def _one_line(err: str, *needles: str) -> None:
    """One error line (the progress bar, cleared, leaves a blank line before it)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
