"""Prepared-model store: layout, atomic writing, checkpoints, corruption detection."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import tinymodels
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from layerfit.cli import main
from layerfit.engine import load
from layerfit.errors import (
    CaptureError,
    CheckpointError,
    CorruptStoreError,
    FactoryImportError,
    InputError,
    ManifestError,
    OutputExistsError,
    OutputPathError,
)
from layerfit.store import (
    ALIGN,
    SegmentReader,
    aligned_buffer,
    prepare,
    read_manifest,
    verify_segment,
)

TINY = "tinymodels:tiny_cnn"


@pytest.fixture()
def tiny(tmp_path: Path) -> Path:
    prepare(TINY, tmp_path / "tiny", input_shape=(1, 3, 16, 16))
    return tmp_path / "tiny"


def test_segments_are_aligned_in_execution_order_and_safetensors_readable(tiny: Path):
    m = read_manifest(tiny)
    offsets = [u.offset for u in m.units]
    assert offsets == sorted(offsets)
    for u in m.units:
        assert u.offset % ALIGN == 0 and u.nbytes % ALIGN == 0
        assert u.payload_bytes <= u.nbytes
    for a, b in zip(m.units, m.units[1:], strict=False):
        assert b.offset == a.offset + a.nbytes  # contiguous: a block is one read
    assert (tiny / "weights.safetensors").stat().st_size == m.weights_size
    model = tinymodels.tiny_cnn()
    with safe_open(str(tiny / "weights.safetensors"), "pt") as f:
        for name, tensor in model.state_dict().items():
            assert torch.equal(f.get_tensor(name), tensor)


def test_a_prepared_directory_runs_wherever_it_is_moved(tmp_path: Path):
    # Prepare on a workstation, copy to the device: nothing in it names where it was made.
    prepare(TINY, tmp_path / "made_here", input_shape=(1, 3, 8, 8))
    assert str(tmp_path) not in (tmp_path / "made_here" / "manifest.json").read_text()
    (tmp_path / "made_here").rename(tmp_path / "moved")
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad(), load(tmp_path / "moved", pipeline="async") as engine:
        assert torch.equal(engine(x), tinymodels.tiny_cnn().eval()(x))


def test_inspect_json_lists_units(tiny: Path, capsys):
    assert main(["inspect", str(tiny), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [u["name"] for u in info["units"]] == ["conv1", "bn1", "conv2", "bn2", "conv3", "fc"]
    assert {"name", "nbytes", "offset"} <= set(info["units"][0])


def test_inspect_says_which_tensors_stay_resident_and_why(tmp_path: Path, capsys):
    prepare("tinymodels:tied_lm", tmp_path / "lm", input_shape=(1, 8), input_dtype="int64")
    assert main(["inspect", str(tmp_path / "lm"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    reasons = {r["name"]: r["reason"] for r in info["resident_tensors"]}
    assert reasons == {
        "embed.weight": "shared by several modules",  # tied to head.weight
        "pos": "owned by a module whose children also own tensors",
    }
    assert main(["inspect", str(tmp_path / "lm")]) == 0
    text = capsys.readouterr().out
    assert "kept in memory for the whole inference" in text
    assert "shared by several modules" in text


def test_verify_passes_on_a_good_model(tiny: Path):
    assert main(["verify", str(tiny)]) == 0


def test_existing_output_is_refused_unless_forced(tiny: Path, capsys):
    before = (tiny / "manifest.json").read_bytes()
    with pytest.raises(OutputExistsError):
        prepare(TINY, tiny, input_shape=(1, 3, 16, 16))
    assert main(["prepare", TINY, "-o", str(tiny), "--input-shape", "1,3,16,16"]) == 2
    assert "--force" in capsys.readouterr().err
    assert (tiny / "manifest.json").read_bytes() == before
    prepare(TINY, tiny, input_shape=(1, 3, 8, 8), force=True)
    assert read_manifest(tiny).input_shape == (1, 3, 8, 8)
    assert sorted(p.name for p in tiny.parent.iterdir()) == ["tiny"]  # no temp dirs left


def test_factory_that_does_not_import(tmp_path: Path, capsys):
    with pytest.raises(FactoryImportError, match="no_such_module"):
        prepare("no_such_module:f", tmp_path / "x", input_shape=(1, 3))
    assert main(["prepare", "tinymodels:missing", "-o", str(tmp_path / "y"), "--input-shape", "1,3"]) == 2
    assert "has no attribute" in capsys.readouterr().err
    with pytest.raises(FactoryImportError, match="not a torch.nn.Module"):
        prepare("tinymodels:not_a_module", tmp_path / "z", input_shape=(1, 3))
    assert list(tmp_path.iterdir()) == []


def test_checkpoint_is_loaded_and_mismatches_are_named(tmp_path: Path):
    state = {k: torch.full_like(v, 0.5) if v.is_floating_point() else v for k, v in tinymodels.tiny_cnn().state_dict().items()}
    good = tmp_path / "good.safetensors"
    save_file(state, str(good))
    prepare(TINY, tmp_path / "m", input_shape=(1, 3, 8, 8), checkpoint=good)
    with safe_open(str(tmp_path / "m" / "weights.safetensors"), "pt") as f:
        assert torch.all(f.get_tensor("conv2.weight") == 0.5)

    missing = dict(state)
    del missing["fc.bias"]
    save_file(missing, str(tmp_path / "missing.safetensors"))
    with pytest.raises(CheckpointError, match="missing tensors: fc.bias"):
        prepare(TINY, tmp_path / "a", input_shape=(1, 3, 8, 8), checkpoint=tmp_path / "missing.safetensors")

    wrong = dict(state)
    wrong["fc.weight"] = torch.zeros(3, 3)
    save_file(wrong, str(tmp_path / "wrong.safetensors"))
    with pytest.raises(CheckpointError, match=r"wrong shapes: fc.weight \(3, 3\)"):
        prepare(TINY, tmp_path / "b", input_shape=(1, 3, 8, 8), checkpoint=tmp_path / "wrong.safetensors")

    pickled = tmp_path / "weights.pt"
    torch.save(state, pickled)
    with pytest.raises(CheckpointError, match="never pickle"):
        prepare(TINY, tmp_path / "c", input_shape=(1, 3, 8, 8), checkpoint=pickled)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["good.safetensors", "m", "missing.safetensors", "wrong.safetensors", "weights.pt"]
    )


def test_tied_checkpoint_needs_the_tensor_once(tmp_path: Path):
    model = tinymodels.tied_lm()
    state = {k: v for k, v in model.state_dict().items() if k != "head.weight"}
    save_file(state, str(tmp_path / "lm.safetensors"))
    m = prepare("tinymodels:tied_lm", tmp_path / "lm", input_shape=(1, 8), input_dtype="int64",
                checkpoint=tmp_path / "lm.safetensors")
    assert m.resident is not None
    assert {t.name for t in m.resident.tensors} == {"pos", "embed.weight"}


def test_manifest_of_another_version(tiny: Path, capsys):
    data = json.loads((tiny / "manifest.json").read_text())
    data["version"] = 99
    (tiny / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="version 99"):
        read_manifest(tiny)
    assert main(["inspect", str(tiny)]) == 2
    err = capsys.readouterr().err
    assert "version 99" in err and "Traceback" not in err


def test_malformed_manifest(tiny: Path):
    (tiny / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        read_manifest(tiny)


def test_truncated_weights_file(tiny: Path, capsys):
    path = tiny / "weights.safetensors"
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size - ALIGN)
    with pytest.raises(CorruptStoreError, match="truncated"):
        SegmentReader(path, read_manifest(tiny).weights_size)
    assert main(["run", str(tiny)]) == 2
    assert "truncated" in capsys.readouterr().err
    # inspect still shows the manifest, and fails instead of looking healthy
    for argv in (["inspect", str(tiny)], ["inspect", str(tiny), "--json"]):
        assert main(argv) == 2
        captured = capsys.readouterr()
        assert "conv1" in captured.out and "truncated" in captured.err
    path.unlink()
    assert main(["inspect", str(tiny)]) == 2
    assert "is missing" in capsys.readouterr().err


def test_flipped_byte_names_the_unit(tiny: Path, capsys):
    m = read_manifest(tiny)
    unit = m.units[2]
    with open(tiny / "weights.safetensors", "r+b") as fh:
        fh.seek(unit.offset + 100)
        b = fh.read(1)
        fh.seek(unit.offset + 100)
        fh.write(bytes([b[0] ^ 0x40]))
    buf = aligned_buffer(unit.nbytes)
    view = memoryview(buf)
    with SegmentReader(tiny / "weights.safetensors", m.weights_size) as reader:
        reader.read(unit, view)
    with pytest.raises(CorruptStoreError, match=r"unit 2 \(conv2\)"):
        verify_segment(unit, view)
    view.release()
    assert main(["verify", str(tiny)]) == 2
    assert "unit 2 (conv2)" in capsys.readouterr().err
    assert main(["run", str(tiny), "--pipeline", "async"]) == 2  # first read verifies
    assert "checksum mismatch in unit 2 (conv2)" in capsys.readouterr().err


def test_manifest_cannot_point_outside_the_directory(tiny: Path):
    data = json.loads((tiny / "manifest.json").read_text())
    data["weights"]["file"] = "../elsewhere.bin"
    (tiny / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="plain file name"):
        read_manifest(tiny)


def test_failed_write_leaves_nothing(tmp_path: Path, monkeypatch):
    import layerfit.store.writer as writer

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(writer, "_write_weights", boom)
    with pytest.raises(OutputPathError, match="disk full .* free on its file system\\); nothing was kept"):
        prepare(TINY, tmp_path / "out", input_shape=(1, 3, 8, 8))
    assert list(tmp_path.iterdir()) == []
    assert os.path.exists(tmp_path)


def test_unknown_model_lists_close_matches_and_writes_nothing(tmp_path: Path, capsys):
    assert main(["prepare", "resnet15", "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'resnet15'" in err and "resnet152" in err
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_model_of_several_inputs_is_prepared_from_an_example_of_them(tmp_path: Path, capsys):
    features = torch.randn(1, 8, 32)
    decoder_ids = torch.tensor([[0, 5, 7]])
    model = tinymodels.tiny_whisper()
    with pytest.raises(CaptureError, match="fails on the example input"):  # its forward needs both
        prepare("tinymodels:tiny_whisper", tmp_path / "shape", input_shape=(1, 8, 32))
    m = prepare("tinymodels:tiny_whisper", tmp_path / "api", example={"input_features": features, "decoder_input_ids": decoder_ids})
    assert (m.input_shape, m.input_dtype) == ((1, 8, 32), "float32")
    save_file({"input_features": features, "decoder_input_ids": decoder_ids}, tmp_path / "example.safetensors")
    assert main(["prepare", "tinymodels:tiny_whisper", "-o", str(tmp_path / "cli"), "--example",
                 str(tmp_path / "example.safetensors"), "--json"]) == 0  # fmt: skip
    capsys.readouterr()
    assert (tmp_path / "api" / "weights.safetensors").read_bytes() == (tmp_path / "cli" / "weights.safetensors").read_bytes()
    with load(tmp_path / "cli", pipeline="async") as engine, torch.no_grad():
        got = engine(input_features=features, decoder_input_ids=decoder_ids).logits
        assert torch.equal(got, model(input_features=features, decoder_input_ids=decoder_ids).logits)


def test_a_bad_example_is_refused_and_writes_nothing(tmp_path: Path, capsys):
    with pytest.raises(InputError, match="holds no tensor"):
        prepare(TINY, tmp_path / "a", example={"flag": True})
    (tmp_path / "bad.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
    save_file({"x": torch.zeros(1, 3, 8, 8)}, tmp_path / "good.safetensors")
    cases = [
        (["--example", str(tmp_path / "missing.safetensors")], "no such file"),
        (["--example", str(tmp_path / "bad.safetensors")], "is not a readable .safetensors file"),
        (["--example", str(tmp_path / "good.safetensors"), "--input-shape", "1,3,8,8"], "leave out --input-shape"),
    ]
    for args, message in cases:
        assert main(["prepare", TINY, "-o", str(tmp_path / "b"), *args]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.safetensors", "good.safetensors"]


def test_run_calls_a_model_prepared_from_keyword_arguments_with_all_of_them(tmp_path: Path, capsys):
    from layerfit.engine import output_digest
    from layerfit.store import example_call

    example = {"input_features": torch.randn(1, 8, 32), "decoder_input_ids": torch.tensor([[0, 5, 7]])}
    m = prepare("tinymodels:tiny_whisper", tmp_path / "m", example=example)
    assert m.input_keywords == (("input_features", (1, 8, 32), "float32"), ("decoder_input_ids", (1, 3), "int64"))
    assert read_manifest(tmp_path / "m").input_keywords == m.input_keywords
    args, keywords = example_call(m)
    assert args == () and sorted(keywords) == ["decoder_input_ids", "input_features"]
    model = tinymodels.tiny_whisper()
    with torch.no_grad():
        default_digest = output_digest(model(**keywords))
        given_digest = output_digest(model(**example))
    assert main(["run", str(tmp_path / "m"), "--pipeline", "async", "--repeats", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["output_sha256"] == default_digest
    save_file(example, tmp_path / "in.safetensors")
    assert main(["run", str(tmp_path / "m"), "--input", str(tmp_path / "in.safetensors"), "--repeats", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["output_sha256"] == given_digest
    save_file({"input_features": example["input_features"]}, tmp_path / "half.safetensors")
    assert main(["run", str(tmp_path / "m"), "--input", str(tmp_path / "half.safetensors")]) == 2
    assert "holds input_features; the model takes input_features, decoder_input_ids" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "m"), "--input", str(tmp_path / "missing.safetensors")]) == 2
    assert "no such file (this model takes keyword arguments" in capsys.readouterr().err
    wrong = {"input_features": example["input_features"][0], "decoder_input_ids": example["decoder_input_ids"].float()}
    save_file(wrong, tmp_path / "wrong.safetensors")
    assert main(["run", str(tmp_path / "m"), "--input", str(tmp_path / "wrong.safetensors")]) == 2
    err = capsys.readouterr().err
    assert "input_features is float32 (8, 32); the model was prepared with float32 (1, 8, 32)" in err
    assert "Traceback" not in err
