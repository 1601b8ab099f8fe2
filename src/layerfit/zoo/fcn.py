"""Fully convolutional networks for semantic segmentation.

``fcn8s`` — FCN-8s with a VGG-16 backbone (Long, Shelhamer & Darrell, CVPR 2015), as the
authors' Caffe ``voc-fcn8s`` model: conv1_1 pads by 100 so any input size works, fc6/fc7
are 7×7 and 1×1 convolutions, 21-class scores are fused with pool4 and pool3 predictions
through learned 2×, 2× and 8× transposed convolutions (initialised to bilinear
interpolation), and Caffe's ``Crop`` layers (offsets 5, 9 and 31) align the maps. Max
pools round up as in Caffe. Output ``(N, 21, H, W)``.

``fcn_resnet101`` — FCN with a dilated ResNet-101 backbone (output stride 8) and FCN heads
on layer4 (main) and layer3 (auxiliary), the 54.3 M-parameter model whose 207 MB SwapNet
uses for scene segmentation. Both heads' logits are upsampled bilinearly to the input
size and returned concatenated on the channel axis: ``(N, 2·classes, H, W)``, main
first, so every parameter takes part in the forward pass.
"""

from __future__ import annotations

import torch
from torch import nn

from layerfit.zoo import _layers
from layerfit.zoo.resnet import ResNet
from layerfit.zoo.vgg import _CFGS


class FCN8s(nn.Module):
    """FCN-8s (VGG-16 backbone, staged version without score scaling)."""

    def __init__(self, num_classes: int = 21, dropout: float = 0.5) -> None:
        super().__init__()
        cfg = _CFGS["vgg16"]
        convs: list[nn.Module] = []
        in_ch = 3
        for v in cfg:
            if v == "M":
                convs.append(nn.MaxPool2d(2, 2, ceil_mode=True))
            else:
                convs += [nn.Conv2d(in_ch, int(v), 3, padding=100 if not convs else 1), nn.ReLU()]
                in_ch = int(v)
        # Split after pool3 (index 16) and pool4 (index 23) for the skip connections.
        self.to_pool3 = nn.Sequential(*convs[:17])
        self.to_pool4 = nn.Sequential(*convs[17:24])
        self.to_pool5 = nn.Sequential(*convs[24:])
        self.fc6 = nn.Conv2d(512, 4096, 7)
        self.relu6 = nn.ReLU()
        self.drop6 = nn.Dropout(dropout)
        self.fc7 = nn.Conv2d(4096, 4096, 1)
        self.relu7 = nn.ReLU()
        self.drop7 = nn.Dropout(dropout)
        self.score_fr = nn.Conv2d(4096, num_classes, 1)
        self.score_pool4 = nn.Conv2d(512, num_classes, 1)
        self.score_pool3 = nn.Conv2d(256, num_classes, 1)
        self.upscore2 = nn.ConvTranspose2d(num_classes, num_classes, 4, 2, bias=False)
        self.upscore_pool4 = nn.ConvTranspose2d(num_classes, num_classes, 4, 2, bias=False)
        self.upscore8 = nn.ConvTranspose2d(num_classes, num_classes, 16, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pool3 = self.to_pool3(x)
        pool4 = self.to_pool4(pool3)
        h = self.to_pool5(pool4)
        h = self.drop6(self.relu6(self.fc6(h)))
        h = self.drop7(self.relu7(self.fc7(h)))
        upscore2 = self.upscore2(self.score_fr(h))
        fuse_pool4 = upscore2 + _layers.crop_like(self.score_pool4(pool4), upscore2, 5)
        upscore_pool4 = self.upscore_pool4(fuse_pool4)
        fuse_pool3 = upscore_pool4 + _layers.crop_like(self.score_pool3(pool3), upscore_pool4, 9)
        return _layers.crop_like(self.upscore8(fuse_pool3), x, 31)


class FCNHead(nn.Sequential):
    """3×3 conv to in/4 channels + BN + ReLU + dropout, then 1×1 conv to the classes."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        inter = in_channels // 4
        super().__init__(
            nn.Conv2d(in_channels, inter, 3, padding=1, bias=False),
            nn.BatchNorm2d(inter),
            nn.ReLU(),
            nn.Dropout(0.1),
            nn.Conv2d(inter, num_classes, 1),
        )


class FCNResNet(nn.Module):
    """FCN on a dilated ResNet (output stride 8) with main and auxiliary heads."""

    def __init__(self, layers: list[int], num_classes: int = 21) -> None:
        super().__init__()
        self.backbone = ResNet(layers, replace_stride_with_dilation=(False, True, True), include_top=False)
        self.classifier = FCNHead(2048, num_classes)
        self.aux_classifier = FCNHead(1024, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.backbone
        c3 = b.layer3(b.layer2(b.layer1(b.stem(x))))
        c4 = b.layer4(c3)
        out = _layers.resize_to(self.classifier(c4), x, False)
        aux = _layers.resize_to(self.aux_classifier(c3), x, False)
        return torch.cat([out, aux], 1)


def fcn8s(num_classes: int = 21) -> FCN8s:
    """FCN-8s (VGG-16 backbone) for ``num_classes`` (PASCAL VOC: 21)."""
    return FCN8s(num_classes)


def fcn_resnet101(num_classes: int = 21) -> FCNResNet:
    """FCN with a dilated ResNet-101 backbone and an auxiliary head."""
    return FCNResNet([3, 4, 23, 3], num_classes)
