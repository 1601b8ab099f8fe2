"""BlazeFace (Bazarevsky et al., 2019), the front-camera model of MediaPipe.

As shipped in MediaPipe's ``face_detection_front.tflite`` (128×128 input), the model the
memory planner paper benchmarks: a 5×5/2 stem and sixteen single BlazeBlocks (3×3
depthwise + 1×1 pointwise, residual, with max-pool and zero channel padding on the skip
path when the block downsamples or widens), and SSD heads on the 16×16 and 8×8 maps
(2 and 6 anchors per cell, 896 anchors in all at 128×128). BatchNorm is folded into the
convolutions in that model, so there is none here either. TFLite's asymmetric "same"
padding of strided convolutions is reproduced with explicit zero padding.

The output is one tensor ``(N, anchors, 17)``: 16 box/keypoint regressors then the face
score logit per anchor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BlazeBlock(nn.Module):
    """Depthwise 3×3 + pointwise 1×1, added to the (pooled, channel-padded) input; ReLU."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.stride = stride
        self.channel_pad = out_channels - in_channels
        padding = 0 if stride == 2 else 1
        self.convs = nn.Sequential(
            nn.Conv2d(in_channels, in_channels, 3, stride, padding, groups=in_channels),
            nn.Conv2d(in_channels, out_channels, 1),
        )
        if stride == 2:
            self.max_pool = nn.MaxPool2d(2, 2)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 2:
            h = F.pad(x, (0, 2, 0, 2))
            x = self.max_pool(x)
        else:
            h = x
        if self.channel_pad > 0:
            x = F.pad(x, (0, 0, 0, 0, 0, self.channel_pad))
        return self.act(self.convs(h) + x)


def _head(x: torch.Tensor, conv: nn.Conv2d, width: int) -> torch.Tensor:
    y = conv(x).permute(0, 2, 3, 1)
    return y.reshape(y.shape[0], -1, width)


class BlazeFace(nn.Module):
    """BlazeFace front model; ``forward`` returns ``(N, anchors, 17)``."""

    def __init__(self) -> None:
        super().__init__()
        chans = [(24, 24, 1), (24, 28, 1), (28, 32, 2), (32, 36, 1), (36, 42, 1), (42, 48, 2),
                 (48, 56, 1), (56, 64, 1), (64, 72, 1), (72, 80, 1), (80, 88, 1)]
        self.backbone1 = nn.Sequential(
            nn.Conv2d(3, 24, 5, 2), nn.ReLU(), *(BlazeBlock(i, o, s) for i, o, s in chans)
        )
        self.backbone2 = nn.Sequential(BlazeBlock(88, 96, 2), *(BlazeBlock(96, 96) for _ in range(4)))
        self.classifier_8 = nn.Conv2d(88, 2, 1)
        self.classifier_16 = nn.Conv2d(96, 6, 1)
        self.regressor_8 = nn.Conv2d(88, 32, 1)
        self.regressor_16 = nn.Conv2d(96, 96, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.backbone1(F.pad(x, (1, 2, 1, 2)))  # (N, 88, 16, 16) at 128×128
        h = self.backbone2(x)  # (N, 96, 8, 8)
        scores = torch.cat([_head(x, self.classifier_8, 1), _head(h, self.classifier_16, 1)], 1)
        boxes = torch.cat([_head(x, self.regressor_8, 16), _head(h, self.regressor_16, 16)], 1)
        return torch.cat([boxes, scores], 2)


def blazeface() -> BlazeFace:
    """BlazeFace front-camera face detector (128×128)."""
    return BlazeFace()
