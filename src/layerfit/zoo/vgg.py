"""VGG-16 and VGG-19 (Simonyan & Zisserman, 2015), configurations D and E, no BatchNorm.

The classifier follows the common PyTorch layout: adaptive average pooling to 7×7 (the
identity at 224×224, and what lets smaller inputs run), then fc6/fc7/fc8. fc6 alone is
102.8 M parameters — the "highly unbalanced" largest layer SwapNet notes (392 MB).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

_CFGS: dict[str, list[int | str]] = {
    "vgg16": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
    "vgg19": [
        64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M",
        512, 512, 512, 512, "M", 512, 512, 512, 512, "M",
    ],
}


def vgg_features(cfg: Sequence[int | str], first_padding: int = 1, ceil_mode: bool = False) -> nn.Sequential:
    """The convolutional part of a VGG configuration (3×3 convs + ReLU, 2×2 max pools)."""
    layers: list[nn.Module] = []
    in_ch = 3
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(2, 2, ceil_mode=ceil_mode))
        else:
            pad = first_padding if not layers else 1
            layers += [nn.Conv2d(in_ch, int(v), 3, padding=pad), nn.ReLU()]
            in_ch = int(v)
    return nn.Sequential(*layers)


class VGG(nn.Module):
    """VGG: conv features, 7×7 adaptive average pool, three fully connected layers."""

    def __init__(self, cfg: Sequence[int | str], num_classes: int = 1000, dropout: float = 0.5) -> None:
        super().__init__()
        self.features = vgg_features(cfg)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(
            nn.Linear(512 * 7 * 7, 4096), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def vgg16(num_classes: int = 1000) -> VGG:
    """VGG-16 (configuration D): 13 conv + 3 fc layers."""
    return VGG(_CFGS["vgg16"], num_classes)


def vgg19(num_classes: int = 1000) -> VGG:
    """VGG-19 (configuration E): 16 conv + 3 fc layers."""
    return VGG(_CFGS["vgg19"], num_classes)
