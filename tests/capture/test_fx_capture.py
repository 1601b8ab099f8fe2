"""The shared fx trace: node names are op names, and which node holds which tensor."""

from __future__ import annotations

import torch
from torch import nn

from layerfit.capture import capture
from layerfit.capture.activations import fx_trace, run_fx


class Split(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.conv(x).chunk(2, dim=1)  # a tuple of two tensors
        return (a + b).view(x.size(0), -1)  # a size lookup: an int, no tensor


def test_run_fx_records_what_capture_records_and_names_each_nodes_tensor() -> None:
    model = Split().eval()
    x = torch.randn(1, 3, 5, 5)
    captured = run_fx(fx_trace(model), (x,))
    graph = capture(model, x)
    assert [(o.name, o.inputs, o.outputs) for o in captured.ops] == [(o.name, o.inputs, o.outputs) for o in graph.ops]
    assert [t.shape for t in captured.tensors] == [t.shape for t in graph.tensors]
    names = {node.name for node in captured.module.graph.nodes}
    assert {o.name for o in captured.ops} <= names
    tensor_of = captured.tensor_of
    assert captured.tensors[tensor_of["x"]].shape == (1, 3, 5, 5)
    assert captured.tensors[tensor_of["conv"]].shape == (1, 4, 5, 5)
    assert "chunk" not in tensor_of  # a tuple: its parts are the getitem nodes'
    assert captured.tensors[tensor_of["getitem"]].shape == (1, 2, 5, 5)
    assert "size" not in tensor_of
    assert captured.tensors[tensor_of["view"]].shape == (1, 50)
