"""A prepared folder cannot run code: its manifest names the zoo, or a factory the
person running layerfit trusted; never one that a file or a request chose."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from layerfit.engine import load
from layerfit.errors import LayerfitError
from layerfit.store import prepare
from layerfit.store.model_spec import ModelSpec
from layerfit.store.trust import (
    UntrustedFactoryError,
    check_module_name,
    is_trusted,
    trust_factories,
)

TESTS = Path(__file__).resolve().parents[1]


@pytest.fixture()
def untrusted(monkeypatch: pytest.MonkeyPatch) -> None:
    """No module trusted: neither the test suite's environment nor this process's list."""
    from layerfit.store import trust

    monkeypatch.delenv(trust.ENVIRONMENT, raising=False)
    monkeypatch.setattr(trust, "_trusted", set())


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("trust") / "chain"
    prepare(ModelSpec("factory", "tinymodels:chain", {"widths": [4, 8, 2]}), out, input_shape=(1, 4))
    return out


def booby_trapped(chain: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of ``chain`` whose manifest names ``os:system`` to create a marker file."""
    folder = tmp_path / "evil"
    shutil.copytree(chain, folder)
    marker = tmp_path / "pwned"
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["model"] = {"source": "factory", "name": "os:system", "kwargs": {"command": f"touch {marker}"}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder, marker


def cli(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    child = {k: v for k, v in os.environ.items() if k != "LAYERFIT_TRUST_FACTORY"} | (env or {})
    child["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "layerfit.cli", *argv], capture_output=True, text=True,
                          env=child, timeout=300, check=False)


def test_a_manifest_naming_os_system_runs_nothing(chain: Path, tmp_path: Path) -> None:
    folder, marker = booby_trapped(chain, tmp_path)
    for argv in (["run", str(folder)], ["inspect", str(folder), "--budget", "50%"],
                 ["--trust-factory", "tinymodels", "run", str(folder)]):
        result = cli(*argv)
        assert not marker.exists(), argv
        if argv[0] != "inspect":
            assert result.returncode == 2, (argv, result.stderr)
            assert "Traceback" not in result.stderr
            assert len(result.stderr.strip().splitlines()) == 1
            assert "'os:system'" in result.stderr and "--trust-factory os" in result.stderr


def test_a_server_never_runs_an_untrusted_factory(chain: Path, tmp_path: Path, untrusted: None) -> None:
    import httpx

    from layerfit.serve.server import ServerThread, ServeSettings

    repository = tmp_path / "repo"
    repository.mkdir()
    folder, marker = booby_trapped(chain, tmp_path)
    shutil.move(folder, repository / "evil")
    settings = ServeSettings(repository=repository, memory_budget="4MB", port=0, trust_factory=("tinymodels",))
    with ServerThread(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        index = {m["name"]: m for m in http.post("/v2/repository/index").json()}
        assert index["evil"]["state"] == "UNAVAILABLE"
        assert "--trust-factory os" in index["evil"]["reason"]
        loaded = http.post("/v2/repository/models/evil/load")  # a request cannot trust it either
        assert loaded.status_code >= 400
        assert "--trust-factory os" in loaded.json()["error"]
    assert not marker.exists()


def test_a_trusted_factory_runs_and_an_untrusted_one_is_refused(chain: Path, untrusted: None) -> None:
    with pytest.raises(UntrustedFactoryError, match=r"trust_factory=\['tinymodels'\]"):
        load(chain)
    x = torch.ones(1, 4)
    with load(chain, trust_factory=["tinymodels"]) as engine:  # trusted for the process from now on
        assert engine(x).shape == (1, 2)
    assert is_trusted("tinymodels:chain")


def test_trust_covers_a_module_and_those_under_it_only(untrusted: None) -> None:
    trust_factories(["mypkg"])
    assert is_trusted("mypkg:build") and is_trusted("mypkg.models.vision:build")
    assert not is_trusted("mypkgevil:build") and not is_trusted("os:system")


def test_the_environment_trusts_a_comma_list(untrusted: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAYERFIT_TRUST_FACTORY", " a.b , c ")
    assert is_trusted("a.b.c:f") and is_trusted("c:f") and not is_trusted("a:f")


@pytest.mark.parametrize("name", ["", "os:system", "a..b", "1abc", "a b", "a/b", "../x"])
def test_a_trusted_module_must_be_a_module_name(name: str) -> None:
    with pytest.raises(LayerfitError, match="--trust-factory takes a module name"):
        check_module_name(name)
