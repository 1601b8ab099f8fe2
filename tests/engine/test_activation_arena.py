"""Planned activations: one arena laid out by the memory planner, output still exactly model(x)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tinymodels
import torch
from torch import nn

from layerfit import zoo
from layerfit.cli import main
from layerfit.engine import load, measure
from layerfit.engine.arena import ActivationPlanError, out_overload, plan_activations
from layerfit.errors import LayerfitError
from layerfit.memory import validate_plan
from layerfit.store import example_input, prepare, read_manifest

SHAPE = (1, 3, 16, 16)


class PReLUNet(nn.Module):
    """A conv whose activation (PReLU → aten._prelu_kernel) has no out= overload."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.act = nn.PReLU()
        self.conv2 = nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.act(self.conv1(x)))


def prelu_net() -> nn.Module:
    """Factory for :class:`PReLUNet` (``test_activation_arena:prelu_net``)."""
    torch.manual_seed(0)
    return PReLUNet()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("arena") / "tiny"
    prepare("tinymodels:tiny_cnn", out, input_shape=SHAPE)
    return out


@pytest.fixture(scope="module")
def reference(tiny: Path):
    x = example_input(SHAPE)
    with torch.no_grad():
        return x, tinymodels.tiny_cnn().eval()(x)


@pytest.mark.parametrize("pipeline", ["preload", "sequential", "sync", "async"])
def test_planned_is_bit_identical_on_every_pipeline(tiny: Path, reference, pipeline: str):
    x, y = reference
    with load(tiny, pipeline=pipeline, activations="planned") as engine:
        for _ in range(3):  # the arena is reused: later runs must not see earlier ones
            assert torch.equal(engine(x), y)


def test_writes_land_in_their_planned_slices(tiny: Path, reference):
    x, y = reference
    with load(tiny, pipeline="async", activations="planned") as engine:
        arena = engine.arena
        arena.log_writes = True
        assert torch.equal(engine(x), y)
        base, size = arena.arena.data_ptr(), arena.arena.numel()
        assert arena.last_writes, "no node wrote into the arena"
        assert {n for n, _ in arena.last_writes} == set(arena.targets)
        for node, ptr in arena.last_writes:
            target = arena.targets[node]
            assert ptr == base + target.offset
            shape, stride, dtype = target.shapes[target.out_index]
            extent = torch.empty_strided(shape, stride, dtype=dtype, device="meta")
            assert base <= ptr and ptr + extent.numel() * extent.element_size() <= base + size
        # the returned output is PyTorch's own tensor, not a slice of the arena
        out = engine(x)
        assert not base <= out.data_ptr() < base + size


def test_plan_is_legal_and_reported(tiny: Path, reference):
    x, _ = reference
    manifest = read_manifest(tiny)
    plan = plan_activations(manifest.graph)
    validate_plan(plan.records.records, plan.offsets)
    with load(tiny, pipeline="async", activations="planned") as engine:
        assert engine.arena.arena_bytes == plan.arena_bytes
        _, report = measure(engine, (x,), repeats=1, warmup=0)
    assert report["activations"] == "planned"
    assert report["activation_arena_bytes"] == plan.arena_bytes
    assert report["planned_total_bytes"] == report["weight_buffer_bytes"] + plan.arena_bytes
    assert report["activation_fallbacks"] == {"fc": "model output: allocated by PyTorch for the caller"}
    with load(tiny, pipeline="async") as engine:
        _, default = measure(engine, (x,), repeats=1, warmup=0)
    assert default["activations"] == "default"
    assert default["activation_arena_bytes"] == plan.arena_bytes
    assert default["output_sha256"] == report["output_sha256"]


def test_op_without_out_overload_is_refused(tmp_path: Path):
    out = tmp_path / "prelu"
    prepare("test_activation_arena:prelu_net", out, input_shape=SHAPE)
    with pytest.raises(ActivationPlanError, match=r"act \(aten\._prelu_kernel"):
        load(out, activations="planned")
    x = example_input(SHAPE)
    with load(out) as engine, torch.no_grad():  # the default mode still runs it
        assert torch.equal(engine(x), prelu_net().eval()(x))


class ScaleLayer(nn.Module):
    """A layer of the user's own: torch.fx traces through it (no call_module node)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.linspace(0.5, 1.5, width))
        self.shift = nn.Parameter(torch.linspace(-0.1, 0.1, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * self.gain + self.shift)


def custom_layers() -> nn.Module:
    """Factory (``test_activation_arena:custom_layers``): two own layers between linears."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), ScaleLayer(16), nn.Linear(16, 16), ScaleLayer(16), nn.Linear(16, 4))


@pytest.mark.parametrize("pipeline", ["sequential", "async"])
def test_a_layer_fx_traces_through_is_bound_around_its_nodes(tmp_path: Path, pipeline: str):
    out = tmp_path / "custom"
    manifest = prepare("test_activation_arena:custom_layers", out, input_shape=(2, 8))
    assert [u.name for u in manifest.units] == ["0", "1", "2", "3", "4"]
    x = example_input((2, 8))
    with load(out, activations="planned", pipeline=pipeline) as engine, torch.no_grad():
        for _ in range(2):
            assert torch.equal(engine(x), custom_layers().eval()(x))
        assert engine.arena is not None and engine.arena.report()["nodes_in_arena"] > 0


def test_a_unit_inside_a_module_fx_keeps_whole_is_refused(tmp_path: Path):
    # nn.TransformerEncoder is one call_module node: its layers' units have no node.
    out = tmp_path / "encoder"
    prepare("tinymodels:transformer_encoder", out, input_shape=(1, 5, 8))
    with pytest.raises(ActivationPlanError, match=r"first: 1\.layers\.0\.self_attn, which the trace keeps"):
        load(out, activations="planned")


def test_unknown_mode_is_refused(tiny: Path):
    with pytest.raises(LayerfitError, match="default, planned"):
        load(tiny, activations="arena")


def test_out_overload_lookup():
    assert out_overload(torch.ops.aten.convolution.default) is torch.ops.aten.convolution.out
    assert out_overload(torch.ops.aten.add.Tensor) is torch.ops.aten.add.out
    assert out_overload(torch.ops.aten.softmax.int) is torch.ops.aten.softmax.int_out
    assert out_overload(torch.ops.aten._prelu_kernel.default) is None


def test_cli_inspect_and_run_report_the_arena(tiny: Path, capsys):
    assert main(["inspect", str(tiny), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["activation_arena_bytes"] > 0
    assert info["planned_total_bytes"] == info["minimum_budget_bytes"] + info["activation_arena_bytes"]
    # what the unplanned pass held, next to the arena that replaces it
    assert info["pass_peak_bytes"] == read_manifest(tiny).graph.pass_peak_bytes > 0
    assert main(["inspect", str(tiny)]) == 0
    text = capsys.readouterr().out
    assert "activation arena" in text and "unplanned, the captured pass held" in text
    assert main(["run", str(tiny), "--json", "--activations", "planned", "--repeats", "1", "--warmup", "0"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert main(["run", str(tiny), "--json", "--repeats", "1", "--warmup", "0"]) == 0
    default = json.loads(capsys.readouterr().out)
    assert planned["activations"] == "planned" and default["activations"] == "default"
    assert planned["output_sha256"] == default["output_sha256"]
    assert planned["activation_arena_bytes"] == info["activation_arena_bytes"]
    assert main(["run", str(tiny), "--activations", "nope"]) == 2


@pytest.mark.parametrize("name", ["mobilenet_v2", "resnet50", "inception_v3", "tiny_yolov3", "deeplab_v3"])
def test_zoo_models_planned_bit_identical(tmp_path: Path, name: str):
    entry = zoo.get(name)
    shape = entry.small_input_shape
    module = zoo.build(name).eval()
    prepare(name, tmp_path / name, input_shape=shape, module=module)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = module(x)
    with load(tmp_path / name, pipeline="async", activations="planned") as engine:
        assert engine.arena.targets, "nothing written into the arena"
        for _ in range(2):
            out = engine(x)
            assert torch.equal(out, y)
