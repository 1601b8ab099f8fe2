"""ResNet-50/101/152 (He et al., 2016), bottleneck version 1.5 (stride in the 3×3 conv).

Layout and parameter names follow the common PyTorch layout (``conv1``, ``bn1``,
``layer1`` … ``layer4``, ``fc``) so safetensors checkpoints in that layout bind by name.
``replace_stride_with_dilation`` turns later stages into dilated ones (used by the
FCN-ResNet segmentation head in :mod:`layerfit.zoo.fcn`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class Bottleneck(nn.Module):
    """1×1 reduce → 3×3 (stride, dilation) → 1×1 expand, plus identity or projection."""

    expansion = 4
    residual_norm = "bn3"  # damped by the zoo initialiser

    def __init__(
        self,
        inplanes: int,
        planes: int,
        stride: int = 1,
        dilation: int = 1,
        downsample: nn.Module | None = None,
    ) -> None:
        super().__init__()
        width = planes
        self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(
            width, width, 3, stride, padding=dilation, dilation=dilation, bias=False
        )
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU()
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """Stem (7×7/2 conv, 3×3/2 max pool), four bottleneck stages, global pool, classifier."""

    def __init__(
        self,
        layers: Sequence[int],
        num_classes: int = 1000,
        replace_stride_with_dilation: Sequence[bool] = (False, False, False),
        include_top: bool = True,
    ) -> None:
        super().__init__()
        self.inplanes = 64
        self.dilation = 1
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        dil = list(replace_stride_with_dilation)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], stride=2, dilate=dil[0])
        self.layer3 = self._make_layer(256, layers[2], stride=2, dilate=dil[1])
        self.layer4 = self._make_layer(512, layers[3], stride=2, dilate=dil[2])
        self.include_top = include_top
        if include_top:
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1, dilate: bool = False) -> nn.Sequential:
        previous_dilation = self.dilation
        if dilate:
            self.dilation *= stride
            stride = 1
        downsample = None
        out = planes * Bottleneck.expansion
        if stride != 1 or self.inplanes != out:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, out, 1, stride, bias=False), nn.BatchNorm2d(out)
            )
        layers = [Bottleneck(self.inplanes, planes, stride, previous_dilation, downsample)]
        self.inplanes = out
        layers += [Bottleneck(out, planes, dilation=self.dilation) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def stem(self, x: torch.Tensor) -> torch.Tensor:
        """Stem convolution and pooling (stride 4)."""
        return self.maxpool(self.relu(self.bn1(self.conv1(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        if not self.include_top:
            return x
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet50(num_classes: int = 1000) -> ResNet:
    """ResNet-50: bottleneck stages of 3, 4, 6, 3 blocks."""
    return ResNet([3, 4, 6, 3], num_classes)


def resnet101(num_classes: int = 1000) -> ResNet:
    """ResNet-101: bottleneck stages of 3, 4, 23, 3 blocks."""
    return ResNet([3, 4, 23, 3], num_classes)


def resnet152(num_classes: int = 1000) -> ResNet:
    """ResNet-152: bottleneck stages of 3, 8, 36, 3 blocks."""
    return ResNet([3, 8, 36, 3], num_classes)
