"""Inception v3 (Szegedy et al., "Rethinking the Inception architecture", 2016), no aux head.

The inference graph: the auxiliary classifier exists only for training and is left out
(23.8 M parameters instead of 27.2 M), as in the TensorFlow Lite model the memory planner
paper evaluates. Module names follow the common PyTorch layout (``Conv2d_1a_3x3``,
``Mixed_5b`` …); every convolution is conv (no bias) + BN (eps 1e-3) + ReLU. Input
299×299; the smallest input the stride-2 reductions allow is 75×75.
"""

from __future__ import annotations

import torch
from torch import nn

from layerfit.zoo._layers import conv_bn_act


def _basic(in_ch: int, out_ch: int, kernel: int | tuple[int, int], stride: int = 1,
           padding: int | tuple[int, int] = 0) -> nn.Sequential:
    return conv_bn_act(in_ch, out_ch, kernel, stride, padding, eps=1e-3)


class InceptionA(nn.Module):
    """35×35 module: 1×1, 5×5, double 3×3 and pooled branches."""

    def __init__(self, in_ch: int, pool_features: int) -> None:
        super().__init__()
        self.branch1x1 = _basic(in_ch, 64, 1)
        self.branch5x5_1 = _basic(in_ch, 48, 1)
        self.branch5x5_2 = _basic(48, 64, 5, padding=2)
        self.branch3x3dbl_1 = _basic(in_ch, 64, 1)
        self.branch3x3dbl_2 = _basic(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = _basic(96, 96, 3, padding=1)
        self.avgpool = nn.AvgPool2d(3, 1, 1)
        self.branch_pool = _basic(in_ch, pool_features, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b5 = self.branch5x5_2(self.branch5x5_1(x))
        b3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        bp = self.branch_pool(self.avgpool(x))
        return torch.cat([b1, b5, b3, bp], 1)


class InceptionB(nn.Module):
    """Grid reduction 35→17: strided 3×3, strided double 3×3 and max pool branches."""

    def __init__(self, in_ch: int) -> None:
        super().__init__()
        self.branch3x3 = _basic(in_ch, 384, 3, stride=2)
        self.branch3x3dbl_1 = _basic(in_ch, 64, 1)
        self.branch3x3dbl_2 = _basic(64, 96, 3, padding=1)
        self.branch3x3dbl_3 = _basic(96, 96, 3, stride=2)
        self.maxpool = nn.MaxPool2d(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3(x)
        bd = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        return torch.cat([b3, bd, self.maxpool(x)], 1)


class InceptionC(nn.Module):
    """17×17 module with factorised 7×7 convolutions (1×7 and 7×1)."""

    def __init__(self, in_ch: int, c7: int) -> None:
        super().__init__()
        self.branch1x1 = _basic(in_ch, 192, 1)
        self.branch7x7_1 = _basic(in_ch, c7, 1)
        self.branch7x7_2 = _basic(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7_3 = _basic(c7, 192, (7, 1), padding=(3, 0))
        self.branch7x7dbl_1 = _basic(in_ch, c7, 1)
        self.branch7x7dbl_2 = _basic(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_3 = _basic(c7, c7, (1, 7), padding=(0, 3))
        self.branch7x7dbl_4 = _basic(c7, c7, (7, 1), padding=(3, 0))
        self.branch7x7dbl_5 = _basic(c7, 192, (1, 7), padding=(0, 3))
        self.avgpool = nn.AvgPool2d(3, 1, 1)
        self.branch_pool = _basic(in_ch, 192, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        bd = self.branch7x7dbl_1(x)
        bd = self.branch7x7dbl_3(self.branch7x7dbl_2(bd))
        bd = self.branch7x7dbl_5(self.branch7x7dbl_4(bd))
        bp = self.branch_pool(self.avgpool(x))
        return torch.cat([b1, b7, bd, bp], 1)


class InceptionD(nn.Module):
    """Grid reduction 17→8: strided 3×3, strided 7×7×3 and max pool branches."""

    def __init__(self, in_ch: int) -> None:
        super().__init__()
        self.branch3x3_1 = _basic(in_ch, 192, 1)
        self.branch3x3_2 = _basic(192, 320, 3, stride=2)
        self.branch7x7x3_1 = _basic(in_ch, 192, 1)
        self.branch7x7x3_2 = _basic(192, 192, (1, 7), padding=(0, 3))
        self.branch7x7x3_3 = _basic(192, 192, (7, 1), padding=(3, 0))
        self.branch7x7x3_4 = _basic(192, 192, 3, stride=2)
        self.maxpool = nn.MaxPool2d(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3_2(self.branch3x3_1(x))
        b7 = self.branch7x7x3_2(self.branch7x7x3_1(x))
        b7 = self.branch7x7x3_4(self.branch7x7x3_3(b7))
        return torch.cat([b3, b7, self.maxpool(x)], 1)


class InceptionE(nn.Module):
    """8×8 module with expanded filter banks (1×3 and 3×1 in parallel)."""

    def __init__(self, in_ch: int) -> None:
        super().__init__()
        self.branch1x1 = _basic(in_ch, 320, 1)
        self.branch3x3_1 = _basic(in_ch, 384, 1)
        self.branch3x3_2a = _basic(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3_2b = _basic(384, 384, (3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = _basic(in_ch, 448, 1)
        self.branch3x3dbl_2 = _basic(448, 384, 3, padding=1)
        self.branch3x3dbl_3a = _basic(384, 384, (1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = _basic(384, 384, (3, 1), padding=(1, 0))
        self.avgpool = nn.AvgPool2d(3, 1, 1)
        self.branch_pool = _basic(in_ch, 192, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b1 = self.branch1x1(x)
        b3 = self.branch3x3_1(x)
        b3 = torch.cat([self.branch3x3_2a(b3), self.branch3x3_2b(b3)], 1)
        bd = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        bd = torch.cat([self.branch3x3dbl_3a(bd), self.branch3x3dbl_3b(bd)], 1)
        bp = self.branch_pool(self.avgpool(x))
        return torch.cat([b1, b3, bd, bp], 1)


class InceptionV3(nn.Module):
    """Inception v3 inference network (no auxiliary classifier)."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.5) -> None:
        super().__init__()
        self.Conv2d_1a_3x3 = _basic(3, 32, 3, stride=2)
        self.Conv2d_2a_3x3 = _basic(32, 32, 3)
        self.Conv2d_2b_3x3 = _basic(32, 64, 3, padding=1)
        self.maxpool1 = nn.MaxPool2d(3, 2)
        self.Conv2d_3b_1x1 = _basic(64, 80, 1)
        self.Conv2d_4a_3x3 = _basic(80, 192, 3)
        self.maxpool2 = nn.MaxPool2d(3, 2)
        self.Mixed_5b = InceptionA(192, 32)
        self.Mixed_5c = InceptionA(256, 64)
        self.Mixed_5d = InceptionA(288, 64)
        self.Mixed_6a = InceptionB(288)
        self.Mixed_6b = InceptionC(768, 128)
        self.Mixed_6c = InceptionC(768, 160)
        self.Mixed_6d = InceptionC(768, 160)
        self.Mixed_6e = InceptionC(768, 192)
        self.Mixed_7a = InceptionD(768)
        self.Mixed_7b = InceptionE(1280)
        self.Mixed_7c = InceptionE(2048)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool1(self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x))))
        x = self.maxpool2(self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x)))
        x = self.Mixed_5d(self.Mixed_5c(self.Mixed_5b(x)))
        x = self.Mixed_6a(x)
        x = self.Mixed_6e(self.Mixed_6d(self.Mixed_6c(self.Mixed_6b(x))))
        x = self.Mixed_7c(self.Mixed_7b(self.Mixed_7a(x)))
        x = self.dropout(torch.flatten(self.avgpool(x), 1))
        return self.fc(x)


def inception_v3(num_classes: int = 1000) -> InceptionV3:
    """Inception v3 without the auxiliary head."""
    return InceptionV3(num_classes)
