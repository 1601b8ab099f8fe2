"""Weights that change on disk after their first check: found (each read, or by the
periodic re-verification), the model taken out of service (503, not ready) until it is
loaded again; a reload that fails leaves the version before it serving."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import torch
from serve_helpers import json_body, reference, settings, wait_until

from layerfit.serve.server import ServerThread
from layerfit.store import read_manifest


@pytest.fixture()
def repo(repository: Path, tmp_path: Path) -> Path:
    """A private copy of the chain model: the tests change its files."""
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copytree(repository / "chain", root / "chain")
    return root


@pytest.fixture()
def start(repo: Path) -> Iterator[Callable[..., ServerThread]]:
    started: list[ServerThread] = []

    def make(**overrides: object) -> ServerThread:
        running = ServerThread(settings(repo, cache_weights=False, **overrides)).start()
        started.append(running)
        return running

    yield make
    for running in started:
        running.stop()


def flip_a_weight_byte(folder: Path) -> None:
    """Flip one byte of the first unit's weights and put the modification time back."""
    manifest = read_manifest(folder)
    path = folder / manifest.weights_file
    before = path.stat()
    offset = manifest.units[0].offset + 5
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x40]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def infer(http: httpx.Client, x: torch.Tensor) -> httpx.Response:
    return http.post("/v2/models/chain/infer", json=json_body(x))


def output(response: httpx.Response) -> torch.Tensor:
    return torch.tensor(response.json()["outputs"][0]["data"]).reshape(1, 4)


def state(http: httpx.Client) -> dict:
    return {m["name"]: m for m in http.post("/v2/repository/index").json()}["chain"]


def test_verify_always_takes_a_model_with_changed_weights_out_of_service(start, repo: Path) -> None:
    server = start(verify="always")
    x = torch.randn(1, 8)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert infer(http, x).status_code == 200
        flip_a_weight_byte(repo / "chain")
        response = infer(http, x)
        assert response.status_code == 503, response.text
        assert "checksum mismatch" in response.json()["error"]
        assert http.get("/v2/models/chain/ready").status_code == 503
        assert state(http)["state"] == "UNAVAILABLE" and "failed verification" in state(http)["reason"]
        assert infer(http, x).status_code == 503  # until it is loaded again
        # loading reads no unit (its first read checks it): still corrupt, out of service again
        assert http.post("/v2/repository/models/chain/load").status_code == 200
        assert infer(http, x).status_code == 503
        assert state(http)["state"] == "UNAVAILABLE"


def test_verify_first_misses_the_change_that_reverification_finds(start, repo: Path) -> None:
    server = start(verify="first", reverify_every=0.3)
    x = torch.randn(1, 8)
    expected = reference("chain", x)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert infer(http, x).status_code == 200
        flip_a_weight_byte(repo / "chain")
        wait_until(lambda: state(http)["state"] == "UNAVAILABLE", timeout=20)
        assert "re-verification" in state(http)["reason"]
        assert infer(http, x).status_code == 503
        assert server.built.reverifier.failures == 1
        # put the byte back and load it again: READY, the model's outputs
        flip_a_weight_byte(repo / "chain")
        assert http.post("/v2/repository/models/chain/load").status_code == 200
        response = infer(http, x)
        assert response.status_code == 200
        assert torch.equal(output(response), expected)


def test_verify_first_alone_serves_a_changed_unit_from_its_first_check(start, repo: Path) -> None:
    """Why --verify always and --reverify-every exist: with neither, a change after the
    first read goes unnoticed (the defect the probe found), now a documented choice."""
    server = start(verify="first")
    x = torch.randn(1, 8)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert infer(http, x).status_code == 200
        flip_a_weight_byte(repo / "chain")
        response = infer(http, x)
        assert response.status_code == 200
        assert not torch.equal(output(response), reference("chain", x))


def test_a_failed_reload_keeps_the_loaded_version_serving(start, repo: Path) -> None:
    server = start()
    x = torch.randn(1, 8)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert infer(http, x).status_code == 200
        (repo / "chain" / "manifest.json").write_text('{"format": "layerfit-prepared", "vers')
        response = http.post("/v2/repository/models/chain/load")
        assert response.status_code == 400
        assert "keeps serving" in response.json()["error"]
        assert state(http)["state"] == "READY"
        assert http.get("/v2/models/chain/ready").status_code == 200
        assert infer(http, x).status_code == 200


def test_a_weights_file_replaced_under_a_ready_model_is_503_not_400(start, repo: Path) -> None:
    server = start()
    x = torch.randn(1, 8)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert infer(http, x).status_code == 200
        path = repo / "chain" / "weights.safetensors"
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # touched: another file now
        response = infer(http, x)
        assert response.status_code == 503, response.text  # the server's state, not the client's fault
        assert "changed on disk" in response.json()["error"]
        assert http.get("/v2/models/chain/ready").status_code == 503
        assert state(http)["state"] == "UNAVAILABLE"
        assert http.post("/v2/repository/models/chain/load").status_code == 200  # loaded again: serves
        assert infer(http, x).status_code == 200
