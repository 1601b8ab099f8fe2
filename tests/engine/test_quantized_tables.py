"""An embedding table bound as its GGML blocks: lookups equal the dequantized table's, bit for bit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from layerfit.engine.dequantize import dequantize
from layerfit.engine.quantized_tables import QuantizedTable

pytest.importorskip("gguf")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gguf_models as G  # noqa: E402

ROWS, WIDTH = 40, 256


@pytest.fixture(scope="module", params=["Q8_0", "Q4_K", "Q6_K", "F16"])
def table(request: pytest.FixtureRequest) -> tuple[torch.Tensor, str]:
    raw = G.random_blocks(request.param, ROWS, WIDTH, seed=1) if request.param != "F16" else (
        torch.randn(ROWS, WIDTH).half().view(torch.uint8).numpy())
    return torch.from_numpy(raw.reshape(-1).copy()), request.param


@settings(max_examples=40, deadline=None)
@given(ids=st.lists(st.integers(0, ROWS - 1), min_size=1, max_size=12))
def test_a_lookup_is_the_dequantized_tables_rows(table: tuple[torch.Tensor, str], ids: list[int]):
    blocks, ggml = table
    whole = dequantize(blocks, ggml, (ROWS, WIDTH), torch.float32)
    wrapped = QuantizedTable(blocks, ggml, (ROWS, WIDTH), torch.float32)
    index = torch.tensor([ids, ids[::-1]])
    assert torch.equal(F.embedding(index, wrapped), F.embedding(index, whole))


def test_an_embedding_module_runs_on_it_and_nothing_else_reads_it(table: tuple[torch.Tensor, str]):
    blocks, ggml = table
    module = torch.nn.Embedding(ROWS, WIDTH)
    module._parameters["weight"] = QuantizedTable(blocks, ggml, (ROWS, WIDTH), torch.bfloat16)
    out = module(torch.tensor([[3, 3, 7]]))
    assert out.dtype == torch.bfloat16 and out.shape == (1, 3, WIDTH)
    assert torch.equal(out[0, 0], dequantize(blocks, ggml, (ROWS, WIDTH)).to(torch.bfloat16)[3])
    with pytest.raises(IndexError):
        module(torch.tensor([ROWS]))
    with pytest.raises(NotImplementedError):
        module.weight.sum()
