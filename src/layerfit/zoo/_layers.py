"""Building blocks shared by several zoo families.

Kept deliberately small: a conv-norm-activation triple, and two shape helpers that
torch.fx records as single calls (``resize_to`` and ``crop_like``) so that models whose
forward depends on tensor *shapes* (never on tensor *values*) still trace.
"""

from __future__ import annotations

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn


def conv_bn_act(
    in_channels: int,
    out_channels: int,
    kernel_size: int | tuple[int, int] = 3,
    stride: int = 1,
    padding: int | tuple[int, int] | None = None,
    *,
    groups: int = 1,
    dilation: int = 1,
    act: type[nn.Module] | None = nn.ReLU,
    eps: float = 1e-5,
) -> nn.Sequential:
    """``Conv2d`` (no bias) → ``BatchNorm2d`` → activation, as one ``nn.Sequential``.

    ``padding`` defaults to "same" for odd kernels (``dilation * (k - 1) // 2``).
    """
    if padding is None:
        k = kernel_size if isinstance(kernel_size, int) else kernel_size[0]
        padding = dilation * (k - 1) // 2
    layers: list[nn.Module] = [
        nn.Conv2d(
            in_channels, out_channels, kernel_size, stride, padding,
            dilation=dilation, groups=groups, bias=False,
        ),
        nn.BatchNorm2d(out_channels, eps=eps),
    ]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


def resize_to(x: torch.Tensor, ref: torch.Tensor, align_corners: bool) -> torch.Tensor:
    """Bilinear resize of ``x`` to the spatial size of ``ref`` (traced by fx as one call)."""
    return F.interpolate(x, size=ref.shape[-2:], mode="bilinear", align_corners=align_corners)


def crop_like(x: torch.Tensor, ref: torch.Tensor, offset: int) -> torch.Tensor:
    """Caffe's ``Crop`` layer: the window of ``x`` at ``offset`` with ``ref``'s spatial size."""
    h, w = ref.shape[-2:]
    return x[:, :, offset : offset + h, offset : offset + w]


torch.fx.wrap("resize_to")
torch.fx.wrap("crop_like")
