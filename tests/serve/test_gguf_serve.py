"""A model prepared from a GGUF file, served: the OpenAI client gets the model's greedy
text, and the metrics say what a decoded token read from storage."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest
import torch
from serve_helpers import json_body, settings

import layerfit
from layerfit.serve.server import ServerThread
from layerfit.store import prepare

openai = pytest.importorskip("openai")
pytest.importorskip("gguf")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gguf_models as G  # noqa: E402

pytestmark = pytest.mark.timeout(300)

PROMPT = "hello world"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gguf-serve")
    gguf = G.write_gguf("llama", root / "tiny.Q4_0.gguf", ggml_type="Q4_0")
    prepare(f"gguf:{gguf}", root / "repo" / "lm")
    return root / "repo"


def _expected(folder: Path, prompt: str, n: int) -> str:
    """The prepared model's own greedy text, run by the engine as the server runs it (packed)."""
    with layerfit.from_pretrained(folder) as model, torch.no_grad():
        ids = model.tokenizer(prompt, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=n, do_sample=False, min_new_tokens=n)
        return model.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def test_an_openai_client_gets_the_gguf_models_greedy_text(repository: Path):
    with ServerThread(settings(repository, memory_budget="4MB", request_memory="4MB")) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        done = client.completions.create(model="lm", prompt=PROMPT, max_tokens=6, temperature=0)
        metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    assert done.choices[0].text == _expected(repository / "lm", PROMPT, done.usage.completion_tokens)
    per_token = [line for line in metrics.splitlines() if line.startswith('layerfit_read_bytes_per_token{model="lm"}')]
    assert per_token and float(per_token[0].split()[-1]) > 0


def _served_logits(repository: Path, ids: torch.Tensor, **overrides: object) -> torch.Tensor:
    with ServerThread(settings(repository, memory_budget="4MB", request_memory="4MB", **overrides)) as server:
        body = json_body(ids, "INT64")
        r = httpx.post(f"{server.url}/v2/models/lm/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    return torch.tensor(out["data"], dtype=torch.float32).view(out["shape"])


def test_served_dequantized_the_logits_are_transformers_own(repository: Path):
    """``--dequantize``: the server's logits are transformers' GGUF model's, bit for bit;
    packed (the default) they are not, within the packed tolerance."""
    reference, tokenizer = G.load_gguf(repository.parent / "tiny.Q4_0.gguf")
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        want = reference(ids).logits
    assert torch.equal(_served_logits(repository, ids, dequantize=True), want)
    packed = _served_logits(repository, ids)
    assert not torch.equal(packed, want)
    assert (packed - want).abs().max() <= 0.02 * (want.max() - want.min())
