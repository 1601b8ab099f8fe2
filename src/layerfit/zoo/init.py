"""Seeded, numerically sane initialisation of zoo models (no downloaded weights, ever).

Random weights are enough for layerfit: it never changes a model, it only moves its
bytes, so what matters is that every tensor is *realistic* — finite, of sane scale,
distinct per tensor (a binding bug that swaps two tensors must change the output) — and
that BatchNorm really normalises in eval mode. The recipe:

1. **Seeded draws.** One ``torch.Generator`` seeded with ``seed`` fills every parameter
   in ``named_modules()`` order: convolutions and linear layers He-normal (fan-in, ReLU
   gain); transposed convolutions with Long et al.'s bilinear upsampling kernels (FCN);
   norm scales ``1 + 0.1·N(0,1)`` and shifts / biases small normals; anything else
   ``N(0, 0.02)``. No global RNG state is read or changed.
2. **Damped residual branches.** A block class may name its branch-final norm in the
   class attribute ``residual_norm``; its scale is multiplied by ``RESIDUAL_DAMPING`` so
   the residual stream of a 152-layer ResNet grows gently, as in trained networks.
3. **Calibration pass** (data-dependent, one forward pass under ``no_grad``) on a seeded
   standard-normal batch of ``calibration_shape``:

   - BatchNorm layers run in train mode with ``momentum=None`` (cumulative average), so
     their running statistics become the exact statistics of this batch — non-trivial
     means and variances that eval mode then really uses. Everything else (dropout)
     stays in eval mode, so the pass is deterministic.
   - Every ``Conv2d`` / ``Linear`` output is rescaled to unit standard deviation by
     dividing its weight and bias by the measured std (layer-sequential unit variance,
     "LSUV", Mishkin & Matas 2016, done in the same single pass). This keeps networks
     without BatchNorm (VGG, AlexNet, GoogLeNet, BlazeFace …) from vanishing or
     exploding; behind a BatchNorm it changes nothing.

   Momentum is restored and the model is left in ``eval()`` mode.

Why the batch must be large enough: in train mode every BatchNorm re-normalises, so
estimation errors never accumulate; in eval mode a norm whose statistics came from
``n`` samples per channel passes on about ``1 + 3/n`` times the variance it should
(error of the mean, and Jensen on ``1/σ̂``), and nothing downstream corrects it. Over
50–150 norms this compounds, so the deepest (smallest) feature maps need ``n`` of order
100 samples per channel — a batch of 8 at 128×128 for stride-32 networks. Measured on
EfficientNet-B0 at 224×224: output std 700 with a batch of 8 at 64×64, 2.3 at 128×128.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import nn

RESIDUAL_DAMPING = 0.3
"""Factor applied to the scale of a residual branch's final norm (see module doc)."""

_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.GroupNorm, nn.LayerNorm)
_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_RESCALED = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


def initialise(model: nn.Module, seed: int, calibration_shape: tuple[int, ...]) -> None:
    """Fill ``model``'s parameters and buffers deterministically from ``seed``.

    ``calibration_shape`` is the shape of the seeded random input of the calibration
    pass. With BatchNorm it must give every channel of the *deepest* feature maps enough
    samples (batch × height × width ≳ 100): in eval mode each norm's estimation error
    inflates the variance it passes on by about ``1 + 3/n``, and these factors multiply
    over the depth of the network (see the module doc). The model ends in eval mode.
    """
    gen = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        _draw_parameters(model, gen)
        _damp_residual_norms(model)
        _calibrate(model, gen, tuple(calibration_shape))
    model.eval()


def _normal_(t: torch.Tensor, gen: torch.Generator, std: float, mean: float = 0.0) -> None:
    """In-place ``N(mean, std²)`` from ``gen``, also for tensors off the CPU."""
    if t.device.type == "cpu":
        t.normal_(mean, std, generator=gen)
    else:
        t.copy_(torch.empty(t.shape, dtype=t.dtype).normal_(mean, std, generator=gen))


def _bilinear_kernel(size: int) -> torch.Tensor:
    """The 2-D bilinear interpolation kernel FCN uses to initialise its upsamplers."""
    factor = (size + 1) // 2
    center = factor - 1 if size % 2 == 1 else factor - 0.5
    og = torch.arange(size, dtype=torch.float64)
    filt = 1 - (og - center).abs() / factor
    return (filt[:, None] * filt[None, :]).to(torch.float32)


def _draw_parameters(model: nn.Module, gen: torch.Generator) -> None:
    seen: set[int] = set()
    for module in model.modules():
        params = [p for p in module.parameters(recurse=False) if id(p) not in seen]
        if not params:
            continue
        seen.update(id(p) for p in params)
        if isinstance(module, nn.ConvTranspose2d):
            _init_transposed(module, gen)
        elif isinstance(module, (*_RESCALED, nn.ConvTranspose1d, nn.ConvTranspose3d)):
            fan_in = module.weight[0].numel()
            if isinstance(module, (nn.ConvTranspose1d, nn.ConvTranspose3d)):
                fan_in = module.weight.shape[0] * module.weight[0, 0].numel()
            _normal_(module.weight, gen, math.sqrt(2.0 / max(fan_in, 1)))
            if module.bias is not None:
                _normal_(module.bias, gen, 0.01)
        elif isinstance(module, _NORMS):
            if getattr(module, "weight", None) is not None:
                _normal_(module.weight, gen, 0.1, mean=1.0)
            if getattr(module, "bias", None) is not None:
                _normal_(module.bias, gen, 0.1)
        else:
            for p in params:
                _normal_(p, gen, 0.02)


def _init_transposed(module: nn.ConvTranspose2d, gen: torch.Generator) -> None:
    w = module.weight  # (in, out / groups, kh, kw)
    kh, kw = w.shape[-2:]
    if kh == kw and w.shape[0] == w.shape[1] * module.groups and module.groups in (1, w.shape[0]):
        w.zero_()
        kernel = _bilinear_kernel(kh).to(w.device, w.dtype)
        for c in range(w.shape[0]):
            w[c, 0 if module.groups > 1 else c].copy_(kernel)
    else:
        _normal_(w, gen, math.sqrt(2.0 / max(w.shape[0] * kh * kw, 1)))
    if module.bias is not None:
        _normal_(module.bias, gen, 0.01)


def _damp_residual_norms(model: nn.Module) -> None:
    for module in model.modules():
        name = getattr(type(module), "residual_norm", None)
        if not name:
            continue
        norm = getattr(module, name, None)
        if norm is not None and getattr(norm, "weight", None) is not None:
            norm.weight.mul_(RESIDUAL_DAMPING)


def _batch_norms(model: nn.Module) -> Iterator[nn.modules.batchnorm._BatchNorm]:
    for m in model.modules():
        if isinstance(m, _BATCH_NORMS) and m.track_running_stats:
            yield m


def calibration_input(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """The seeded standard-normal batch of the calibration pass."""
    return torch.randn(shape, generator=gen)


def _calibrate(model: nn.Module, gen: torch.Generator, shape: tuple[int, ...]) -> None:
    try:
        ref = next(model.parameters())
        device, dtype = ref.device, ref.dtype
    except StopIteration:
        return
    norms = list(_batch_norms(model))
    momenta = [bn.momentum for bn in norms]
    done: set[int] = set()

    def rescale(module: nn.Module, _inputs: tuple, output: torch.Tensor) -> torch.Tensor | None:
        if id(module) in done or not isinstance(output, torch.Tensor):
            return None
        done.add(id(module))
        std = float(output.float().std()) if output.numel() > 1 else 0.0
        if not math.isfinite(std) or std < 1e-12:
            return None
        module.weight.div_(std)
        if getattr(module, "bias", None) is not None:
            module.bias.div_(std)
        return output / std

    hooks = [m.register_forward_hook(rescale) for m in model.modules() if isinstance(m, _RESCALED)]
    model.eval()
    for bn in norms:
        bn.reset_running_stats()
        bn.momentum = None
        bn.train()
    try:
        model(calibration_input(shape, gen).to(device=device, dtype=dtype))
    finally:
        for h in hooks:
            h.remove()
        for bn, m in zip(norms, momenta, strict=True):
            bn.momentum = m
        model.eval()
