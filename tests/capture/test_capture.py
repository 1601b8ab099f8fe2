"""Capture: units in execution order with s/d/f, usage records, resident tensors, JSON."""

from __future__ import annotations

import pytest
import tinymodels
import torch
from torch import nn

from layerfit.capture import capture
from layerfit.capture.graph import ModelGraph
from layerfit.errors import CaptureError


def test_units_in_execution_order_with_sizes_depth_and_macs():
    model = tinymodels.tiny_cnn().eval()
    g = capture(model, torch.randn(1, 3, 16, 16))
    assert g.method == "fx"
    assert [u.name for u in g.units] == ["conv1", "bn1", "conv2", "bn2", "conv3", "fc"]
    conv1 = g.units[0]
    assert conv1.s == (16 * 3 * 9 + 16) * 4
    assert conv1.d == 2
    assert conv1.f == 16 * 16 * 16 * 3 * 9  # output elements x (in/groups) x kernel
    assert g.units[-1].f == 10 * 32
    assert g.units[1].d == 5  # weight, bias, running_mean, running_var, num_batches_tracked
    assert g.total_param_bytes == sum(p.numel() * p.element_size() for p in model.state_dict().values())


def test_usage_records_follow_producers_and_last_readers():
    model = tinymodels.tiny_cnn().eval()
    g = capture(model, torch.randn(1, 3, 16, 16))
    produced = {t: op.index for op in g.ops for t in op.outputs}
    for op in g.ops:
        for t in op.inputs:
            rec = g.tensors[t]
            assert rec.first_op <= op.index <= rec.last_op
    for t in g.tensors:
        if t.id in produced:
            assert t.first_op == produced[t.id]
        assert t.nbytes == int(torch.tensor(t.shape).prod()) * 4
    # the residual input y (relu output) stays alive across the second branch
    out = g.tensors[-1]
    assert out.last_op == len(g.ops) - 1
    assert any(op.inplace for op in g.ops)  # relu/bn may write over their input
    assert any(t.alias_of is not None for t in g.tensors)  # flatten is a view


def test_tied_parameter_is_resident_stored_once_and_bound_everywhere():
    model = tinymodels.tied_lm().eval()
    g = capture(model, torch.randint(0, 50, (1, 8)))
    names = {r.name: r for r in g.resident}
    assert set(names) == {"pos", "embed.weight"}
    assert set(names["embed.weight"].places) == {"embed.weight", "head.weight"}
    streamed = [p.name for u in g.units for p in u.params]
    assert "head.weight" not in streamed and "embed.weight" not in streamed
    assert [u.name for u in g.units] == ["block.0", "block.2", "norm"]


def test_hook_fallback_for_untraceable_model():
    class DataDependent(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 2)

        def forward(self, x):
            h = self.a(x)
            if h.sum() > -1e9:  # data-dependent branch: fx cannot trace this
                h = torch.relu(h)
            return self.b(h)

    g = capture(DataDependent(), torch.randn(2, 4))
    assert g.method == "hooks"
    assert [u.name for u in g.units] == ["a", "b"]
    assert len(g.ops) == 2
    with pytest.raises(CaptureError):
        capture(DataDependent(), torch.randn(2, 4), method="fx")


def test_keyword_inputs_use_hooks_and_unused_modules_are_reported():
    class KW(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = nn.Linear(3, 3)
            self.spare = nn.Linear(3, 3)

        def forward(self, input_ids=None):
            return self.used(input_ids)

    g = capture(KW(), {"input_ids": torch.randn(1, 3)})
    assert g.method == "hooks"
    assert g.unused == ["spare.bias", "spare.weight"]


def test_graph_round_trips_through_json():
    g = capture(tinymodels.tied_lm().eval(), torch.randint(0, 50, (1, 8)))
    assert ModelGraph.from_json(g.to_json()) == g


def test_bad_example_input_is_a_clear_error():
    with pytest.raises(CaptureError, match="example input"):
        capture(tinymodels.tiny_cnn(), 3)


def test_weights_used_while_their_module_is_not_running_stay_resident():
    # Streamed, each would be unbound (meta) or overwritten by the next unit's bytes when
    # the parent uses it: see tinymodels.OutsideReads for the four ways.
    g = capture(tinymodels.outside_reads().eval(), torch.randn(2, 8))
    reasons = {r.name: r.reason for r in g.resident}
    assert set(reasons) == {"embed.weight", "table.w", "holder.scale", "fc.bias"}
    assert reasons["embed.weight"].startswith("read outside its module's forward")
    assert reasons["holder.scale"].startswith("read outside its module's forward")
    assert reasons["table.w"] == reasons["fc.bias"] == "a view of it leaves its module's forward"
    assert [(u.name, [p.name for p in u.params]) for u in g.units] == [
        ("embed", ["embed.bias"]),
        ("mid", ["mid.weight", "mid.bias"]),
        ("fc", ["fc.weight"]),
    ]
    assert g.unused == []  # holder never runs, but its weight is read


def test_reading_a_weights_metadata_outside_its_module_keeps_it_streamed():
    class DtypeProbe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)

        def forward(self, x):
            # What many models do (``self.dtype``): metadata only, a meta tensor answers it.
            w = self.a.weight
            assert w.shape[0] == w.size(0) == len(w) and w.dim() == 2 and w.numel() == 16
            return self.a(x.to(w.dtype))

    g = capture(DtypeProbe().eval(), torch.randn(2, 4))
    assert g.resident == []
    assert [u.name for u in g.units] == ["a"]
