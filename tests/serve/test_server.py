"""The real server over the real runtime, called with tritonclient and plain httpx."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import httpx
import numpy as np
import pytest
import torch
import tritonclient.http as triton
from serve_helpers import json_body, reference
from tritonclient.utils import InferenceServerException

from layerfit.engine.osmem import is_glibc
from layerfit.serve import dataplane as dataplane_module
from layerfit.serve.server import ServerThread


@pytest.fixture(scope="module")
def client(server: ServerThread) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(urlparse(server.url).netloc, connection_timeout=30, network_timeout=30)


@pytest.fixture(scope="module")
def http(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as session:
        yield session


def infer_json(http: httpx.Client, model: str, x: torch.Tensor, datatype: str = "FP32", **extra) -> httpx.Response:
    return http.post(f"/v2/models/{model}/infer", json=json_body(x, datatype, **extra))


# --- tritonclient ------------------------------------------------------------------------


@pytest.mark.compat
def test_triton_health_and_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "layerfit"
    assert {"binary_tensor_data", "model_repository"} <= set(meta["extensions"])
    model = client.get_model_metadata("cnn")
    assert model["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [1, 3, 8, 8]}]
    assert model["outputs"] == [{"name": "output", "datatype": "FP32", "shape": [1, 10]}]
    assert client.get_model_metadata("cnn", model_version="1")["versions"] == ["1"]
    assert client.is_model_ready("chain") and not client.is_model_ready("corrupt")


@pytest.mark.compat
@pytest.mark.parametrize("model", ["chain", "cnn"])
def test_triton_binary_infer_equals_model(client: triton.InferenceServerClient, model: str) -> None:
    shape = client.get_model_metadata(model)["inputs"][0]["shape"]
    x = torch.randn(*shape)
    inp = triton.InferInput("input", shape, "FP32")
    inp.set_data_from_numpy(x.numpy(), binary_data=True)
    result = client.infer(model, [inp], request_id="r1")  # no outputs: all come back binary
    assert result.get_response()["id"] == "r1"
    assert torch.equal(torch.from_numpy(result.as_numpy("output").copy()), reference(model, x))


@pytest.mark.compat
def test_triton_json_input_and_json_output(client: triton.InferenceServerClient) -> None:
    x = torch.randn(1, 8)
    inp = triton.InferInput("input", [1, 8], "FP32")
    inp.set_data_from_numpy(x.numpy(), binary_data=False)
    out = triton.InferRequestedOutput("output", binary_data=False)
    result = client.infer("chain", [inp], outputs=[out])
    assert torch.equal(torch.from_numpy(result.as_numpy("output").copy()), reference("chain", x))


def test_triton_repository_unload_then_load(client: triton.InferenceServerClient) -> None:
    index = {row["name"]: row for row in client.get_model_repository_index()}
    assert index["chain"]["state"] == "READY" and index["corrupt"]["state"] == "UNAVAILABLE"
    assert "JSON" in index["corrupt"]["reason"]
    client.unload_model("chain")
    try:
        assert not client.is_model_ready("chain")
        inp = triton.InferInput("input", [1, 8], "FP32")
        inp.set_data_from_numpy(np.zeros((1, 8), np.float32))
        with pytest.raises(InferenceServerException) as err:
            client.infer("chain", [inp])
        assert err.value.status() == "503" and "not loaded" in err.value.message()
    finally:
        client.load_model("chain")
    assert client.is_model_ready("chain")


# --- httpx, JSON -------------------------------------------------------------------------


@pytest.mark.compat
def test_json_infer_equals_model(http: httpx.Client) -> None:
    for model, shape in (("chain", (1, 8)), ("cnn", (1, 3, 8, 8))):
        x = torch.randn(*shape)
        response = infer_json(http, model, x, id="abc")
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["model_name"] == model and body["id"] == "abc"
        (out,) = body["outputs"]
        y = torch.tensor(out["data"], dtype=torch.float32).reshape(out["shape"])
        assert out["datatype"] == "FP32" and torch.equal(y, reference(model, x))


def test_health_endpoints_and_metrics(http: httpx.Client) -> None:
    assert http.get("/v2/health/live").json() == {"live": True}
    assert http.get("/v2/health/ready").json() == {"ready": True}
    assert http.get("/v2/models/chain/versions/1/ready").status_code == 200
    infer_json(http, "chain", torch.randn(1, 8))
    text = http.get("/metrics").text
    for name in ('layerfit_requests_total{endpoint="/v2/models/{name}/infer",model="chain",status="200"}',
                 "layerfit_request_duration_seconds_bucket", "layerfit_inference_duration_seconds_count",
                 'layerfit_memory_bytes{kind="in_use"}', 'layerfit_memory_bytes{kind="budget"} 4e+06',
                 'layerfit_tasks_total{type="load"}', "layerfit_queue_length", "layerfit_inflight_requests",
                 'layerfit_queue_seconds_count{model="chain"}'):
        assert name in text, name
    if sys.platform == "linux":  # the process's RSS beside the ledger
        (rss,) = [line for line in text.splitlines() if line.startswith("process_resident_memory_bytes ")]
        assert float(rss.split()[1]) > 10e6


# --- bad input (each one) ----------------------------------------------------------------


def test_unknown_model(http: httpx.Client) -> None:
    for response in (http.get("/v2/models/nope"),
                     infer_json(http, "nope", torch.randn(1, 8)),
                     http.post("/v2/repository/models/nope/load")):
        assert response.status_code == 404
        assert "'nope' is not in the repository" in response.json()["error"]
    response = http.get("/v2/models/chain/versions/2")
    assert response.status_code == 404 and "no version '2'" in response.json()["error"]


def test_wrong_datatype_names_input_and_shape(http: httpx.Client) -> None:
    response = infer_json(http, "chain", torch.arange(8).reshape(1, 8), datatype="INT64")
    assert response.status_code == 400
    error = response.json()["error"]
    assert "input 'input'" in error and "FP32 with shape [1, 8]" in error and "INT64" in error


def test_wrong_shape_names_input_and_shape(http: httpx.Client) -> None:
    response = infer_json(http, "chain", torch.randn(2, 8))
    assert response.status_code == 400
    error = response.json()["error"]
    assert "input 'input'" in error and "shape [1, 8]" in error and "[2, 8]" in error
    response = http.post("/v2/models/chain/infer", timeout=30, json={
        "inputs": [{"name": "image", "shape": [1, 8], "datatype": "FP32", "data": [0] * 8}]})
    assert response.status_code == 400 and "takes one input, 'input'" in response.json()["error"]


def test_malformed_json(http: httpx.Client) -> None:
    for body in (b'{"inputs": [', b"[]", b'{"inputs": "x"}'):
        response = http.post("/v2/models/chain/infer", content=body)
        assert response.status_code == 400, body
        assert response.json()["error"]
    response = http.post("/v2/repository/index", content=b"{oops")
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]


def test_binary_header_length_beyond_body(http: httpx.Client) -> None:
    head = json.dumps({"inputs": [{"name": "input", "shape": [1, 8], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 32}}]}).encode()
    body = head + b"\0" * 32
    response = http.post("/v2/models/chain/infer", content=body,
                          headers={"Inference-Header-Content-Length": str(len(body) + 100)})
    assert response.status_code == 400
    assert "Inference-Header-Content-Length" in response.json()["error"]
    response = http.post("/v2/models/chain/infer", content=head + b"\0" * 16,
                          headers={"Inference-Header-Content-Length": str(len(head))})
    assert response.status_code == 400 and "binary_data_size 32 but only 16" in response.json()["error"]


def test_oversized_body(http: httpx.Client) -> None:
    big = b"x" * 100_000  # the server's limit is 64 kB
    response = http.post("/v2/models/chain/infer", content=big)
    assert response.status_code == 413 and "64.0 kB" in response.json()["error"]

    def chunks():  # no Content-Length: counted as it arrives
        for _ in range(10):
            yield b"x" * 10_000

    response = http.post("/v2/models/chain/infer", content=chunks())
    assert response.status_code == 413
    assert infer_json(http, "chain", torch.randn(1, 8)).status_code == 200


def test_infer_on_unloaded_model(http: httpx.Client) -> None:
    response = infer_json(http, "corrupt", torch.randn(1, 8))
    assert response.status_code == 503 and "not loaded" in response.json()["error"]
    assert http.get("/v2/models/corrupt/ready").status_code == 503


def test_load_corrupt_folder_others_keep_serving(http: httpx.Client) -> None:
    response = http.post("/v2/repository/models/corrupt/load")
    assert response.status_code == 400
    assert "corrupt" in response.json()["error"] and "JSON" in response.json()["error"]
    x = torch.randn(1, 8)
    response = infer_json(http, "chain", x)
    assert response.status_code == 200
    y = torch.tensor(response.json()["outputs"][0]["data"]).reshape(1, 4)
    assert torch.equal(y, reference("chain", x))


def test_names_cannot_leave_the_repository(http: httpx.Client) -> None:
    for path in ("/v2/models/..%2Fchain", "/v2/models/.hidden", "/v2/models/a%5Cb", "/v2/models/%2e%2e"):
        response = http.get(path)
        assert response.status_code in (400, 404), path
        assert "error" in response.json()
    response = http.post("/v2/repository/models/..%2F..%2Fetc/load")
    assert response.status_code in (400, 404) and "error" in response.json()


def test_unknown_endpoint_and_method(http: httpx.Client) -> None:
    response = http.get("/v2/nothing")
    assert response.status_code == 404 and "error" in response.json()
    response = http.get("/v2/models/chain/infer")
    assert response.status_code == 405 and "error" in response.json()


def test_safetensors_only(repository: Path, tmp_path: Path, make_server) -> None:
    shutil.copytree(repository / "chain", tmp_path / "chain")
    folder = tmp_path / "pickled"
    shutil.copytree(repository / "chain", folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["weights"]["file"] = "weights.pt"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "weights.safetensors").rename(folder / "weights.pt")
    running = make_server(repository=tmp_path)
    with httpx.Client(base_url=running.url, timeout=30) as session:
        index = {row["name"]: row for row in session.post("/v2/repository/index").json()}
        assert index["pickled"]["state"] == "UNAVAILABLE" and "safetensors" in index["pickled"]["reason"]
        response = session.post("/v2/repository/models/pickled/load")
        assert response.status_code == 400 and "safetensors" in response.json()["error"]
        assert infer_json(session, "chain", torch.randn(1, 8)).status_code == 200


def test_a_model_with_nothing_to_stream_is_served(tmp_path: Path, make_server) -> None:
    # No parameters: no unit to stream, the forward pass is one execute task.
    import tinymodels

    from layerfit.store import ModelSpec, prepare

    prepare(ModelSpec("factory", "tinymodels:no_weights", {}), tmp_path / "softmax", input_shape=(1, 3, 2, 2))
    running = make_server(repository=tmp_path)
    with httpx.Client(base_url=running.url, timeout=30) as session:
        assert session.get("/v2/models/softmax/ready").status_code == 200
        x = torch.randn(1, 3, 2, 2)
        response = infer_json(session, "softmax", x)
        assert response.status_code == 200, response.text
        y = torch.tensor(response.json()["outputs"][0]["data"]).reshape(1, 12)
    assert torch.equal(y, tinymodels.no_weights()(x))


@pytest.mark.parametrize("units", ["merge:64kB", "merge:auto"])
def test_merged_units_serve_exactly_with_fewer_tasks(make_server, units: str) -> None:
    running = make_server(units=units)
    with httpx.Client(base_url=running.url, timeout=30) as session:
        x = torch.randn(1, 3, 8, 8)
        response = infer_json(session, "cnn", x)
        assert response.status_code == 200, response.text
        out = response.json()["outputs"][0]
        y = torch.tensor(out["data"], dtype=torch.float32).reshape(out["shape"])
    assert torch.equal(y, reference("cnn", x))
    assert running.built is not None
    runtime = running.built.runtime
    profile, manifest = runtime.models["cnn"].profile, runtime.models["cnn"].manifest
    assert runtime.units == units and len(profile.layers) < len(manifest.units)


@pytest.mark.parametrize("cache_weights", [True, False])
def test_repeated_requests_reuse_cached_weights_by_default(make_server, cache_weights: bool) -> None:
    running = make_server() if cache_weights else make_server(cache_weights=False)  # on: the default
    x = torch.randn(1, 3, 8, 8)
    with httpx.Client(base_url=running.url, timeout=30) as session:
        for _ in range(3):
            response = infer_json(session, "cnn", x)
            assert response.status_code == 200, response.text
            out = response.json()["outputs"][0]
            assert torch.equal(torch.tensor(out["data"], dtype=torch.float32).reshape(out["shape"]), reference("cnn", x))
        metrics = session.get("/metrics").text
    assert running.built is not None
    runtime = running.built.runtime
    stats = runtime.stats()
    loads = stats["tasks_started"]["load"]
    if not cache_weights:
        assert stats["weight_cache"] is None and "layerfit_weight_cache" not in metrics
        return
    units = len(runtime.models["cnn"].profile.layers)
    cache = stats["weight_cache"]
    assert loads == 3 * units and cache["misses"] == units and cache["hits"] == 2 * units
    assert f'layerfit_weight_cache_loads_total{{result="hit"}} {float(2 * units)}' in metrics
    assert f'layerfit_memory_bytes{{kind="weight_cache"}} {float(cache["bytes"])}' in metrics


@pytest.mark.parametrize("mode", [None, "eagerly", "never"])
def test_return_freed_memory_reaches_the_runtime(make_server, mode: str | None) -> None:
    running = make_server() if mode is None else make_server(return_freed_memory=mode)
    x = torch.randn(1, 3, 8, 8)
    with httpx.Client(base_url=running.url, timeout=30) as session:
        response = infer_json(session, "cnn", x)
    assert response.status_code == 200, response.text
    out = response.json()["outputs"][0]
    assert torch.equal(torch.tensor(out["data"], dtype=torch.float32).reshape(out["shape"]), reference("cnn", x))
    assert running.built is not None
    expected = (mode or "after-pass") if is_glibc() else "never"  # after-pass: the default
    assert running.built.runtime.stats()["freed_memory"] == expected


def test_request_decoding_and_encoding_leave_no_openmp_team(make_server, monkeypatch) -> None:
    # Both run tensor operations on the server's long-lived pool threads; a team kept
    # there would halve the speed of every forward pass (tests/engine/test_openmp.py).
    released: list[str] = []

    def counting(fn):
        def run(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            finally:
                released.append(getattr(fn, "__name__", "?"))

        return run

    monkeypatch.setattr(dataplane_module, "without_thread_team", counting)
    running = make_server()
    x = torch.randn(1, 3, 8, 8)
    with httpx.Client(base_url=running.url, timeout=30) as session:
        for _ in range(2):
            response = infer_json(session, "cnn", x)
            assert response.status_code == 200, response.text
    assert released == ["_decode", "encode_response"] * 2


def test_warm_up_caches_each_model_and_keeps_a_damaged_one_unavailable(
    repository: Path, tmp_path: Path, make_server
) -> None:
    import shutil

    from layerfit.store import read_manifest

    repo = tmp_path / "repo"
    for name in ("chain", "cnn"):
        shutil.copytree(repository / name, repo / name)
    shutil.copytree(repository / "cnn", repo / "damaged")
    unit = read_manifest(repo / "damaged").units[1]
    with open(repo / "damaged" / "weights.safetensors", "r+b") as fh:  # one bit of one unit
        fh.seek(unit.offset + 4)
        byte = fh.read(1)
        fh.seek(unit.offset + 4)
        fh.write(bytes([byte[0] ^ 0x01]))

    cold = make_server(repository=repo)  # without warm-up the damage shows at the first request
    assert cold.built is not None and cold.built.load_errors == {}
    with httpx.Client(base_url=cold.url, timeout=30) as session:
        assert session.get("/v2/models/damaged/ready").status_code == 200
        assert infer_json(session, "damaged", torch.randn(1, 3, 8, 8)).status_code != 200

    running = make_server(repository=repo, warm_up=True)
    assert running.built is not None
    runtime = running.built.runtime
    assert set(running.built.load_errors) == {"damaged"}
    assert "warm-up request failed" in running.built.load_errors["damaged"]
    assert "checksum" in running.built.load_errors["damaged"]
    stats = runtime.stats()
    assert stats["jobs"]["done"] == 2 and stats["weight_cache"]["entries"] > 0  # before any client
    with httpx.Client(base_url=running.url, timeout=30) as session:
        index = {row["name"]: row for row in session.post("/v2/repository/index").json()}
        assert index["damaged"]["state"] == "UNAVAILABLE" and "checksum" in index["damaged"]["reason"]
        assert session.get("/v2/models/damaged/ready").status_code == 503
        x = torch.randn(1, 3, 8, 8)
        before = runtime.stats()["weight_cache"]
        response = infer_json(session, "cnn", x)
        assert response.status_code == 200, response.text
        out = response.json()["outputs"][0]
        assert torch.equal(torch.tensor(out["data"], dtype=torch.float32).reshape(out["shape"]), reference("cnn", x))
        after = runtime.stats()["weight_cache"]  # the first client request reads nothing
        assert after["misses"] == before["misses"]
        assert after["hits"] - before["hits"] == len(runtime.models["cnn"].profile.layers)
        # loading it again over the API warms it up again, and refuses it again
        again = session.post("/v2/repository/models/damaged/load")
        assert again.status_code == 400 and "checksum" in again.json()["error"]
        assert session.get("/v2/models/damaged/ready").status_code == 503
