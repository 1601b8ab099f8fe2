"""GoogLeNet / Inception v1 (Szegedy et al., "Going deeper with convolutions", 2015).

The original network as released in Caffe (``bvlc_googlenet``): no BatchNorm, ReLU after
every convolution, local response normalisation after the first pool and after conv2,
pools rounding up, nine inception modules, 40 % dropout and the final classifier. The
two auxiliary classifiers exist only for training and are left out. The trunk is shared
with PoseNet (:mod:`layerfit.zoo.posenet`).
"""

from __future__ import annotations

import torch
from torch import nn

# (1×1, 3×3 reduce, 3×3, 5×5 reduce, 5×5, pool projection) per module (paper, Table 1).
_INCEPTION: dict[str, tuple[int, int, int, int, int, int]] = {
    "3a": (64, 96, 128, 16, 32, 32),
    "3b": (128, 128, 192, 32, 96, 64),
    "4a": (192, 96, 208, 16, 48, 64),
    "4b": (160, 112, 224, 24, 64, 64),
    "4c": (128, 128, 256, 24, 64, 64),
    "4d": (112, 144, 288, 32, 64, 64),
    "4e": (256, 160, 320, 32, 128, 128),
    "5a": (256, 160, 320, 32, 128, 128),
    "5b": (384, 192, 384, 48, 128, 128),
}


def _conv_relu(in_ch: int, out_ch: int, kernel: int, stride: int = 1, padding: int = 0) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(in_ch, out_ch, kernel, stride, padding), nn.ReLU())


class Inception(nn.Module):
    """Four parallel branches (1×1; 1×1→3×3; 1×1→5×5; 3×3 max pool→1×1), concatenated."""

    def __init__(self, in_ch: int, c1: int, c3r: int, c3: int, c5r: int, c5: int, pool: int) -> None:
        super().__init__()
        self.branch1 = _conv_relu(in_ch, c1, 1)
        self.branch2 = nn.Sequential(_conv_relu(in_ch, c3r, 1), _conv_relu(c3r, c3, 3, padding=1))
        self.branch3 = nn.Sequential(_conv_relu(in_ch, c5r, 1), _conv_relu(c5r, c5, 5, padding=2))
        self.branch4 = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), _conv_relu(in_ch, pool, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch1(x), self.branch2(x), self.branch3(x), self.branch4(x)], 1)


class GoogLeNetTrunk(nn.Module):
    """Everything up to and including inception 5b (1024 channels at stride 32)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = _conv_relu(3, 64, 7, 2, 3)
        self.pool1 = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.norm1 = nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75)
        self.conv2_reduce = _conv_relu(64, 64, 1)
        self.conv2 = _conv_relu(64, 192, 3, padding=1)
        self.norm2 = nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75)
        self.pool2 = nn.MaxPool2d(3, 2, ceil_mode=True)
        ch = 192
        for name, cfg in _INCEPTION.items():
            self.add_module(f"inception{name}", Inception(ch, *cfg))
            ch = cfg[0] + cfg[2] + cfg[4] + cfg[5]
            if name in ("3b", "4e"):
                self.add_module(f"pool{name[0]}", nn.MaxPool2d(3, 2, ceil_mode=True))
        self.out_channels = ch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(self.pool1(self.conv1(x)))
        x = self.pool2(self.norm2(self.conv2(self.conv2_reduce(x))))
        x = self.inception3b(self.inception3a(x))
        x = self.pool3(x)
        x = self.inception4a(x)
        x = self.inception4e(self.inception4d(self.inception4c(self.inception4b(x))))
        x = self.pool4(x)
        return self.inception5b(self.inception5a(x))


class GoogLeNet(nn.Module):
    """GoogLeNet inference network: trunk, global average pool, dropout, classifier."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.4) -> None:
        super().__init__()
        self.trunk = GoogLeNetTrunk()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(self.trunk.out_channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.dropout(torch.flatten(self.avgpool(self.trunk(x)), 1))
        return self.fc(x)


def googlenet(num_classes: int = 1000) -> GoogLeNet:
    """GoogLeNet (Inception v1) without the auxiliary classifiers."""
    return GoogLeNet(num_classes)
