"""A model prepared from keyword arguments (Whisper: features and decoder ids) over the
real server: an input for each, by its name, in any order; its outputs are
``model(**kwargs)``'s; a request without one of them is a 400 that names both."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import httpx
import numpy as np
import pytest
import tinymodels
import torch
import tritonclient.http as triton
from serve_helpers import settings

from layerfit.engine import flat_outputs
from layerfit.serve.server import ServerThread
from layerfit.store import example_input, prepare


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("speech")
    example = {"input_features": example_input((1, 8, 32), seed=6), "decoder_input_ids": torch.tensor([[0, 5, 7]])}
    prepare("tinymodels:tiny_whisper", root / "whisper", example=example)
    # warm-up runs the model's example call (a mapping of both) before it counts as ready
    with ServerThread(settings(root, warm_up=True)) as running:
        yield running


@pytest.fixture(scope="module")
def http(server: ServerThread) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as session:
        yield session


def call(seed: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 100, (1, 3), generator=torch.Generator().manual_seed(seed))
    return {"input_features": example_input((1, 8, 32), seed=seed), "decoder_input_ids": ids}


def expected(kwargs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad():
        return flat_outputs(tinymodels.tiny_whisper()(**kwargs))  # logits, the encoder's output


def as_json(name: str, x: torch.Tensor) -> dict:
    datatype = "INT64" if x.dtype == torch.int64 else "FP32"
    return {"name": name, "shape": list(x.shape), "datatype": datatype, "data": x.reshape(-1).tolist()}


def test_metadata_lists_an_input_per_keyword(server: ServerThread, http: httpx.Client) -> None:
    assert server.built is not None and server.built.load_errors == {}
    meta = http.get("/v2/models/whisper").json()
    assert meta["inputs"] == [
        {"name": "input_features", "datatype": "FP32", "shape": [1, 8, 32]},
        {"name": "decoder_input_ids", "datatype": "INT64", "shape": [1, 3]},
    ]
    assert meta["outputs"] == [
        {"name": "logits", "datatype": "FP32", "shape": [1, 3, 100]},
        {"name": "encoder_last_hidden_state", "datatype": "FP32", "shape": [1, 16, 32]},
    ]


def test_tritonclient_binary_inputs_give_the_models_outputs(server: ServerThread) -> None:
    client = triton.InferenceServerClient(urlparse(server.url).netloc, connection_timeout=30, network_timeout=30)
    kwargs = call(3)
    inputs = []
    for name, datatype in (("decoder_input_ids", "INT64"), ("input_features", "FP32")):  # not the prepared order
        inp = triton.InferInput(name, list(kwargs[name].shape), datatype)
        inp.set_data_from_numpy(kwargs[name].numpy(), binary_data=True)
        inputs.append(inp)
    result = client.infer("whisper", inputs)
    got = [torch.from_numpy(np.array(result.as_numpy(name))) for name in ("logits", "encoder_last_hidden_state")]
    assert all(torch.equal(a, b) for a, b in zip(got, expected(kwargs), strict=True))


def test_json_inputs_give_the_models_outputs(http: httpx.Client) -> None:
    kwargs = call(4)
    body = {"inputs": [as_json(name, x) for name, x in kwargs.items()]}
    response = http.post("/v2/models/whisper/infer", json=body)
    assert response.status_code == 200, response.text
    outputs = response.json()["outputs"]
    got = [torch.tensor(o["data"], dtype=torch.float32).reshape(o["shape"]) for o in outputs]
    assert all(torch.equal(a, b) for a, b in zip(got, expected(kwargs), strict=True))


TAKES = (
    "model 'whisper' takes 2 inputs, 'input_features' (FP32 with shape [1, 8, 32]), "
    "'decoder_input_ids' (INT64 with shape [1, 3]); the request has "
)


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["input_features"], TAKES + "'input_features'"),
        (["input_features", "decoder_input_ids", "input_features"],
         TAKES + "'input_features', 'decoder_input_ids', 'input_features'"),
        (["input", "decoder_input_ids"], TAKES + "'input', 'decoder_input_ids'"),
    ],
)
def test_a_request_without_each_input_once_is_refused(http: httpx.Client, names: list[str], message: str) -> None:
    kwargs = call(5)
    body = {"inputs": [as_json(name, kwargs.get(name, kwargs["input_features"])) for name in names]}
    response = http.post("/v2/models/whisper/infer", json=body)
    assert response.status_code == 400 and response.json()["error"] == message
    assert http.post("/v2/models/whisper/infer", json={"inputs": [as_json(n, x) for n, x in kwargs.items()]}).status_code == 200


def test_an_input_of_the_wrong_datatype_is_refused_by_its_name(http: httpx.Client) -> None:
    kwargs = {**call(6), "decoder_input_ids": torch.zeros(1, 3)}
    response = http.post("/v2/models/whisper/infer", json={"inputs": [as_json(n, x) for n, x in kwargs.items()]})
    assert response.status_code == 400
    assert response.json()["error"] == (
        "input 'decoder_input_ids' of model 'whisper' must be INT64 with shape [1, 3]; "
        "the request sent FP32 with shape [1, 3]"
    )


def test_the_model_keeps_its_single_input_name_when_prepared_from_one_tensor(tmp_path: Path) -> None:
    from layerfit.serve.registry import signature_of
    from layerfit.store import ModelSpec

    manifest = prepare(ModelSpec("factory", "tinymodels:tiny_cnn", {}), tmp_path / "cnn", input_shape=(1, 3, 8, 8))
    signature = signature_of(manifest)
    assert [s.name for s in signature.inputs] == ["input"] and not signature.keywords
