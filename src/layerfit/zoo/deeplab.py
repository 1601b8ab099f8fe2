"""DeepLab v3 with a MobileNet v2 backbone (Chen et al., 2017; Sandler et al., 2018, §6.3).

The mobile configuration released as TensorFlow Lite ``deeplabv3_257_mv_gpu.tflite``
(the model the memory planner paper benchmarks): MobileNet v2 features up to the
320-channel block at output stride 16 (the last stride becomes a dilation of 2), the
simplified ASPP of the MobileNet v2 paper — image-level pooling branch and 1×1 branch,
no atrous 3×3 branches — each 256 channels with BatchNorm and ReLU, a 1×1 projection,
and 21-class (PASCAL VOC) logits bilinearly upsampled to the input size. Input 257×257.
"""

from __future__ import annotations

import torch
from torch import nn

from layerfit.zoo import _layers
from layerfit.zoo._layers import conv_bn_act
from layerfit.zoo.mobilenet import MobileNetV2


class MobileASPP(nn.Module):
    """Image pooling branch + 1×1 branch, concatenated and projected to 256 channels."""

    def __init__(self, in_channels: int, channels: int = 256, dropout: float = 0.1) -> None:
        super().__init__()
        self.image_pool = nn.AdaptiveAvgPool2d(1)
        self.image_conv = conv_bn_act(in_channels, channels, 1)
        self.conv1x1 = conv_bn_act(in_channels, channels, 1)
        self.project = conv_bn_act(2 * channels, channels, 1)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = self.image_conv(self.image_pool(x)).expand(-1, -1, x.shape[2], x.shape[3])
        return self.dropout(self.project(torch.cat([pooled, self.conv1x1(x)], 1)))


class DeepLabV3(nn.Module):
    """DeepLab v3 (MobileNet v2, output stride 16); returns ``(N, classes, H, W)`` logits."""

    def __init__(self, num_classes: int = 21, output_stride: int = 16) -> None:
        super().__init__()
        self.backbone = MobileNetV2(output_stride=output_stride, include_top=False)
        self.aspp = MobileASPP(self.backbone.out_channels)
        self.logits = nn.Conv2d(256, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.logits(self.aspp(self.backbone(x)))
        return _layers.resize_to(y, x, True)


def deeplab_v3(num_classes: int = 21, output_stride: int = 16) -> DeepLabV3:
    """DeepLab v3 with MobileNet v2 backbone (the TFLite 257×257 model)."""
    return DeepLabV3(num_classes, output_stride)
