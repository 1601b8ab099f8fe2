"""Processing by parts for real: stripes of rows give the untiled output with small buffers."""

from __future__ import annotations

import warnings
from contextlib import contextmanager

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from layerfit.errors import TradeoffError
from layerfit.tradeoff.parts.executor import (
    TOLERANCE,
    PartsExecutor,
    untiled_peak_bytes,
)
from layerfit.tradeoff.parts.kernels import cnn_from_module

from .single_thread import single_thread  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("single_thread")


@contextmanager
def same_arithmetic():
    """Disable oneDNN so stripes and whole tensors use the same convolution kernels."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.backends.mkldnn.flags(enabled=False):
            yield


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    rtol, atol = TOLERANCE
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol * max(1.0, expected.abs().max().item()))


def randomise_bn(model: nn.Module) -> nn.Module:
    gen = torch.Generator().manual_seed(1)
    for mod in model.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.copy_(torch.rand(mod.num_features, generator=gen) * 2 - 1)
            mod.running_var.copy_(torch.rand(mod.num_features, generator=gen) + 0.5)
            mod.weight.data.copy_(torch.rand(mod.num_features, generator=gen) + 0.5)
    return model.eval()


class Residual(nn.Module):
    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + x


class SqueezeExcite(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.fc = nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.fc(nn.functional.adaptive_avg_pool2d(x, 1)))


class Branches(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.a = nn.Conv2d(c, c, 3, padding=1)
        self.b = nn.MaxPool2d(3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.a(x), self.b(x)], 1)


def mobile_block_net() -> nn.Module:
    c = 8
    return randomise_bn(
        nn.Sequential(
            nn.Conv2d(3, c, 3, stride=2, padding=1),
            nn.BatchNorm2d(c),
            nn.ReLU6(inplace=True),
            Residual(nn.Sequential(nn.Conv2d(c, c, 3, padding=1, groups=c), nn.BatchNorm2d(c), nn.SiLU(), nn.Conv2d(c, c, 1))),
            SqueezeExcite(c),
            Branches(c),
            nn.MaxPool2d(3, 2, 1, ceil_mode=True),
            nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
            nn.Conv2d(2 * c, 4, 3, padding=2, dilation=2),
            nn.Hardswish(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(4, 3),
        )
    )


def test_tiled_equals_untiled_on_a_mobile_style_net():
    torch.manual_seed(0)
    model = mobile_block_net()
    x = torch.randn(1, 3, 45, 27)
    cnn = cnn_from_module("net", model, x)
    with torch.no_grad():
        reference = model(x)
    executor = PartsExecutor(cnn, "all")
    close(executor.run(x), reference)
    with same_arithmetic():
        with torch.no_grad():
            exact = model(x)
        assert torch.equal(PartsExecutor(cnn, "all").run(x), exact)
    # buffers: as planned, fully used, and far below whole tensors
    stats = executor.last_stats
    for name, rows in stats.high_water_rows.items():
        k = executor.members.index(cnn.index(name))
        assert rows == executor.plan.buffer_rows[k]
    untiled = PartsExecutor(cnn, "none")
    untiled.run(x)
    assert untiled.last_stats.peak_bytes == untiled_peak_bytes(cnn)  # the records' peak is the run's
    assert stats.peak_bytes < untiled_peak_bytes(cnn) / 2


def test_kernels_read_the_weights_bound_when_they_run():
    """Weights bound into the modules after the CNN was captured (as the engine binds a
    unit's tensors by reference, into ``module._parameters``/``_buffers``) are the ones
    every kernel reads, whole and by parts."""
    torch.manual_seed(0)
    model = mobile_block_net()
    x = torch.randn(1, 3, 45, 27)
    cnn = cnn_from_module("net", model, x)
    executors = {mode: PartsExecutor(cnn, mode) for mode in ("none", "all")}
    gen = torch.Generator().manual_seed(2)
    for mod in model.modules():
        for holder in (mod._parameters, mod._buffers):
            for name, t in list(holder.items()):
                if t is not None and t.is_floating_point():
                    fresh = torch.rand(t.shape, generator=gen) + 0.5
                    holder[name] = nn.Parameter(fresh, requires_grad=False) if name in mod._parameters else fresh
    with torch.no_grad():
        reference = model(x)
    for executor in executors.values():
        close(executor.run(x), reference)


def test_untileable_layers_are_marked_and_run_whole():
    model = mobile_block_net()
    cnn = cnn_from_module("net", model, torch.randn(1, 3, 20, 20))
    untileable = [i for i in range(len(cnn.layers)) if not cnn.tileable(i)]
    assert {"global_pool", "flatten", "fc"} <= {cnn.layers[i].kind for i in untileable}
    assert all(cnn.tiling_reason(i) for i in untileable)
    executor = PartsExecutor(cnn, "all")
    for k, flag in enumerate(executor.plan.by_parts):
        if not cnn.tileable(executor.members[k]):
            assert not flag and executor.plan.phases[k] <= 1


def test_partial_tiling_by_names_and_phase_rows():
    torch.manual_seed(1)
    model = mobile_block_net()
    x = torch.randn(1, 3, 33, 19)
    cnn = cnn_from_module("net", model, x)
    with torch.no_grad():
        reference = model(x)
    names = [layer.name for i, layer in enumerate(cnn.layers) if cnn.tileable(i)][::2]
    for phase_rows in (1, 2, 5):
        close(PartsExecutor(cnn, names, phase_rows=phase_rows).run(x), reference)
    close(PartsExecutor(cnn, "none").run(x), reference)
    with pytest.raises(TradeoffError, match="unknown layer"):
        PartsExecutor(cnn, ["nope"])


def test_rows_no_consumer_reads_are_never_stored():
    """A 1x1 stride-2 conv reads every other row: the rows between are skipped, so a
    one-row buffer suffices."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 1, stride=2)).eval()
    x = torch.randn(1, 3, 12, 5)
    executor = PartsExecutor(cnn_from_module("net", model, x), "all")
    with torch.no_grad():
        close(executor.run(x), model(x))
    assert executor.plan.buffer_rows[1] == 1
    assert executor.last_stats.high_water_rows == {"_0": 1}


def test_training_mode_is_refused():
    with pytest.raises(TradeoffError, match="eval"):
        cnn_from_module("net", nn.Sequential(nn.Conv2d(1, 1, 3)).train(), torch.randn(1, 1, 5, 5))


def _conv(c: int, draw) -> list[nn.Module]:
    kernel = draw(st.sampled_from([1, 3, 5]))
    dilation = draw(st.sampled_from([1, 1, 2]))
    stride = draw(st.sampled_from([1, 1, 2]))
    pad = draw(st.integers(0, dilation * (kernel - 1) // 2))
    groups = draw(st.sampled_from([1, c]))
    return [nn.Conv2d(c, c, kernel, stride=stride, padding=pad, dilation=dilation, groups=groups)]


@st.composite
def random_chains(draw):
    """Random chains of convs, pools, batch norms, activations and residual blocks."""
    c = 4
    layers: list[nn.Module] = [nn.Conv2d(3, c, 3, padding=1)]
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["conv", "pool", "avg", "bn", "act", "residual"]))
        if kind == "conv":
            layers += _conv(c, draw)
        elif kind == "pool":
            k = draw(st.sampled_from([2, 3]))
            layers.append(nn.MaxPool2d(k, draw(st.sampled_from([1, 2])), draw(st.integers(0, k // 2)), ceil_mode=draw(st.booleans())))
        elif kind == "avg":
            k = draw(st.sampled_from([2, 3]))
            layers.append(
                nn.AvgPool2d(k, draw(st.sampled_from([1, 2])), draw(st.integers(0, k // 2)),
                             ceil_mode=draw(st.booleans()), count_include_pad=draw(st.booleans()))
            )
        elif kind == "bn":
            layers.append(nn.BatchNorm2d(c))
        elif kind == "act":
            layers.append(draw(st.sampled_from([nn.ReLU(), nn.ReLU6(), nn.SiLU(), nn.Hardswish(), nn.Sigmoid()])))
        else:
            k = draw(st.sampled_from([1, 3]))
            layers.append(Residual(nn.Sequential(nn.Conv2d(c, c, k, padding=k // 2), nn.ReLU(), nn.Conv2d(c, c, 3, padding=1))))
    height = draw(st.integers(12, 24))
    width = draw(st.integers(5, 12))
    parts = draw(st.sampled_from(["all", "some"]))
    return nn.Sequential(*layers), (1, 3, height, width), parts, draw(st.sampled_from([1, 1, 2, 3]))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_chains(), st.integers(0, 1000))
def test_random_chains_tiled_equal_untiled(case, seed):
    model, shape, parts, phase_rows = case
    torch.manual_seed(seed)
    model = randomise_bn(model)
    x = torch.randn(*shape)
    try:
        with torch.no_grad():
            model(x)
    except RuntimeError:
        return  # the random chain shrank the input below a kernel: not a valid model
    cnn = cnn_from_module("chain", model, x)
    if parts == "some":
        parts = [layer.name for i, layer in enumerate(cnn.layers) if cnn.tileable(i)][1::2]
    with same_arithmetic():
        with torch.no_grad():
            reference = model(x)
        executor = PartsExecutor(cnn, parts, phase_rows=phase_rows)
        out = executor.run(x)
    close(out, reference)
    for name, rows in executor.last_stats.high_water_rows.items():
        k = executor.members.index(cnn.index(name))
        assert rows <= executor.plan.buffer_rows[k]


class Constants(nn.Module):
    """Buffers read by functional code: fx ``get_attr`` nodes, no layers of their own."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.register_buffer("gate", torch.rand(1, 4, 1, 1))  # broadcast over rows
        self.register_buffer("bias", torch.rand(1, 4, 10, 7))  # read row by row
        self.head = nn.Conv2d(4, 2, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x) * self.gate + self.bias))


def test_constants_are_bound_into_the_kernels_that_read_them():
    model = Constants().eval()
    x = torch.randn(1, 3, 10, 7)
    cnn = cnn_from_module("net", model, x)
    assert all(layer.kind != "const" for layer in cnn.layers)
    ops = {layer.name: i for i, layer in enumerate(cnn.layers)}
    assert cnn.tileable(ops["mul"]) and cnn.tileable(ops["add"])
    assert cnn.layers[ops["mul"]].params == 4 and cnn.layers[ops["add"]].params == 4 * 10 * 7
    with torch.no_grad():
        reference = model(x)
    for phase_rows in (1, 3):
        close(PartsExecutor(cnn, "all", phase_rows=phase_rows).run(x), reference)
