"""Non-finite outputs in JSON responses: always strict JSON (RFC 8259), NaN and ±inf as
the strings "NaN", "Infinity" and "-Infinity", read back by tritonclient unchanged."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

import httpx
import numpy as np
import pytest
import tinymodels
import torch
import tritonclient.http as triton

from layerfit.serve.server import ServerThread
from layerfit.store import ModelSpec, prepare

LINEAR = {"widths": [4, 8], "pause": 0.0}  # one Linear: ±inf in, NaN and ±inf out
INF = float("inf")
X = torch.tensor([[INF, -INF, 0.0, 0.0]])


def strict_json(text: str) -> dict:
    """Parse as strict parsers (JSON.parse) do: no bare NaN or Infinity tokens."""
    def refuse(token: str) -> None:
        raise AssertionError(f"the response is not strict JSON: bare {token}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def linear_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("nonfinite")
    prepare(ModelSpec("factory", "tinymodels:chain_with_pauses", LINEAR), root / "linear", input_shape=(1, 4))
    return root


@pytest.fixture()
def expected() -> torch.Tensor:
    with torch.no_grad():
        y = tinymodels.chain_with_pauses(**LINEAR).eval()(X)
    assert y.isnan().any() and (y == INF).any() and (y == -INF).any()
    return y


def values(data: list) -> torch.Tensor:
    return torch.tensor([float(v) for v in data]).reshape(1, 8)


def test_nonfinite_outputs_are_strict_json(
    linear_repository: Path, make_server: Callable[..., ServerThread], expected: torch.Tensor
) -> None:
    running = make_server(repository=linear_repository)
    for data in (["Infinity", "-Infinity", 0, 0], X.reshape(-1).tolist()):  # strings, or bare tokens
        body = {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": data}]}
        response = httpx.post(f"{running.url}/v2/models/linear/infer", timeout=30,
                              content=json.dumps(body), headers={"content-type": "application/json"})
        assert response.status_code == 200, response.text
        out = strict_json(response.text)["outputs"][0]["data"]
        assert {v for v in out if isinstance(v, str)} == {"NaN", "Infinity", "-Infinity"}
        torch.testing.assert_close(values(out), expected, rtol=0, atol=0, equal_nan=True)


def test_tritonclient_reads_nonfinite_json_outputs(
    linear_repository: Path, make_server: Callable[..., ServerThread], expected: torch.Tensor
) -> None:
    running = make_server(repository=linear_repository)
    client = triton.InferenceServerClient(urlparse(running.url).netloc, connection_timeout=30, network_timeout=30)
    for binary_input in (True, False):
        inp = triton.InferInput("input", [1, 4], "FP32")
        inp.set_data_from_numpy(X.numpy(), binary_data=binary_input)
        result = client.infer("linear", [inp], outputs=[triton.InferRequestedOutput("output", binary_data=False)])
        np.testing.assert_array_equal(result.as_numpy("output"), expected.numpy())
