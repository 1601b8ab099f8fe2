"""DenseNet-121 and DenseNet-201 (Huang et al., 2017), DenseNet-BC with growth rate 32.

Each dense layer is BN-ReLU-1×1 conv (4·k channels) → BN-ReLU-3×3 conv (k channels) on
the concatenation of all earlier feature maps of its block; transitions halve channels
and resolution. Parameter names follow the common PyTorch layout (``features.denseblockN
.denselayerM.conv1`` …).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class DenseLayer(nn.Module):
    """Bottleneck dense layer: concat(inputs) → BN-ReLU-conv1×1 → BN-ReLU-conv3×3."""

    def __init__(self, in_channels: int, growth_rate: int, bn_size: int) -> None:
        super().__init__()
        self.norm1 = nn.BatchNorm2d(in_channels)
        self.relu1 = nn.ReLU()
        self.conv1 = nn.Conv2d(in_channels, bn_size * growth_rate, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth_rate)
        self.relu2 = nn.ReLU()
        self.conv2 = nn.Conv2d(bn_size * growth_rate, growth_rate, 3, padding=1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = torch.cat(features, 1)
        x = self.conv1(self.relu1(self.norm1(x)))
        return self.conv2(self.relu2(self.norm2(x)))


class DenseBlock(nn.ModuleDict):
    """``num_layers`` dense layers; returns the concatenation of input and all outputs."""

    def __init__(self, num_layers: int, in_channels: int, growth_rate: int, bn_size: int) -> None:
        super().__init__()
        for i in range(num_layers):
            self[f"denselayer{i + 1}"] = DenseLayer(in_channels + i * growth_rate, growth_rate, bn_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.values():
            features.append(layer(features))
        return torch.cat(features, 1)


class Transition(nn.Sequential):
    """BN-ReLU-1×1 conv halving the channels, then 2×2 average pooling."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm2d(in_channels)
        self.relu = nn.ReLU()
        self.conv = nn.Conv2d(in_channels, out_channels, 1, bias=False)
        self.pool = nn.AvgPool2d(2, 2)


class DenseNet(nn.Module):
    """Stem, dense blocks with transitions, final norm, global pool, classifier."""

    def __init__(
        self,
        block_config: Sequence[int],
        growth_rate: int = 32,
        num_init_features: int = 64,
        bn_size: int = 4,
        num_classes: int = 1000,
    ) -> None:
        super().__init__()
        self.features = nn.Sequential()
        self.features.add_module("conv0", nn.Conv2d(3, num_init_features, 7, 2, 3, bias=False))
        self.features.add_module("norm0", nn.BatchNorm2d(num_init_features))
        self.features.add_module("relu0", nn.ReLU())
        self.features.add_module("pool0", nn.MaxPool2d(3, 2, 1))
        ch = num_init_features
        for i, n in enumerate(block_config):
            self.features.add_module(f"denseblock{i + 1}", DenseBlock(n, ch, growth_rate, bn_size))
            ch += n * growth_rate
            if i != len(block_config) - 1:
                self.features.add_module(f"transition{i + 1}", Transition(ch, ch // 2))
                ch //= 2
        self.features.add_module("norm5", nn.BatchNorm2d(ch))
        self.relu = nn.ReLU()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(ch, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.relu(self.features(x)))
        return self.classifier(torch.flatten(x, 1))


def densenet121(num_classes: int = 1000) -> DenseNet:
    """DenseNet-121: dense blocks of 6, 12, 24, 16 layers."""
    return DenseNet((6, 12, 24, 16), num_classes=num_classes)


def densenet201(num_classes: int = 1000) -> DenseNet:
    """DenseNet-201: dense blocks of 6, 12, 48, 32 layers."""
    return DenseNet((6, 12, 48, 32), num_classes=num_classes)
