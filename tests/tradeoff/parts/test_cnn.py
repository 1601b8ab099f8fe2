"""Layer records from a traced module and from layerfit.capture agree."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from layerfit.capture import capture
from layerfit.errors import TradeoffError
from layerfit.tradeoff.parts.kernels import cnn_from_graph, cnn_from_module

from .single_thread import single_thread  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("single_thread")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, stride=2, padding="valid")
        self.dw = nn.Conv2d(6, 6, 5, padding=4, dilation=2, groups=6)
        self.pool = nn.AvgPool2d(2)
        self.fc = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        z = torch.cat([self.dw(y), y], 1)[:, :6] + 1
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.pool(z), 1), 1))


def records(cnn):
    inputs = set(cnn.graph_inputs())
    return [
        (
            layer.name, layer.kind, tuple("<in>" if n in inputs else cnn.layers[n].name for n in layer.inputs), layer.shape,
            layer.kernel, layer.stride, layer.padding, layer.dilation, layer.params, layer.macs, cnn.tileable(i),
        )
        for i, layer in enumerate(cnn.layers)
        if layer.kind != "input"
    ]


def test_capture_records_match_the_traced_module():
    model = Block().eval()
    x = torch.randn(1, 3, 21, 17)
    traced = cnn_from_module("b", model, x)
    captured = cnn_from_graph("b", capture(model, x), model)
    assert records(captured) == records(traced)
    ops = {layer.name: (layer.kind, traced.tileable(i)) for i, layer in enumerate(traced.layers)}
    assert ops["conv"] == ("conv", True) and ops["dw"] == ("conv", True)
    assert ops["cat"] == ("concat", True) and ops["getitem"] == ("other", False)
    assert ops["fc"] == ("fc", False) and ops["adaptive_avg_pool2d"] == ("global_pool", False)
    dw = traced.layers[traced.index("dw")]
    assert (dw.kernel, dw.dilation, dw.padding) == (5, 2, 4)
    assert traced.maps(traced.index("dw"))[0].extent == 9


def test_hook_captures_are_refused():
    model = Block().eval()
    graph = capture(model, torch.randn(1, 3, 21, 17), method="hooks")
    with pytest.raises(TradeoffError, match="fx"):
        cnn_from_graph("b", graph, model)


def test_a_stored_capture_gives_the_layers_of_the_module_input_names_included():
    model = Block().eval()
    x = torch.randn(1, 3, 21, 17)
    traced = cnn_from_module("b", model, x)
    captured = cnn_from_graph("b", capture(model, x), model)
    assert [layer.name for layer in captured.layers] == [layer.name for layer in traced.layers]
    assert captured.layers == traced.layers
    assert [captured.tileable(i) for i in range(len(captured.layers))] == [
        traced.tileable(i) for i in range(len(traced.layers))
    ]


def test_a_graph_of_another_model_is_refused():
    graph = capture(nn.Sequential(nn.Conv2d(3, 4, 3)).eval(), torch.randn(1, 3, 8, 8))
    with pytest.raises(TradeoffError, match="not a capture of this Block"):
        cnn_from_graph("b", graph, Block().eval())
