"""Seeded builds: reproducible, finite, sane activations, real BatchNorm statistics.

One test per model does every check that needs real weights, so each model is built
exactly twice (the reproducibility check needs two builds) and never kept around.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from zoo_expected import SMALL_OUTPUT

from layerfit import zoo

LEAF_STD_BAND = (1e-3, 1e3)


def _leaf_stds(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[tuple[str, float]]]:
    stds: list[tuple[str, float]] = []
    hooks = []
    for name, module in model.named_modules():
        if next(module.children(), None) is not None:
            continue

        def hook(_m: nn.Module, _i: tuple, out: torch.Tensor, name: str = name) -> None:
            if isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel() > 1:
                stds.append((name, float(out.float().std())))

        hooks.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            out = model(x)
    finally:
        for h in hooks:
            h.remove()
    return out, stds


@pytest.mark.parametrize("name", zoo.names())
def test_seeded_build(name: str) -> None:
    entry = zoo.get(name)
    model = zoo.build(name, seed=0)
    assert not any(m.training for m in model.modules()), "build must return eval mode"

    # Reproducible: a second build gives the same state dict, bit for bit.
    again = zoo.build(name, seed=0).state_dict()
    state = model.state_dict()
    assert list(again) == list(state)
    for key, value in state.items():
        assert torch.equal(value, again[key]), f"{name}: {key} differs between two builds"
    del again

    # The meta skeleton (as the store rebuilds it) has exactly the same tensors.
    with torch.device("meta"):
        skeleton = entry.factory(**entry.kwargs)
    assert {k: tuple(v.shape) for k, v in skeleton.state_dict().items()} == {
        k: tuple(v.shape) for k, v in state.items()
    }

    # Every parameter is finite and the tensors are not copies of each other.
    for key, value in state.items():
        assert torch.isfinite(value.float()).all(), f"{name}: {key} is not finite"

    # BatchNorm is really exercised in eval: calibrated statistics, not 0 / 1.
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    for bn in norms:
        assert bn.running_mean.abs().max() > 1e-4
        assert (bn.running_var - 1).abs().max() > 1e-3
        assert torch.all(bn.running_var > 0)
        assert int(bn.num_batches_tracked) >= 1

    # Forward at a small resolution: finite, expected shape, sane activations everywhere.
    x = torch.randn(entry.small_input_shape, generator=torch.Generator().manual_seed(1))
    out, stds = _leaf_stds(model, x)
    assert tuple(out.shape) == SMALL_OUTPUT[name]
    assert torch.isfinite(out).all()
    lo, hi = LEAF_STD_BAND
    bad = [(n, s) for n, s in stds if not lo <= s <= hi]
    assert not bad, f"{name}: leaf outputs outside the std band {LEAF_STD_BAND}: {bad[:5]}"
    assert len(stds) >= 5


def test_different_seeds_give_different_weights() -> None:
    a = zoo.build("mobilenet_v1_025", seed=0).state_dict()
    b = zoo.build("mobilenet_v1_025", seed=1).state_dict()
    assert not torch.equal(a["features.0.0.weight"], b["features.0.0.weight"])


def test_build_accepts_factory_kwargs() -> None:
    model = zoo.build("mobilenet_v1", seed=0, width_mult=0.25, num_classes=10)
    assert sum(p.numel() for p in model.parameters()) == 470_072 - 256 * 990 - 990
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 64)).shape == (1, 10)


def test_initialise_any_module_is_deterministic_and_leaves_eval_mode() -> None:
    def make() -> nn.Module:
        torch.manual_seed(123)
        m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.LazyLinear(4))
        m(torch.zeros(1, 3, 8, 8))  # materialise the lazy layer
        return m

    a, b = make(), make()
    zoo.initialise(a, 7, (4, 3, 8, 8))
    zoo.initialise(b, 7, (4, 3, 8, 8))
    assert not a.training and not a[1].training
    assert a[1].momentum == 0.1  # restored after the calibration pass
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert ka == kb and torch.equal(va, vb)


def test_transposed_convolutions_start_as_bilinear_upsampling() -> None:
    """As in FCN: a learned upsampler starts as bilinear interpolation, channel by channel."""
    from layerfit.zoo.init import _bilinear_kernel

    up = nn.ConvTranspose2d(3, 3, 4, 2, bias=False)
    zoo.initialise(up, 0, (1, 3, 5, 5))
    w = up.weight.detach()
    assert torch.equal(w[1, 1], _bilinear_kernel(4)) and float(w[1, 2].abs().sum()) == 0.0
    x = torch.ones(1, 3, 6, 6)
    with torch.no_grad():
        y = up(x)
    assert torch.allclose(y[:, :, 2:-2, 2:-2], torch.ones_like(y[:, :, 2:-2, 2:-2]))
