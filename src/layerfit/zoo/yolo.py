"""YOLO detectors as Darknet defines them: YOLOv3, YOLOv4, Tiny-YOLOv3, Tiny-YOLOv2.

Each network is a list of Darknet layers built from a transcription of its ``.cfg`` file
(``[convolutional]``, ``[route]``, ``[shortcut]``, ``[maxpool]``, ``[upsample]``,
``[yolo]``/``[region]``), so layer ``i`` here is layer ``i`` in Darknet — YOLOv4 has the
162 layers (110 convolutional, 21 route, 23 shortcut, 3 max pool, 2 upsample, 3 yolo)
Demand Layering profiles, YOLOv3 its 107. Parameters live in ``layers.<i>.conv`` and
``layers.<i>.bn``.

``forward`` returns the raw (not decoded) predictions of all detection layers as one
tensor ``(N, Σ anchors·H·W, 5 + classes)`` — per anchor box: x, y, w, h, objectness and
class logits, detection layers in cfg order, cells in row-major order. Decoding with
anchors and non-maximum suppression is post-processing and not part of the network.
Inputs must be multiples of 32 (default 608×608 for YOLOv3/v4 as in Demand Layering,
416×416 for the tiny models as in their cfg files).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

_ACTS = {"leaky": lambda: nn.LeakyReLU(0.1), "mish": nn.Mish, "linear": nn.Identity}


class DarknetConv(nn.Module):
    """``[convolutional]``: conv ("same" padding) + optional BN + activation."""

    def __init__(self, in_ch: int, out_ch: int, size: int, stride: int, bn: bool, act: str) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_ch, out_ch, size, stride, size // 2, bias=not bn)
        self.bn = nn.BatchNorm2d(out_ch) if bn else None
        self.act = _ACTS[act]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        if self.bn is not None:
            x = self.bn(x)
        return self.act(x)


class DarknetResidualConv(DarknetConv):
    """The convolution that ends a residual unit (its BN scale is damped at initialisation)."""

    residual_norm = "bn"


class Route(nn.Module):
    """``[route]``: channel concatenation of earlier layers' outputs."""

    def __init__(self, sources: tuple[int, ...]) -> None:
        super().__init__()
        self.sources = sources

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return xs[0] if len(xs) == 1 else torch.cat(xs, 1)


class Shortcut(nn.Module):
    """``[shortcut]``: previous output plus an earlier layer's output (linear activation)."""

    def __init__(self, source: int) -> None:
        super().__init__()
        self.source = source

    def forward(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        return x + other


class DarknetMaxPool(nn.Module):
    """``[maxpool]`` with Darknet's padding (``size - 1`` in all, extra on the right/bottom)."""

    def __init__(self, size: int, stride: int) -> None:
        super().__init__()
        pad = size - 1
        if stride == 1 and size % 2 == 1:
            self.pad = None
            self.pool = nn.MaxPool2d(size, 1, size // 2)
        elif stride == size:
            self.pad = None
            self.pool = nn.MaxPool2d(size, stride, ceil_mode=True)
        else:  # replicate padding is exact for a max: the edge value is already in the window
            self.pad = nn.ReplicationPad2d((pad // 2, pad - pad // 2, pad // 2, pad - pad // 2))
            self.pool = nn.MaxPool2d(size, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x if self.pad is None else self.pad(x))


class DetectionOutput(nn.Module):
    """``[yolo]`` / ``[region]``: passes its input on; its predictions go to the output."""

    def __init__(self, anchors: int, classes: int) -> None:
        super().__init__()
        self.anchors = anchors
        self.attrs = 5 + classes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, h, w = x.shape[0], x.shape[2], x.shape[3]
        y = x.view(n, self.anchors, self.attrs, h, w).permute(0, 1, 3, 4, 2)
        return y.reshape(n, -1, self.attrs)


@dataclass
class DarknetCfg:
    """A transcription of a Darknet ``.cfg``: builds layers and tracks output channels."""

    in_channels: int = 3
    layers: list[nn.Module] = field(default_factory=list)
    channels: list[int] = field(default_factory=list)

    def _add(self, layer: nn.Module, out_ch: int) -> int:
        self.layers.append(layer)
        self.channels.append(out_ch)
        return len(self.layers) - 1

    def _abs(self, i: int) -> int:
        return len(self.layers) + i if i < 0 else i

    @property
    def out(self) -> int:
        return self.channels[-1] if self.channels else self.in_channels

    def conv(
        self, filters: int, size: int = 1, stride: int = 1, act: str = "leaky", bn: bool = True,
        residual: bool = False,
    ) -> int:
        kind = DarknetResidualConv if residual else DarknetConv
        return self._add(kind(self.out, filters, size, stride, bn, act), filters)

    def route(self, *layers: int) -> int:
        src = tuple(self._abs(i) for i in layers)
        return self._add(Route(src), sum(self.channels[i] for i in src))

    def shortcut(self, source: int) -> int:
        return self._add(Shortcut(self._abs(source)), self.out)

    def maxpool(self, size: int, stride: int) -> int:
        return self._add(DarknetMaxPool(size, stride), self.out)

    def upsample(self, stride: int = 2) -> int:
        return self._add(nn.Upsample(scale_factor=stride, mode="nearest"), self.out)

    def detect(self, anchors: int = 3, classes: int = 80) -> int:
        return self._add(DetectionOutput(anchors, classes), self.out)

    def residual(self, hidden: int, filters: int, act: str = "leaky") -> None:
        """Darknet residual unit: 1×1 conv, 3×3 conv, shortcut from 3 layers back."""
        self.conv(hidden, 1, act=act)
        self.conv(filters, 3, act=act, residual=True)
        self.shortcut(-3)


class Darknet(nn.Module):
    """Runs a Darknet layer list; keeps only the outputs later layers refer to."""

    def __init__(self, cfg: DarknetCfg) -> None:
        super().__init__()
        self.layers = nn.ModuleList(cfg.layers)
        last_use: dict[int, int] = {}
        for i, layer in enumerate(cfg.layers):
            refs = layer.sources if isinstance(layer, Route) else (
                (layer.source,) if isinstance(layer, Shortcut) else ())
            for r in refs:
                last_use[r] = i
        self._kept = frozenset(last_use)
        self._release: dict[int, tuple[int, ...]] = {}
        for src, i in last_use.items():
            self._release[i] = (*self._release.get(i, ()), src)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        saved: dict[int, torch.Tensor] = {}
        detections: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            if isinstance(layer, Route):
                x = layer(*(saved[j] for j in layer.sources))
            elif isinstance(layer, Shortcut):
                x = layer(x, saved[layer.source])
            elif isinstance(layer, DetectionOutput):
                detections.append(layer(x))
            else:
                x = layer(x)
            for j in self._release.get(i, ()):
                del saved[j]
            if i in self._kept:
                saved[i] = x
        return detections[0] if len(detections) == 1 else torch.cat(detections, 1)


def _head(cfg: DarknetCfg, filters: int) -> None:
    """The five alternating 1×1 / 3×3 convolutions before a YOLOv3/v4 detection branch."""
    for _ in range(2):
        cfg.conv(filters, 1)
        cfg.conv(filters * 2, 3)
    cfg.conv(filters, 1)


def yolov3_cfg(classes: int = 80) -> DarknetCfg:
    """``yolov3.cfg``: Darknet-53 backbone and three detection scales (107 layers)."""
    out = 3 * (5 + classes)
    c = DarknetCfg()
    c.conv(32, 3)
    for filters, blocks in ((64, 1), (128, 2), (256, 8), (512, 8), (1024, 4)):
        c.conv(filters, 3, 2)
        for _ in range(blocks):
            c.residual(filters // 2, filters)
    # 13×13 (stride 32)
    _head(c, 512)                          # 75-79
    c.conv(1024, 3)
    c.conv(out, 1, act="linear", bn=False)
    c.detect(3, classes)                        # 82
    c.route(-4)
    c.conv(256, 1)
    c.upsample()
    c.route(-1, 61)
    _head(c, 256)                          # 87-91
    c.conv(512, 3)
    c.conv(out, 1, act="linear", bn=False)
    c.detect(3, classes)                        # 94
    c.route(-4)
    c.conv(128, 1)
    c.upsample()
    c.route(-1, 36)
    _head(c, 128)                          # 99-103
    c.conv(256, 3)
    c.conv(out, 1, act="linear", bn=False)
    c.detect(3, classes)                        # 106
    return c


def yolov4_cfg(classes: int = 80) -> DarknetCfg:
    """``yolov4.cfg``: CSPDarknet-53, SPP, PANet and three YOLO heads (162 layers)."""
    out = 3 * (5 + classes)
    c = DarknetCfg()
    c.conv(32, 3, act="mish")
    # Stage 1 (64 channels, one residual unit with a 32-channel bottleneck).
    c.conv(64, 3, 2, act="mish")
    c.conv(64, 1, act="mish")
    c.route(-2)
    c.conv(64, 1, act="mish")
    c.residual(32, 64, act="mish")
    c.conv(64, 1, act="mish")
    c.route(-1, -7)
    c.conv(64, 1, act="mish")                   # 10
    for filters, blocks in ((128, 2), (256, 8), (512, 8), (1024, 4)):
        half = filters // 2
        c.conv(filters, 3, 2, act="mish")
        split = c.conv(half, 1, act="mish")
        c.route(-2)
        c.conv(half, 1, act="mish")
        for _ in range(blocks):
            c.residual(half, half, act="mish")
        c.conv(half, 1, act="mish")
        c.route(-1, split)
        c.conv(filters, 1, act="mish")          # 23, 54, 85, 104
    # SPP
    c.conv(512, 1)
    c.conv(1024, 3)
    c.conv(512, 1)                              # 107
    c.maxpool(5, 1)
    c.route(-2)
    c.maxpool(9, 1)
    c.route(-4)
    c.maxpool(13, 1)
    c.route(-1, -3, -5, -6)                     # 113
    c.conv(512, 1)
    c.conv(1024, 3)
    spp_out = c.conv(512, 1)                    # 116
    # PAN, top-down
    c.conv(256, 1)
    c.upsample()
    c.route(85)
    c.conv(256, 1)
    c.route(-1, -3)
    _head(c, 256)
    mid = len(c.layers) - 1                     # 126
    c.conv(128, 1)
    c.upsample()
    c.route(54)
    c.conv(128, 1)
    c.route(-1, -3)
    _head(c, 128)                          # 132-136
    # Heads, bottom-up
    c.conv(256, 3)
    c.conv(out, 1, act="linear", bn=False)
    c.detect(3, classes)                        # 139
    c.route(-4)
    c.conv(256, 3, 2)
    c.route(-1, mid)
    _head(c, 256)                          # 143-147
    c.conv(512, 3)
    c.conv(out, 1, act="linear", bn=False)
    c.detect(3, classes)                        # 150
    c.route(-4)
    c.conv(512, 3, 2)
    c.route(-1, spp_out)
    _head(c, 512)                          # 154-158
    c.conv(1024, 3)
    c.conv(out, 1, act="linear", bn=False)
    c.detect(3, classes)                        # 161
    return c


def tiny_yolov3_cfg(classes: int = 80) -> DarknetCfg:
    """``yolov3-tiny.cfg``: 13 layers of conv + max pool, two detection scales (24 layers)."""
    out = 3 * (5 + classes)
    c = DarknetCfg()
    for filters in (16, 32, 64, 128, 256):
        c.conv(filters, 3)
        c.maxpool(2, 2)
    c.conv(512, 3)                              # 10
    c.maxpool(2, 1)
    c.conv(1024, 3)
    c.conv(256, 1)                              # 13
    c.conv(512, 3)
    c.conv(out, 1, act="linear", bn=False)
    c.detect(3, classes)                        # 16
    c.route(-4)
    c.conv(128, 1)
    c.upsample()
    c.route(-1, 8)
    c.conv(256, 3)
    c.conv(out, 1, act="linear", bn=False)
    c.detect(3, classes)                        # 23
    return c


def tiny_yolov2_cfg(classes: int = 20) -> DarknetCfg:
    """``yolov2-tiny-voc.cfg``: nine convolutions, six max pools, one region layer."""
    c = DarknetCfg()
    for filters in (16, 32, 64, 128, 256):
        c.conv(filters, 3)
        c.maxpool(2, 2)
    c.conv(512, 3)
    c.maxpool(2, 1)
    c.conv(1024, 3)
    c.conv(1024, 3)
    c.conv(5 * (5 + classes), 1, act="linear", bn=False)
    c.detect(5, classes)                        # [region], 5 anchors
    return c


def yolov3(num_classes: int = 80) -> Darknet:
    """YOLOv3 (Redmon & Farhadi, 2018), COCO: 80 classes, 255 channels per scale."""
    return Darknet(yolov3_cfg(num_classes))


def yolov4(num_classes: int = 80) -> Darknet:
    """YOLOv4 (Bochkovskiy et al., 2020): CSPDarknet-53 + SPP + PAN, COCO."""
    return Darknet(yolov4_cfg(num_classes))


def tiny_yolov3(num_classes: int = 80) -> Darknet:
    """Tiny-YOLOv3 (``yolov3-tiny.cfg``), COCO."""
    return Darknet(tiny_yolov3_cfg(num_classes))


def tiny_yolov2(num_classes: int = 20) -> Darknet:
    """Tiny-YOLOv2 (``yolov2-tiny-voc.cfg``), PASCAL VOC: the TinyYOLO that MASA schedules."""
    return Darknet(tiny_yolov2_cfg(num_classes))
