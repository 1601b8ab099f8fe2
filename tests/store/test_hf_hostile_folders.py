"""A Hugging Face folder made to attack ``prepare hf:`` — links out of it, a config that
promises a model far larger than its weights, JSON nested to exhaust the parser, a Hub
kernel named as its attention, a GGUF file — is refused in one line, with nothing
written, nothing read from outside the folder and nothing built; and what prepare does
copy never becomes readable by more users than its source.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hf_folders import tiny_llama_folders

from layerfit.cli import main
from layerfit.errors import InputError, LayerfitError, ManifestError
from layerfit.store import prepare, read_manifest
from layerfit.store.hf_folder import HFOptions, load_model

transformers = pytest.importorskip("transformers")

FIXED = HFOptions(variable_shapes=False)  # one pass: these tests are about the folder, not the shapes


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny Llama saved as one file and as shards of 40 KB."""
    return tiny_llama_folders(tmp_path_factory.mktemp("hf_hostile"))


@pytest.fixture()
def folder(pristine: dict[str, Path], tmp_path: Path) -> Path:
    copy = tmp_path / "model"
    shutil.copytree(pristine["single"], copy)
    return copy


@pytest.fixture()
def secret(tmp_path: Path) -> Path:
    """A file only its owner may read, outside the model folder (the shadow password file's stand-in)."""
    path = tmp_path / "outside" / "shadow"
    path.parent.mkdir()
    path.write_text("root:$6$secret-hash:19000:0:99999:7:::\n")
    path.chmod(0o600)
    return path


def _one_line(err: str, *needles: str) -> str:
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def _refused(capsys: pytest.CaptureFixture[str], model: str, out: Path, *needles: str, argv: tuple[str, ...] = ()) -> str:
    capsys.readouterr()
    fixed = ["--fixed-shape"] if model.startswith("hf:") else []
    assert main(["prepare", model, "-o", str(out), *fixed, *argv]) == 2
    line = _one_line(capsys.readouterr().err, *needles)
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]  # no temporary, no lock
    return line


# --- item 2: links out of the folder, and the copies' modes ---------------------------


@pytest.mark.parametrize("name", ["vocab.txt", "config.json", "model.safetensors", "generation_config.json"])
def test_a_link_out_of_the_folder_is_refused_naming_it_and_its_target(
    folder: Path, secret: Path, tmp_path: Path, capsys, name: str
):
    target = secret
    if name in ("config.json", "model.safetensors", "generation_config.json"):  # the real file, moved out
        target = tmp_path / "outside" / name
        shutil.move(folder / name, target)
    (folder / name).symlink_to(target)
    _refused(capsys, f"hf:{folder}", tmp_path / "out", f"{folder / name} is a link to {target}", "outside the folder",
             "--follow-symlinks-out")


def test_a_shard_linked_out_of_the_folder_is_refused(pristine: dict[str, Path], tmp_path: Path, capsys):
    folder = tmp_path / "model"
    shutil.copytree(pristine["sharded"], folder)
    shard = sorted(folder.glob("model-*.safetensors"))[0]
    moved = shutil.move(shard, tmp_path / shard.name)
    shard.symlink_to(moved)
    index = folder / "model.safetensors.index.json"
    index_out = shutil.move(index, tmp_path / index.name)
    _refused(capsys, f"hf:{folder}", tmp_path / "out", "holds no model.safetensors")  # no index: the plain case
    index.symlink_to(index_out)
    _refused(capsys, f"hf:{folder}", tmp_path / "out", f"{index} is a link to", "outside the folder")
    index.unlink()
    shutil.copy(index_out, index)
    _refused(capsys, f"hf:{folder}", tmp_path / "out", f"{shard} is a link to {moved}")


def test_links_inside_the_folder_and_the_hub_cache_layout_are_followed(pristine: dict[str, Path], tmp_path: Path):
    # a Hub cache: models--ORG--NAME/snapshots/REV/FILE -> ../../blobs/HASH
    repo = tmp_path / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    for i, source in enumerate(sorted(pristine["single"].iterdir())):
        shutil.copy(source, repo / "blobs" / f"blob{i}")
        (snapshot / source.name).symlink_to(Path("..") / ".." / "blobs" / f"blob{i}")
    (repo / "blobs" / "vocab").write_text("a\nb\n")
    (snapshot / "vocab.txt").symlink_to(Path("..") / ".." / "blobs" / "vocab")
    m = prepare(f"hf:{snapshot}", tmp_path / "hub", hf=FIXED)
    assert "vocab.txt" in m.files and (tmp_path / "hub" / "vocab.txt").read_text() == "a\nb\n"
    inside = tmp_path / "inside"
    shutil.copytree(pristine["single"], inside)
    (inside / "sub").mkdir()
    (inside / "sub" / "vocab").write_text("c\n")
    (inside / "vocab.txt").symlink_to(Path("sub") / "vocab")
    prepare(f"hf:{inside}", tmp_path / "inside-out", hf=FIXED)
    assert (tmp_path / "inside-out" / "vocab.txt").read_text() == "c\n"


def test_following_links_out_is_opt_in_and_never_widens_a_mode(folder: Path, secret: Path, tmp_path: Path):
    (folder / "vocab.txt").symlink_to(secret)
    (folder / "merges.txt").write_text("#version: 0.2\n")
    (folder / "merges.txt").chmod(0o640)
    (folder / "model.safetensors").chmod(0o600)
    follow = HFOptions(variable_shapes=False, follow_symlinks_out=True)
    old = os.umask(0o022)
    try:
        prepare(f"hf:{folder}", tmp_path / "out", hf=follow)
        (folder / "model.safetensors").chmod(0o440)
        prepare(f"hf:{folder}", tmp_path / "read-only", hf=follow)
    finally:
        os.umask(old)
    assert (tmp_path / "out" / "vocab.txt").read_text() == secret.read_text()

    def mode(name: str, out: str = "out") -> int:
        return stat.S_IMODE((tmp_path / out / name).stat().st_mode)

    assert mode("vocab.txt") == 0o600  # the secret's own bits, not 0o644
    assert mode("merges.txt") == 0o640
    assert mode("config.json") == 0o644
    assert mode("weights.safetensors") == 0o600 and mode("manifest.json") == 0o600  # from the 0600 weights
    assert mode("weights.safetensors", "read-only") == 0o640  # read as the source; its owner may still write


def test_the_copy_never_exceeds_the_umask(folder: Path, tmp_path: Path):
    (folder / "vocab.txt").write_text("a\n")
    (folder / "vocab.txt").chmod(0o666)
    old = os.umask(0o077)
    try:
        prepare(f"hf:{folder}", tmp_path / "out", hf=FIXED)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "out" / "vocab.txt").stat().st_mode) == 0o600


def test_a_fifo_in_the_folder_is_refused_not_waited_on(folder: Path, tmp_path: Path, capsys):
    os.mkfifo(folder / "vocab.txt")
    _refused(capsys, f"hf:{folder}", tmp_path / "out", f"{folder / 'vocab.txt'} is not a regular file")


# --- item 9: a config promising more than the weights or the machine hold ---------------


def _edit_config(folder: Path, **fields: object) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(fields)
    (folder / "config.json").write_text(json.dumps(config))


def _limited(gigabytes: int):
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (gigabytes * 2**30, gigabytes * 2**30))

    return limit


def test_a_config_of_a_huge_model_is_refused_before_anything_is_built(folder: Path, tmp_path: Path):
    """The probe's config (100 000 layers of 65536): one line in well under a second, in a
    process that may not allocate more than 4 GiB (it used to allocate until killed)."""
    _edit_config(folder, num_hidden_layers=100_000, hidden_size=65536)
    out = tmp_path / "out"
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "layerfit.cli", "prepare", f"hf:{folder}", "-o", str(out)],
        capture_output=True, text=True, timeout=300, check=False, preexec_fn=_limited(4),
    )
    elapsed = time.perf_counter() - started
    assert result.returncode == 2, result.stderr[-3000:]
    _one_line(result.stderr, "describes a model of at least 429,496,737,988,608 parameters",
              "num_hidden_layers 100,000, hidden_size 65,536", "the config does not belong to these weights")
    assert not out.exists()
    assert elapsed < 60, elapsed  # mostly the interpreter and transformers starting


def test_a_config_of_more_layers_than_tensors_stored_is_refused(folder: Path):
    """Small layers, so the parameter bound alone would let the meta build make 1000 of them."""
    _edit_config(folder, num_hidden_layers=1000)
    with pytest.raises(InputError, match="describes 1,000 layers and the weights present hold 21 tensors"):
        load_model(folder, FIXED)


def test_a_config_whose_exact_size_is_too_large_is_refused(folder: Path):
    """No field of the lower bound is off, but the MLP is 10 000 times wider: the count of
    a build on the meta device finds it."""
    _edit_config(folder, intermediate_size=640_000)
    started = time.perf_counter()
    with pytest.raises(InputError, match=r"describes a model of [\d,]+ parameters; the weights present hold"):
        load_model(folder, FIXED)
    assert time.perf_counter() - started < 30


def test_weights_that_do_not_fit_the_disk_or_memory_are_refused(folder: Path, monkeypatch):
    with pytest.raises(InputError, match="the output's file system has 1.0 kB free"):
        load_model(folder, FIXED, free_disk=1000)
    from layerfit.store import model_size

    monkeypatch.setattr(model_size, "available_memory", lambda: 1000)
    with pytest.raises(InputError, match="converting .* to bfloat16 holds .* in memory and 1.0 kB is available"):
        load_model(folder, HFOptions(variable_shapes=False, dtype="bfloat16"))
    load_model(folder, FIXED)  # as stored: the weights stay mapped, nothing converted


# --- item 12: JSON nested to exhaust the parser -----------------------------------------


@pytest.mark.parametrize("name", ["config.json", "generation_config.json", "model.safetensors.index.json"])
def test_deeply_nested_json_is_one_line(pristine: dict[str, Path], tmp_path: Path, capsys, name: str):
    folder = tmp_path / "model"
    shutil.copytree(pristine["sharded" if "index" in name else "single"], folder)
    (folder / name).write_text("{" * 100_000)
    _refused(capsys, f"hf:{folder}", tmp_path / "out", f"{folder / name} is not valid JSON: it nests 100,000 levels")


def test_a_config_that_is_not_json_or_too_large_is_one_line(folder: Path, tmp_path: Path, capsys):
    (folder / "config.json").write_bytes(b"\xff\xfe{}")
    _refused(capsys, f"hf:{folder}", tmp_path / "out", "config.json is not UTF-8 text")
    (folder / "config.json").write_text('{"model_type": "llama", "pad": "' + "x" * (17 * 2**20) + '"}')
    _refused(capsys, f"hf:{folder}", tmp_path / "out", "config.json is 17,825,", "more than the 16,777,216")


# --- item 10: only built-in attention ----------------------------------------------------


@pytest.mark.parametrize("value", ["kernels-community/flash-attn", "paged|kernels-community/x", "my_attention"])
def test_a_config_naming_a_hub_kernel_is_refused(folder: Path, tmp_path: Path, capsys, value: str):
    _edit_config(folder, attn_implementation=value)
    _refused(capsys, f"hf:{folder}", tmp_path / "out", "is not one built into transformers",
             "never loads a Hub kernel")


@pytest.fixture(scope="module")
def prepared(pristine: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hf_prepared") / "m"
    prepare(f"hf:{pristine['single']}", out, hf=FIXED)
    return out


def _edited_manifest(prepared: Path, tmp_path: Path, change) -> Path:
    copy = tmp_path / "edited"
    shutil.copytree(prepared, copy)
    data = json.loads((copy / "manifest.json").read_text())
    change(data["model"]["kwargs"])
    (copy / "manifest.json").write_text(json.dumps(data))
    return copy


@pytest.mark.parametrize("where", ["kwargs", "config"])
def test_a_manifest_naming_a_hub_kernel_is_refused_at_read(prepared: Path, tmp_path: Path, where: str):
    def change(kwargs: dict) -> None:
        (kwargs if where == "kwargs" else kwargs["config"])["attn_implementation"] = "kernels-community/flash-attn"

    with pytest.raises(ManifestError, match="'kernels-community/flash-attn' is not one built into transformers"):
        read_manifest(_edited_manifest(prepared, tmp_path, change))
    assert read_manifest(prepared).model["kwargs"].get("attn_implementation") in (None, "sdpa", "eager")


# --- item 13: GGUF, and a skeleton transformers cannot build ------------------------------


def test_gguf_says_what_will_work(tmp_path: Path, capsys):
    gguf = tmp_path / "tiny.Q4_K_M.gguf"
    gguf.write_bytes(b"GGUF" + bytes(64))  # never parsed
    words = ("GGUF (tiny.Q4_K_M.gguf): prepare it with", f"`layerfit prepare gguf:{gguf} -o OUT`")
    _refused(capsys, f"hf:{gguf}", tmp_path / "out", *words)
    _refused(capsys, f"hf:{tmp_path}", tmp_path / "out", *words)
    _refused(capsys, str(gguf), tmp_path / "out", str(gguf))  # read as GGUF: the reader's one line


def test_a_hugging_face_folder_without_hf_prefix_says_so(folder: Path, tmp_path: Path, capsys):
    _refused(capsys, str(folder), tmp_path / "out", f"{folder} is a Hugging Face model folder: name it hf:{folder} (`layerfit prepare hf:{folder} -o OUT`)")


def test_a_skeleton_transformers_cannot_build_is_one_short_line(prepared: Path, tmp_path: Path):
    """The probe's 'hf-factory failure': the whole config used to be the message, with a
    hint about factories; now one short line says what failed and to prepare again."""
    from layerfit.engine.skeleton import build_skeleton

    folder = _edited_manifest(prepared, tmp_path, lambda kwargs: kwargs["config"].update(hidden_act="no_such_act"))
    with pytest.raises(LayerfitError) as refused:
        build_skeleton(read_manifest(folder))
    message = str(refused.value)
    assert "cannot build LlamaForCausalLM from the manifest's 'llama' config (KeyError" in message
    assert "prepare the model again from its Hugging Face folder (prepare hf:FOLDER)" in message
    assert len(message) < 400 and "\n" not in message and "rope" not in message, message


def test_flash_attention_is_refused_where_transformers_would_fetch_a_hub_kernel_instead(prepared: Path, monkeypatch):
    """``flash_attention_2`` is built in, but without its package and with ``kernels``
    installed transformers loads ``kernels-community/flash-attn2`` in its place."""
    import importlib.util

    from layerfit.store.hf_folder import build_model

    data = read_manifest(prepared).model
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "kernels" else find_spec(name, *a))
    with pytest.raises(InputError, match="'flash_attention_2' needs its own package here"):
        build_model(data["name"], data["kwargs"]["config"], attn_implementation="flash_attention_2")
    with pytest.raises(ManifestError, match="is not one built into transformers"):
        build_model(data["name"], data["kwargs"]["config"], attn_implementation="kernels-community/flash-attn2")
    build_model(data["name"], data["kwargs"]["config"], attn_implementation="sdpa")


def test_the_python_api_refuses_links_out_too_and_takes_the_same_opt_in(folder: Path, secret: Path, tmp_path: Path):
    import layerfit
    from layerfit.store.folder_files import LinkOutOfFolderError

    (folder / "vocab.txt").symlink_to(secret)
    with pytest.raises(LinkOutOfFolderError, match="--follow-symlinks-out"):
        layerfit.from_pretrained(folder, cache=tmp_path / "cache", hf=FIXED)
    follow = HFOptions(variable_shapes=False, follow_symlinks_out=True)
    with layerfit.from_pretrained(folder, cache=tmp_path / "cache", hf=follow) as model:
        assert (model.directory / "vocab.txt").read_text() == secret.read_text()
