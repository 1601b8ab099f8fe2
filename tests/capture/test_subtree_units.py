"""Subtree units: tensors used where their own module does not run stream with the
smallest ancestor that runs once and runs at every use, instead of staying resident.

Attention is the common case: nn.MultiheadAttention owns ``in_proj_weight`` next to its
child ``out_proj`` and reads ``out_proj.weight`` from its own forward, so both used to
stay resident (a third of a Transformer's weights). Each capture below is also streamed
and compared bit for bit with ``model(x)``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import tinymodels
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from layerfit.capture import capture
from layerfit.capture.graph import ModelGraph
from layerfit.engine import load
from layerfit.store import prepare, read_manifest
from layerfit.store.model_spec import ModelSpec

WIDTH = 16


def _streams_exactly(tmp_path: Path, spec: ModelSpec, shape: tuple[int, ...], more: bool = False) -> ModelGraph:
    """Prepare ``spec``, run it at its minimum budget (every unit read alone, released
    before the next) and with two buffers, and with ``more`` also with planned
    activations, in blocks of several units and under auto with room to keep a unit;
    compare each output with ``model(x)``."""
    manifest = prepare(spec, tmp_path / "m", input_shape=shape, force=True)
    model = spec.build().eval()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(x)
    minimum = manifest.resident_bytes + manifest.largest_unit_bytes
    configs = [{"pipeline": "sequential"}, {"pipeline": "async", "budget": minimum}, {"pipeline": "sync"}]
    if more:
        configs.append({"pipeline": "async", "budget": minimum, "activations": "planned"})
        configs.append({"pipeline": "sync", "units": "blocks:2"})  # a merged unit inside a block
        configs.append({"pipeline": "auto", "budget": minimum + manifest.largest_unit_bytes + 4096})
    for options in configs:
        with load(tmp_path / "m", **options) as engine:
            for _ in range(2):
                assert torch.equal(engine(x), expected), options
    return read_manifest(tmp_path / "m").graph


def _units(g: ModelGraph) -> dict[str, list[str]]:
    return {u.name: [p.attr for p in u.params] for u in g.units}


def test_multihead_attention_streams_as_one_unit():
    g = capture(tinymodels.attention().eval(), torch.randn(1, 5, 8))
    assert g.resident == []
    assert _units(g)["att"] == ["in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"]
    att = next(u for u in g.units if u.name == "att")
    assert att.module_type == "MultiheadAttention"
    assert att.s == sum(p.numel() * 4 for p in tinymodels.attention().att.parameters())
    assert [u.name for u in g.units] == ["inp", "att", "out"]  # execution order


def test_a_transformer_encoder_keeps_nothing_resident(tmp_path: Path):
    g = _streams_exactly(tmp_path, ModelSpec("factory", "tinymodels:transformer_encoder"), (1, 5, 8))
    assert g.resident == []
    assert [u.name for u in g.units if u.module_type == "MultiheadAttention"] == [
        "1.layers.0.self_attn",
        "1.layers.1.self_attn",
    ]
    # Everything else is still one layer per unit.
    assert "1.layers.0.linear1" in _units(g) and "1.layers.1.norm2" in _units(g)


def test_a_layer_called_several_times_streams_with_the_block_that_calls_it(tmp_path: Path):
    # The head is the largest unit, so one unit of the block costs nothing at the minimum.
    spec = ModelSpec(
        "factory", "tinymodels:nested_blocks", {"width": WIDTH, "specs": [{"reuse": 3}, {}], "head_width": 4 * WIDTH}
    )
    g = _streams_exactly(tmp_path, spec, (2, WIDTH))
    assert g.resident == []
    assert _units(g)["blocks.0"] == ["lin.weight", "lin.bias", "act.gain"]
    assert _units(g)["blocks.1.lin"] == ["weight", "bias"]  # untouched blocks stay layers


def test_the_root_is_never_one_unit(tmp_path: Path):
    # The root calls its head twice: only the whole model would cover it, so it stays
    # resident and says why.
    spec = ModelSpec("factory", "tinymodels:nested_blocks", {"width": WIDTH, "specs": [{}], "reused_head": 2})
    g = _streams_exactly(tmp_path, spec, (2, WIDTH))
    assert {r.name: r.reason for r in g.resident} == {
        "head.weight": "module runs 2 times per forward pass",
        "head.bias": "module runs 2 times per forward pass",
    }
    assert list(_units(g)) == ["blocks.0.lin"]


def test_a_block_that_runs_a_unit_from_outside_is_not_merged(tmp_path: Path):
    # block calls its parent's norm (a unit) within its own call: as one unit it would nest.
    g = _streams_exactly(tmp_path, ModelSpec("factory", "tinymodels:borrowed_module"), (2, 16))
    assert list(_units(g)) == ["block.lin", "norm", "head"]
    assert [r.name for r in g.resident] == ["block.scale"]


def test_weights_read_by_the_root_stay_resident():
    # tinymodels.OutsideReads: only the root covers embed.weight, holder.scale, table.w
    # and fc.bias (two of them leave the forward pass in its output).
    g = capture(tinymodels.outside_reads().eval(), torch.randn(2, 8))
    assert {r.name for r in g.resident} == {"embed.weight", "table.w", "holder.scale", "fc.bias"}


def test_a_block_is_merged_only_if_the_minimum_budget_shrinks():
    class Gated(nn.Module):
        """A block with a small gate of its own around layers of ``width``."""

        def __init__(self, width: int) -> None:
            super().__init__()
            self.gate = nn.Parameter(torch.ones(width))
            self.a = nn.Linear(width, width)
            self.b = nn.Linear(width, width)

        def forward(self, x):
            return self.b(torch.relu(self.a(x))) * self.gate

    class Model(nn.Module):
        def __init__(self, width: int, big: int) -> None:
            super().__init__()
            self.small = Gated(width)
            self.big = nn.Linear(width, big)

        def forward(self, x):
            return self.big(self.small(x))

    # The block (two 16x16 layers) is smaller than the 16x256 head: one unit of it costs
    # nothing at the minimum, and its gate no longer stays resident.
    g = capture(Model(16, 256).eval(), torch.randn(1, 16))
    assert g.resident == [] and _units(g)["small"] == ["gate", "a.weight", "a.bias", "b.weight", "b.bias"]
    # Here the block would be the largest unit: its 64-byte gate stays resident instead.
    g = capture(Model(16, 4).eval(), torch.randn(1, 16))
    assert [r.name for r in g.resident] == ["small.gate"]
    assert g.resident[0].reason == (  # 64 + 1088 bytes now; 64 + 2 x 1088 as one unit
        "owned by a module whose children also own tensors; streamed with small as one unit, "
        "it would raise the minimum budget from 1.2 kB to 2.2 kB"
    )
    assert list(_units(g)) == ["small.a", "small.b", "big"]


def test_tied_and_written_tensors_still_stay_resident():
    g = capture(tinymodels.tied_lm().eval(), torch.randint(0, 50, (1, 6)))
    assert any(r.reason == "shared by several modules" for r in g.resident)
    g = capture(tinymodels.running_state().eval(), torch.randn(2, 8))
    assert any(r.reason.startswith("the forward pass writes it") for r in g.resident)


_leaf_spec = st.fixed_dictionaries(
    {},
    optional={
        "scale": st.booleans(),
        "reuse": st.integers(0, 3),
        "reads": st.booleans(),
        "row": st.booleans(),
        "borrow": st.booleans(),
    },
)
_block_spec = st.recursive(_leaf_spec, lambda inner: st.builds(lambda s, i: {**s, "inner": i}, _leaf_spec, inner), max_leaves=3)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=st.lists(_block_spec, min_size=1, max_size=3), reused_head=st.integers(0, 2), wide=st.booleans())
def test_any_nesting_streams_exactly_and_stores_every_tensor_once(tmp_path: Path, specs, reused_head, wide):
    # A wide head is the largest unit, which leaves room to merge blocks.
    kwargs = {"width": WIDTH, "specs": specs, "reused_head": reused_head}
    if wide and not reused_head:
        kwargs["head_width"] = 8 * WIDTH
    spec = ModelSpec("factory", "tinymodels:nested_blocks", kwargs)
    g = _streams_exactly(tmp_path, spec, (2, WIDTH), more=True)
    # Units are disjoint subtrees: none lies inside another, so each is bound and released
    # around one module call.
    names = [u.name for u in g.units]
    assert not any(a != b and b.startswith(a + ".") for a in names for b in names)
    # Every tensor of the model is stored exactly once, streamed or resident, or reported
    # unused (the lender, where no block borrows it).
    stored = [f"{u.name}.{p.attr}" for u in g.units for p in u.params] + [r.name for r in g.resident]
    model = spec.build()
    assert sorted(stored + g.unused) == sorted(name for name, _ in model.named_parameters())
    # A block that does nothing unusual is never merged: its layer stays a unit of its own.
    for k, s in enumerate(specs):
        if not any(s.get(key) for key in ("scale", "reuse", "reads", "row", "inner", "borrow")):
            assert f"blocks.{k}.lin" in names


def test_merged_units_round_trip_through_json():
    g = capture(tinymodels.attention().eval(), torch.randn(1, 5, 8))
    again = ModelGraph.from_json(g.to_json())
    assert again.units == g.units


@pytest.mark.parametrize("pipeline", ["sync", "async"])
def test_attention_model_from_the_architectures_streams_exactly(tmp_path: Path, pipeline: str):
    manifest = prepare(ModelSpec("factory", "tinymodels:attention"), tmp_path / "m", input_shape=(1, 5, 8))
    assert manifest.resident_bytes == 0
    model = tinymodels.attention().eval()
    x = torch.randn(1, 5, 8)
    with torch.no_grad(), load(tmp_path / "m", pipeline=pipeline) as engine:
        assert torch.equal(engine(x), model(x))


def test_planned_activations_bind_a_merged_block_around_its_traced_nodes(tmp_path: Path):
    # torch.fx traces through a custom block (no call_module node for it), so the arena
    # binds its unit before the block's first node and releases it after its last.
    spec = ModelSpec(
        "factory",
        "tinymodels:nested_blocks",
        {"width": WIDTH, "specs": [{"scale": True, "reuse": 2, "reads": True}, {}], "head_width": 4 * WIDTH},
    )
    manifest = prepare(spec, tmp_path / "m", input_shape=(2, WIDTH))
    assert [u.name for u in manifest.units] == ["blocks.0", "blocks.1.lin", "head"]
    x = torch.randn(2, WIDTH)
    with torch.no_grad():
        expected = spec.build().eval()(x)
    minimum = manifest.resident_bytes + manifest.largest_unit_bytes
    for options in ({"pipeline": "sync"}, {"pipeline": "async", "budget": minimum}):
        with load(tmp_path / "m", activations="planned", **options) as engine:
            for _ in range(2):
                assert torch.equal(engine(x), expected), options
            assert engine.last_weights_peak <= minimum or options["pipeline"] == "sync"
    # Attention is one call of the traced graph (torch.nn's modules are fx leaves).
    prepare(ModelSpec("factory", "tinymodels:attention"), tmp_path / "a", input_shape=(1, 5, 8))
    x = torch.randn(1, 5, 8)
    with torch.no_grad(), load(tmp_path / "a", pipeline="sync", activations="planned") as engine:
        assert torch.equal(engine(x), tinymodels.attention().eval()(x))
