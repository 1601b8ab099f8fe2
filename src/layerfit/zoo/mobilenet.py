"""MobileNet v1 (Howard et al., 2017) and MobileNet v2 (Sandler et al., 2018).

v1: a 3×3/2 stem and 13 depthwise-separable blocks (depthwise 3×3 + BN + ReLU6, then
pointwise 1×1 + BN + ReLU6); channel counts scale with the width multiplier α, as
TensorFlow's ``depth(d) = max(int(d·α), 8)``. v2: inverted residual blocks (1×1 expand,
3×3 depthwise, linear 1×1 project) in the common PyTorch layout. ``MobileNetV2`` also
takes an ``output_stride`` (16 or 8) for dense prediction, applied the way TensorFlow's
DeepLab does it: once the stride reaches ``output_stride``, later strides become 1 and
later depthwise convolutions are dilated instead (:mod:`layerfit.zoo.deeplab`).
"""

from __future__ import annotations

import torch
from torch import nn

from layerfit.zoo._layers import conv_bn_act

# (output channels, stride) of the 13 depthwise-separable blocks of MobileNet v1.
_V1_BLOCKS = [
    (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
    (512, 1), (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1),
]

# (expansion t, output channels c, repeats n, first stride s) of MobileNet v2.
_V2_SETTINGS = [
    (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
    (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1),
]


def _make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class DepthwiseSeparable(nn.Sequential):
    """MobileNet v1 block: depthwise 3×3 (stride) + BN + ReLU6, pointwise 1×1 + BN + ReLU6."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__(
            conv_bn_act(in_channels, in_channels, 3, stride, groups=in_channels, act=nn.ReLU6),
            conv_bn_act(in_channels, out_channels, 1, act=nn.ReLU6),
        )


class MobileNetV1(nn.Module):
    """MobileNet v1 with width multiplier ``width_mult`` (1.0, 0.75, 0.5, 0.25)."""

    def __init__(self, width_mult: float = 1.0, num_classes: int = 1000, dropout: float = 0.001) -> None:
        super().__init__()

        def depth(d: int) -> int:
            return max(int(d * width_mult), 8)

        layers: list[nn.Module] = [conv_bn_act(3, depth(32), 3, 2, act=nn.ReLU6)]
        ch = depth(32)
        for c, s in _V1_BLOCKS:
            layers.append(DepthwiseSeparable(ch, depth(c), s))
            ch = depth(c)
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(ch, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


class InvertedResidual(nn.Module):
    """MobileNet v2 block: [1×1 expand] → 3×3 depthwise → linear 1×1 project (+ input)."""

    residual_norm = "last_norm"

    def __init__(self, inp: int, oup: int, stride: int, expand_ratio: int, dilation: int = 1) -> None:
        super().__init__()
        hidden = int(round(inp * expand_ratio))
        self.use_res_connect = stride == 1 and inp == oup
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(conv_bn_act(inp, hidden, 1, act=nn.ReLU6))
        layers += [
            conv_bn_act(hidden, hidden, 3, stride, groups=hidden, dilation=dilation, act=nn.ReLU6),
            nn.Conv2d(hidden, oup, 1, bias=False),
            nn.BatchNorm2d(oup),
        ]
        self.conv = nn.Sequential(*layers)

    @property
    def last_norm(self) -> nn.Module | None:
        """The projection's norm when the block is residual (damped at initialisation)."""
        return self.conv[-1] if self.use_res_connect else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.use_res_connect:
            return x + self.conv(x)
        return self.conv(x)


class MobileNetV2(nn.Module):
    """MobileNet v2; ``include_top=False`` keeps only features up to the 320-channel block."""

    def __init__(
        self,
        width_mult: float = 1.0,
        num_classes: int = 1000,
        dropout: float = 0.2,
        output_stride: int | None = None,
        include_top: bool = True,
    ) -> None:
        super().__init__()
        in_ch = _make_divisible(32 * width_mult)
        layers: list[nn.Module] = [conv_bn_act(3, in_ch, 3, 2, act=nn.ReLU6)]
        current_stride, rate = 2, 1
        for t, c, n, s in _V2_SETTINGS:
            out_ch = _make_divisible(c * width_mult)
            for i in range(n):
                stride = s if i == 0 else 1
                if output_stride is not None and current_stride == output_stride:
                    layer_stride, layer_rate = 1, rate
                    rate *= stride
                else:
                    layer_stride, layer_rate = stride, 1
                    current_stride *= stride
                layers.append(InvertedResidual(in_ch, out_ch, layer_stride, t, layer_rate))
                in_ch = out_ch
        self.out_channels = in_ch
        self.include_top = include_top
        if include_top:
            last = _make_divisible(1280 * max(1.0, width_mult))
            layers.append(conv_bn_act(in_ch, last, 1, act=nn.ReLU6))
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(last, num_classes))
        self.features = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        if not self.include_top:
            return x
        return self.classifier(torch.flatten(self.avgpool(x), 1))


def mobilenet_v1(width_mult: float = 1.0, num_classes: int = 1000) -> MobileNetV1:
    """MobileNet v1 with width multiplier ``width_mult``."""
    return MobileNetV1(width_mult, num_classes)


def mobilenet_v2(width_mult: float = 1.0, num_classes: int = 1000) -> MobileNetV2:
    """MobileNet v2 with width multiplier ``width_mult``."""
    return MobileNetV2(width_mult, num_classes)
