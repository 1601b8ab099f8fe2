"""The image's entry point (deploy/entrypoint.py) builds ``layerfit serve``'s command line
from what the pod was given: the model folder, the cgroup's memory and CPU limits."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from deploy_files import ENTRYPOINT
from hypothesis import given
from hypothesis import strategies as st


def _load_entrypoint():
    spec = importlib.util.spec_from_file_location("layerfit_image_entrypoint", ENTRYPOINT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


entrypoint = _load_entrypoint()
NO_LIMIT = {"LAYERFIT_MEMORY_LIMIT": "off"}


def _prepared(folder: Path, weights: str = "weights.safetensors") -> Path:
    """A folder that looks prepared to the entry point (it reads the manifest's weights name only)."""
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"format": "layerfit-prepared", "weights": {"file": weights}}))
    (folder / weights).write_bytes(b"\0" * 64)
    (folder / "tokenizer.json").write_text("{}")
    return folder


@pytest.fixture(autouse=True)
def _no_cpu_quota(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The cgroup root the entry point reads CPU limits from: an empty one (no quota)."""
    root = tmp_path / "cgroup"
    root.mkdir()
    monkeypatch.setattr(entrypoint, "CGROUP_ROOT", root)
    return root


def test_a_folder_of_models_is_the_repository(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    _prepared(repository / "a")
    command = entrypoint.serve_command([f"--model-dir={repository}"], NO_LIMIT, tmp_path / "tmp")
    assert command == ["serve", "--repository", str(repository), "--host", "0.0.0.0", "--port", "8080"]


def test_one_prepared_model_is_served_under_its_name_weights_linked_files_copied(tmp_path: Path) -> None:
    model = _prepared(tmp_path / "mnt" / "models", weights="w.safetensors")
    command = entrypoint.serve_command(["--model-dir", str(model), "--model-name=mobilenet", "--warm-up"],
                                       {**NO_LIMIT, "PORT": "9000"}, tmp_path / "tmp")
    repository = Path(command[command.index("--repository") + 1])
    served = repository / "mobilenet"
    assert repository.parent == tmp_path / "tmp" and sorted(p.name for p in repository.iterdir()) == ["mobilenet"]
    assert served.is_dir() and not served.is_symlink()  # the runtime serves only folders inside its repository
    assert (served / "w.safetensors").is_symlink() and (served / "w.safetensors").resolve() == model / "w.safetensors"
    for small in ("manifest.json", "tokenizer.json"):  # tokenizer files are read only where they really lie
        assert not (served / small).is_symlink() and (served / small).read_bytes() == (model / small).read_bytes()
    assert command[-3:] == ["--port", "9000", "--warm-up"]
    again = entrypoint.serve_command([f"--model-dir={model}", "--model-name=other"], NO_LIMIT, tmp_path / "tmp")
    assert sorted(p.name for p in Path(again[again.index("--repository") + 1]).iterdir()) == ["other"]  # a restart


@pytest.mark.parametrize(("argv", "says"), [
    (["--model-dir=/nonexistent/models"], "does not exist"),
    (["--model-name=m"], "does not exist"),  # /nonexistent below: neither /mnt/models nor /models
    (["--model-dir"], "--model-dir needs a value"),
])
def test_a_setting_that_cannot_work_is_one_line(tmp_path: Path, argv: list[str], says: str,
                                                 monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(entrypoint, "KSERVE_MODEL_DIR", Path("/nonexistent/mnt/models"))
    monkeypatch.setattr(entrypoint, "VOLUME_MODEL_DIR", Path("/nonexistent/models"))
    monkeypatch.setenv("LAYERFIT_MEMORY_LIMIT", "off")
    monkeypatch.delenv("LAYERFIT_MODEL_DIR", raising=False)
    assert entrypoint.main(argv) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and err.startswith("error: ")


def test_one_model_needs_a_valid_name(tmp_path: Path) -> None:
    model = _prepared(tmp_path / "model")
    for argv, says in (([f"--model-dir={model}"], "give its name"), ([f"--model-dir={model}", "--model-name=../x"], "invalid model name")):
        with pytest.raises(entrypoint.SettingError, match=says):
            entrypoint.serve_command(argv, NO_LIMIT, tmp_path / "tmp")


def test_kserves_path_comes_before_the_volume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kserve, volume = tmp_path / "mnt" / "models", tmp_path / "models"
    volume.mkdir()
    monkeypatch.setattr(entrypoint, "KSERVE_MODEL_DIR", kserve)
    monkeypatch.setattr(entrypoint, "VOLUME_MODEL_DIR", volume)
    assert entrypoint.model_directory({}, {}) == volume
    kserve.mkdir(parents=True)
    assert entrypoint.model_directory({}, {}) == kserve
    assert entrypoint.model_directory({}, {"LAYERFIT_MODEL_DIR": "/data"}) == Path("/data")
    assert entrypoint.model_directory({"--model-dir": "/opt"}, {"LAYERFIT_MODEL_DIR": "/data"}) == Path("/opt")


def test_the_memory_limit_is_the_cgroups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import layerfit.memory_limit as memory_limit

    (tmp_path / "models").mkdir()
    argv = [f"--model-dir={tmp_path / 'models'}"]
    monkeypatch.setattr(memory_limit, "cgroup_limit_bytes", lambda: (805306368, Path("/sys/fs/cgroup/memory.max")))
    command = entrypoint.serve_command(argv, {}, tmp_path)
    assert command[command.index("--memory-limit") + 1] == "805306368B"
    assert "--memory-limit" not in entrypoint.serve_command(argv, {"LAYERFIT_MEMORY_LIMIT": "off"}, tmp_path)
    command = entrypoint.serve_command(argv, {"LAYERFIT_MEMORY_LIMIT": "1500MB"}, tmp_path)
    assert command[command.index("--memory-limit") + 1] == "1500MB"
    monkeypatch.setattr(memory_limit, "cgroup_limit_bytes", lambda: None)  # no limit set on the container
    assert "--memory-limit" not in entrypoint.serve_command(argv, {}, tmp_path)


@pytest.mark.parametrize(("files", "cores"), [
    ({"cpu.max": "250000 100000\n"}, 2),  # v2: 2.5 CPUs, whole cores
    ({"cpu.max": "50000 100000\n"}, 1),  # half a CPU: one thread
    ({"cpu.max": "max 100000\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "400000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 4),  # v1
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ({}, None),
])
def test_threads_are_the_cgroups_cpu_limit(_no_cpu_quota: Path, files: dict[str, str], cores: int | None) -> None:
    for name, text in files.items():
        (_no_cpu_quota / name).parent.mkdir(exist_ok=True)
        (_no_cpu_quota / name).write_text(text)
    assert entrypoint.cpu_limit() == cores
    command = entrypoint.serve_command([f"--model-dir={_no_cpu_quota}"], NO_LIMIT, _no_cpu_quota)
    assert (command[command.index("--threads") + 1] if "--threads" in command else None) == (
        None if cores is None else str(cores))


OWN = ["--repository", "--memory-limit", "--threads", "--host", "--port"]


@given(st.lists(st.sampled_from(OWN), unique=True), st.booleans(),
       st.lists(st.sampled_from(["--warm-up", "--verify", "--log-level=debug"])))
def test_a_serve_option_given_is_never_set_twice_and_the_rest_keep_their_order(
    chosen: list[str], equals: bool, others: list[str],
) -> None:
    """Whatever the pod's arguments give, each of the options the entry point sets appears
    once, the given value wins, and the other arguments pass through in order."""
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        (root / "cpu.max").write_text("200000 100000\n")
        given_args: list[str] = []
        for name in chosen:
            given_args += [f"{name}=given"] if equals else [name, "given"]
        argv = [f"--model-dir={root}", *given_args, *others]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(entrypoint, "CGROUP_ROOT", root)  # a quota, so --threads is set unless given
            command = entrypoint.serve_command(argv, {"LAYERFIT_MEMORY_LIMIT": "1GB"}, root)
    for name in OWN:
        assert sum(a == name or a.startswith(name + "=") for a in command) == 1, (name, command)
    assert command[len(command) - len(given_args) - len(others):] == given_args + others
