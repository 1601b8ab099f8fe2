"""EfficientNet-B0 (Tan & Le, ICML 2019).

Stem 3×3/2 conv, seven stages of MBConv blocks (1×1 expand, k×k depthwise, squeeze-and-
excitation with SiLU/sigmoid, linear 1×1 project, identity skip when shapes allow),
1×1 conv to 1280, global pool, 20 % dropout, classifier. Stochastic depth is a training
device and is not part of the inference graph. Module layout follows the common PyTorch
layout (``features.N.M.block``).
"""

from __future__ import annotations

import torch
from torch import nn

from layerfit.zoo._layers import conv_bn_act

# (expand ratio, kernel, stride, in channels, out channels, repeats) for B0.
_B0 = [
    (1, 3, 1, 32, 16, 1),
    (6, 3, 2, 16, 24, 2),
    (6, 5, 2, 24, 40, 2),
    (6, 3, 2, 40, 80, 3),
    (6, 5, 1, 80, 112, 3),
    (6, 5, 2, 112, 192, 4),
    (6, 3, 1, 192, 320, 1),
]


class SqueezeExcitation(nn.Module):
    """Channel gating: global pool → 1×1 reduce → SiLU → 1×1 expand → sigmoid → scale."""

    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.activation = nn.SiLU()
        self.scale_activation = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.fc2(self.activation(self.fc1(self.avgpool(x))))
        return x * self.scale_activation(s)


class MBConv(nn.Module):
    """Mobile inverted bottleneck with squeeze-and-excitation."""

    residual_norm = "last_norm"

    def __init__(self, expand: int, kernel: int, stride: int, in_ch: int, out_ch: int) -> None:
        super().__init__()
        self.use_res_connect = stride == 1 and in_ch == out_ch
        hidden = in_ch * expand
        layers: list[nn.Module] = []
        if hidden != in_ch:
            layers.append(conv_bn_act(in_ch, hidden, 1, act=nn.SiLU))
        layers += [
            conv_bn_act(hidden, hidden, kernel, stride, groups=hidden, act=nn.SiLU),
            SqueezeExcitation(hidden, max(1, in_ch // 4)),
            conv_bn_act(hidden, out_ch, 1, act=None),
        ]
        self.block = nn.Sequential(*layers)

    @property
    def last_norm(self) -> nn.Module | None:
        """The projection's norm when the block is residual (damped at initialisation)."""
        return self.block[-1][1] if self.use_res_connect else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return out + x if self.use_res_connect else out


class EfficientNet(nn.Module):
    """EfficientNet built from a stage table (B0 by default)."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.2) -> None:
        super().__init__()
        layers: list[nn.Module] = [conv_bn_act(3, 32, 3, 2, act=nn.SiLU)]
        for expand, k, s, cin, cout, n in _B0:
            stage = [MBConv(expand, k, s if i == 0 else 1, cin if i == 0 else cout, cout) for i in range(n)]
            layers.append(nn.Sequential(*stage))
        layers.append(conv_bn_act(320, 1280, 1, act=nn.SiLU))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def efficientnet_b0(num_classes: int = 1000) -> EfficientNet:
    """EfficientNet-B0."""
    return EfficientNet(num_classes)
