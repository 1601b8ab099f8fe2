"""Algorithm 2: early exit, genetic search under constraints, unsatisfiable constraints."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from layerfit.errors import TradeoffError
from layerfit.tradeoff.parts.appfile import Constraints
from layerfit.tradeoff.parts.application import Application, split_partitions
from layerfit.tradeoff.parts.cnn import CNN, Layer
from layerfit.tradeoff.parts.kernels import cnn_from_module
from layerfit.tradeoff.parts.search import GAParams, pareto_front, reduce_buffers
from layerfit.tradeoff.parts.throughput import (
    AnalyticThroughput,
    MeasuredThroughput,
    ProfiledThroughput,
    throughput_of_stages,
)

from .single_thread import single_thread  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("single_thread")

GA = GAParams(population=16, generations=8, seed=3)


def chain_cnn(name: str = "net", height: int = 32, blocks: int = 4) -> CNN:
    layers = [Layer("x", "input", (), (1, 3, height, height))]
    c = 3
    for k in range(blocks):
        out = 8 * (k + 1)
        h = layers[-1].shape[2]
        layers.append(Layer(f"conv{k}", "conv", (layers[-1].name,), (1, out, h, h), kernel=3, padding=1,
                            params=out * c * 9 + out, macs=out * c * 9 * h * h))
        layers.append(Layer(f"relu{k}", "act", (f"conv{k}",), (1, out, h, h)))
        if k % 2:
            layers.append(Layer(f"pool{k}", "pool", (f"relu{k}",), (1, out, h // 2, h // 2), kernel=2, stride=2))
        c = out
    last = layers[-1]
    layers.append(Layer("gap", "global_pool", (last.name,), (1, c, 1, 1)))
    layers.append(Layer("fc", "fc", ("gap",), (1, 10), params=c * 10 + 10, macs=c * 10))
    return CNN(name, tuple(layers))


MODEL = AnalyticThroughput(macs_per_s=1e9, layer_overhead_s=1e-5, phase_overhead_s=2e-5)


def test_early_exit_when_buffer_reuse_is_enough():
    app = Application([chain_cnn()])
    reuse = app.derive(order="planner").memory().total
    result = reduce_buffers(app, Constraints(memory=reuse), MODEL, GA)
    assert result.early_exit and result.feasible and result.chosen.parts == 0
    assert result.chosen.memory.total == reuse
    assert result.baselines["no_reduction"].memory.total > reuse


def test_search_meets_a_memory_constraint_with_the_least_throughput_loss():
    app = Application([chain_cnn()])
    reuse = reduce_buffers(app, Constraints(memory=10**12), MODEL, GA).baselines["reuse_only"]
    everything = app.derive([True] * app.n_layers, order="planner").memory().total
    limit = (reuse.memory.total + everything) // 2
    result = reduce_buffers(app, Constraints(memory=limit), MODEL, GA)
    assert result.feasible and not result.early_exit and not result.violations
    assert result.chosen.memory.total <= limit < reuse.memory.total
    assert 0 < result.chosen.parts < sum(app.tileable_mask())
    assert result.chosen.throughput["net"] < reuse.throughput["net"]  # parts cost time
    feasible = [e for e in result.pareto if e.memory.total <= limit]
    assert result.chosen.throughput["net"] >= max(e.throughput["net"] for e in feasible) - 1e-9
    by_memory = reduce_buffers(app, Constraints(memory=limit), MODEL, GA, select="memory")
    assert by_memory.chosen.memory.total <= result.chosen.memory.total
    assert by_memory.chosen.throughput["net"] <= result.chosen.throughput["net"]
    # the front is non-dominated and sorted by memory
    assert pareto_front(result.pareto, ["net"]) == result.pareto
    # same seed, same answer
    again = reduce_buffers(app, Constraints(memory=limit), MODEL, GA)
    assert again.chosen.bits == result.chosen.bits


def test_unsatisfiable_memory_returns_the_front_and_the_gap():
    app = Application([chain_cnn()])
    result = reduce_buffers(app, Constraints(memory=1000), MODEL, GA)
    assert not result.feasible and result.pareto
    (violation,) = result.violations
    assert violation.constraint == "memory" and violation.gap == result.chosen.memory.total - 1000
    assert result.chosen.memory.total == min(e.memory.total for e in result.pareto)
    assert "cannot be met" in violation.message() and "over" in violation.message()


def test_unsatisfiable_throughput_is_reported_per_cnn():
    app = Application([chain_cnn("a"), chain_cnn("b", height=16)])
    base = reduce_buffers(app, Constraints(memory=10**12), MODEL, GA).chosen.throughput
    result = reduce_buffers(app, Constraints(memory=10**12, throughput={"b": base["b"] * 2}), MODEL, GA)
    assert not result.feasible
    assert [v.constraint for v in result.violations] == ["throughput:b"]
    assert result.violations[0].gap == pytest.approx(base["b"])
    with pytest.raises(TradeoffError, match="unknown CNN"):
        reduce_buffers(app, Constraints(memory=1, throughput={"zz": 1.0}), MODEL, GA)


def test_multi_cnn_constraints_keep_each_cnn_fast_enough():
    app = Application([chain_cnn("a"), chain_cnn("b", height=16)])
    base = reduce_buffers(app, Constraints(memory=10**12), MODEL, GA)
    reuse = base.baselines["reuse_only"].memory.total
    everything = base.baselines["all_parts_reuse"].memory.total
    fps = {"a": base.chosen.throughput["a"] * 0.7}
    result = reduce_buffers(app, Constraints(memory=(reuse + everything) // 2, throughput=fps), MODEL, GA)
    if result.feasible:
        assert result.chosen.throughput["a"] >= fps["a"]
        assert result.chosen.memory.total <= (reuse + everything) // 2
    else:
        assert result.violations


def test_pipelined_throughput_is_the_slowest_stage():
    cnn = chain_cnn()
    app = Application([cnn], split_partitions(cnn, 2))
    derived = app.derive()
    times = MODEL.layer_times(cnn)
    stages = [sum(times.whole[p.start : p.stop]) for p in app.partitions]
    assert MODEL.throughput(app, derived)["net"] == pytest.approx(1 / max(stages))
    sequential = Application([cnn])
    assert MODEL.throughput(sequential, sequential.derive())["net"] == pytest.approx(1 / sum(stages))
    assert throughput_of_stages(app, {"net.p0": 0.5, "net.p1": 0.25}) == {"net": 2.0}


def test_measured_estimators_run_the_network():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.Flatten()).eval()
    cnn = cnn_from_module("tiny", model, torch.randn(1, 3, 12, 12))
    app = Application([cnn], split_partitions(cnn, 2))
    profiled = ProfiledThroughput(repeats=1)
    times = profiled.layer_times(cnn)
    assert len(times.whole) == len(cnn.layers) and all(t >= 0 for t in times.parts)
    measured = MeasuredThroughput(repeats=1)
    every = app.derive([True] * app.n_layers)
    assert measured.throughput(app, every)["tiny"] > 0
    assert len(measured.cache) == 1
    with pytest.raises(TradeoffError, match="layer list"):
        ProfiledThroughput().layer_times(chain_cnn())
