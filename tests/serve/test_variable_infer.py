"""``infer`` on text models at any batch and sequence length the model accepts.

A Hugging Face decoder and encoder served with ``-1`` in their metadata answer requests of
shapes they were not prepared with, bit for bit as transformers itself, under the outputs'
own names; the runtime's ledger holds each request's activations at its actual shape
(measured at prepare time); a sequence past the positions, or a batch whose activations
cannot fit the budget, is a 413 naming why; inputs whose lengths disagree are a 400."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import transformers
import tritonclient.http as triton
from generate_helpers import CONFIG
from serve_helpers import settings

from layerfit.serve.server import ServerThread
from layerfit.store import prepare, read_manifest

pytestmark = pytest.mark.timeout(180)

BERT = {"vocab_size": 80, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 64, "type_vocab_size": 2}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, transformers.PreTrainedModel]]:
    root = tmp_path_factory.mktemp("variable")
    torch.manual_seed(0)
    built = {"lm": transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval(),
             "enc": transformers.BertModel(transformers.BertConfig(**BERT)).eval()}
    for name, model in built.items():
        model.save_pretrained(root / f"hf-{name}")
        prepare("hf:" + str(root / f"hf-{name}"), root / "repo" / name)
    return root / "repo", built


@pytest.fixture(scope="module")
def server(models) -> Iterator[ServerThread]:
    with ServerThread(settings(models[0], memory_budget="4MB", max_body="1MB")) as running:
        yield running


def infer(server: ServerThread, model: str, **inputs: np.ndarray) -> triton.InferResult:
    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    sent = []
    for name, array in inputs.items():
        tensor = triton.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array)
        sent.append(tensor)
    return client.infer(model, sent)


def test_metadata_shows_the_varying_axes_and_the_models_output_names(server):
    lm = httpx.get(f"{server.url}/v2/models/lm").json()
    assert lm["inputs"] == [{"name": "input", "datatype": "INT64", "shape": [-1, -1]}]
    assert lm["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, -1, 64]}]
    enc = httpx.get(f"{server.url}/v2/models/enc").json()
    assert {i["name"]: i["shape"] for i in enc["inputs"]} == {
        "input_ids": [-1, -1], "attention_mask": [-1, -1], "token_type_ids": [-1, -1]}
    assert [(o["name"], o["shape"]) for o in enc["outputs"]] == [
        ("last_hidden_state", [-1, -1, 32]), ("pooler_output", [-1, 32])]


@pytest.mark.parametrize("shape", [(1, 1), (2, 10), (1, 64), (3, 7)])
def test_a_decoder_answers_any_shape_as_transformers(server, models, shape):
    x = torch.randint(0, 64, shape, generator=torch.Generator().manual_seed(sum(shape)))
    result = infer(server, "lm", input=x.numpy())
    with torch.no_grad():
        expected = models[1]["lm"](x).logits
    assert torch.equal(torch.from_numpy(result.as_numpy("logits").copy()), expected)


def test_an_encoder_answers_any_shape_under_its_output_names(server, models):
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 80, (2, 13), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # a padded second sequence
    types = torch.randint(0, 2, (2, 13), generator=gen)
    result = infer(server, "enc", input_ids=ids.numpy(), attention_mask=mask.numpy(), token_type_ids=types.numpy())
    with torch.no_grad():
        expected = models[1]["enc"](input_ids=ids, attention_mask=mask, token_type_ids=types)
    assert torch.equal(torch.from_numpy(result.as_numpy("last_hidden_state").copy()), expected.last_hidden_state)
    assert torch.equal(torch.from_numpy(result.as_numpy("pooler_output").copy()), expected.pooler_output)


def test_the_ledger_holds_the_activations_of_the_requests_shape(server, models):
    shapes = read_manifest(models[0] / "lm").variable_shapes
    runtime = server.built.dataplane.runtime
    before = runtime.stats()["peak_bytes"]
    infer(server, "lm", input=np.zeros((12, 64), dtype=np.int64))
    after = runtime.stats()["peak_bytes"]
    grown = shapes.activation_bytes({"batch": 12, "sequence": 64}) - shapes.prepared_activation_bytes()
    assert after >= before + grown > before


def test_a_sequence_past_the_positions_is_413(server):
    r = httpx.post(f"{server.url}/v2/models/lm/infer", json={
        "inputs": [{"name": "input", "shape": [1, 65], "datatype": "INT64", "data": [0] * 65}]})
    assert r.status_code == 413 and "64 positions" in r.json()["error"]


def test_a_batch_whose_activations_cannot_fit_the_budget_is_413(server):
    with pytest.raises(triton.InferenceServerException) as refused:
        infer(server, "lm", input=np.zeros((400, 64), dtype=np.int64))
    assert refused.value.status() == "413"
    assert "memory budget" in refused.value.message() and "fewer or shorter" in refused.value.message()
    assert infer(server, "lm", input=np.zeros((1, 4), dtype=np.int64)).as_numpy("logits").shape == (1, 4, 64)


def test_keyword_inputs_of_different_lengths_are_400(server):
    r = httpx.post(f"{server.url}/v2/models/enc/infer", json={"inputs": [
        {"name": "input_ids", "shape": [1, 5], "datatype": "INT64", "data": [1] * 5},
        {"name": "attention_mask", "shape": [1, 4], "datatype": "INT64", "data": [1] * 4},
        {"name": "token_type_ids", "shape": [1, 5], "datatype": "INT64", "data": [0] * 5}]})
    assert r.status_code == 400 and "must be equal" in r.json()["error"]


@pytest.mark.parametrize("shape", [[1, 0], [0, 3], [2], [1, 2, 3]])
def test_an_empty_axis_or_another_rank_is_400(server, shape):
    count = int(np.prod(shape))
    r = httpx.post(f"{server.url}/v2/models/lm/infer", json={
        "inputs": [{"name": "input", "shape": shape, "datatype": "INT64", "data": [0] * count}]})
    assert r.status_code == 400 and "-1: any size from 1" in r.json()["error"]
