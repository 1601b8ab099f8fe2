"""Two-stage pipelined execution with a double-buffered edge."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from layerfit.errors import TradeoffError
from layerfit.tradeoff.parts.kernels import cnn_from_module
from layerfit.tradeoff.parts.pipeline import TwoStagePipeline

from .single_thread import single_thread  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("single_thread")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        return self.head(self.block(y) + y)


def frames(n: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(1, 3, 20, 20, generator=gen) for _ in range(n)]


@pytest.mark.parametrize("parts", ["none", "all"])
def test_pipeline_outputs_equal_the_model(parts):
    torch.manual_seed(0)
    model = Net().eval()
    cnn = cnn_from_module("net", model, frames(1)[0])
    cut = cnn.index("block_1")  # cut inside the residual block: two tensors cross
    pipeline = TwoStagePipeline(cnn, cut, parts)
    assert len(pipeline.first.stage.outputs) == 2
    inputs = frames(6)
    with torch.no_grad():
        reference = [model(x) for x in inputs]
    for out, ref in zip(pipeline.run(inputs), reference, strict=True):
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(pipeline.run(inputs), pipeline.run_sequential(inputs), strict=True):
        assert torch.equal(a, b)


def test_the_double_buffered_edge_holds_the_tensors_crossing_the_cut():
    model = Net().eval()
    cnn = cnn_from_module("net", model, frames(1)[0])
    assert TwoStagePipeline(cnn, "block_0").edge_bytes() == 8 * 20 * 20 * 4


def test_errors_in_a_stage_reach_the_caller():
    model = Net().eval()
    cnn = cnn_from_module("net", model, frames(1)[0])
    pipeline = TwoStagePipeline(cnn, "block_0")
    with pytest.raises(RuntimeError):
        pipeline.run([torch.randn(1, 5, 20, 20)])
    with pytest.raises(TradeoffError, match="cut"):
        TwoStagePipeline(cnn, 0)
