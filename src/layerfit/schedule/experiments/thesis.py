"""Built-in profile set: the thesis's nine Caffe networks, *derived*, not measured.

Label: ``source = "thesis-derived"``. Until real profiles of prepared models exist, this
set lets the simulator reproduce the thesis's experiments. What comes from the thesis
(Cox 2020, Table 6.1) is exact: for every network the storage space, the peak memory in
bulk execution and the numbers of conv, fc and total Caffe layers. Everything per layer
is derived, by these stated rules:

1. **Layers** follow the published architecture of each network (AgeNet/GenderNet: Levi
   & Hassner 2015; AlexNet-style for FaceNet, SoS, MemNet and SceneNet; VGG-S for
   EmotionNet; GoogLeNet with each inception module as two units; Tiny-YOLO v2 VOC) and
   the Caffe layer counts of Table 6.1. Parameter counts, MACs and activation sizes are
   computed from the layer shapes.
2. **Weights** (``memory``, resident from load to unload) are each layer's share of the
   parameter bytes, scaled so the network's total equals Table 6.1's storage space.
3. **Load peak** is ``LOAD_PEAK_FACTOR`` × the weights (file buffer plus tensor).
4. **Execute memory** is the im2col workspace of a convolution (Caffe's column buffer);
   zero for other layers.
5. **Init memory** is EdgeCaffe's idle footprint (§7.5.2, 4.8 MB) plus every activation
   blob, which Caffe allocates when it builds the net.
6. All memory figures are then multiplied by one factor per network so that the bulk
   peak (:attr:`NetworkProfile.bulk_peak`) equals Table 6.1's memory usage — Caffe's
   runtime overheads are taken as proportional.
7. **Times** assume a Raspberry-Pi-4-class device: loads read at ``DISK_BYTES_PER_S``
   (microSD), conv and fc layers compute at ``MACS_PER_S``, other layers move their
   activations at ``MEMORY_BYTES_PER_S``; init takes ``INIT_TIME``; unloads are free.

The thesis's "MB" are read as MiB (FaceNet's AlexNet weights, 56.9 M floats, are
217 MiB, exactly Table 6.1's 217).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from layerfit.schedule.profile import LayerProfile, NetworkProfile, ProfileSet

MIB = 1024 * 1024
DISK_BYTES_PER_S = 40 * MIB
MACS_PER_S = 1.0e9
MEMORY_BYTES_PER_S = 1.0e9
INIT_TIME = 0.05
INIT_FOOTPRINT = int(4.8 * MIB)
LOAD_PEAK_FACTOR = 2.0
SOURCE = "thesis-derived"

# Table 6.1: name -> (inference, storage MiB, memory MiB, conv, fc, total layers, architecture)
TABLE_6_1: dict[str, tuple[str, int, int, int, int, int, str]] = {
    "agenet": ("age", 44, 183, 3, 3, 19, "agenet"),
    "gendernet": ("gender", 44, 186, 3, 3, 19, "gendernet"),
    "facenet": ("face", 217, 875, 5, 3, 23, "alexnet"),
    "sos": ("saliency", 218, 875, 5, 3, 21, "alexnet"),
    "googlenet": ("saliency", 23, 404, 22, 2, 151, "googlenet"),
    "tinyyolo": ("object", 62, 263, 9, 0, 39, "tiny_yolov2"),
    "emotionnet": ("emotion", 378, 761, 5, 3, 22, "vgg_s"),
    "memnet": ("memorability", 217, 880, 5, 3, 22, "alexnet"),
    "scenenet": ("object", 221, 892, 5, 3, 23, "alexnet"),
}

# Table 7.2 (laptop, ms): time to load the whole model as one file and as per-layer files.
TABLE_7_2_LOAD_MS = {"tinyyolo": (233.883, 229.015), "googlenet": (94.2531, 93.8436)}


@dataclass
class _Spec:
    name: str
    kind: str  # conv | fc | other
    params: int = 0
    macs: int = 0
    out_elems: int = 0
    workspace_elems: int = 0
    inplace: bool = False


class _Arch:
    """Tracks the activation shape while an architecture is written down layer by layer."""

    def __init__(self, channels: int, size: int) -> None:
        self.c, self.h = channels, size
        self.layers: list[_Spec] = []

    def conv(
        self, name: str, cout: int, k: int, s: int = 1, p: int = 0, g: int = 1, bias: bool = True
    ) -> None:
        hout = (self.h + 2 * p - k) // s + 1
        per_out = (self.c // g) * k * k
        params = cout * per_out + (cout if bias else 0)
        self.layers.append(
            _Spec(
                name,
                "conv",
                params,
                cout * per_out * hout * hout,
                cout * hout * hout,
                per_out * g * hout * hout,
            )
        )
        self.c, self.h = cout, hout

    def pool(self, name: str, k: int, s: int, p: int = 0) -> None:
        self.h = math.ceil((self.h + 2 * p - k) / s) + 1  # Caffe pools round up
        self.layers.append(_Spec(name, "other", out_elems=self.c * self.h * self.h))

    def same(self, name: str, inplace: bool = True, params: int = 0) -> None:
        """A layer that keeps the shape: relu, dropout, batch-norm, scale (in place), LRN, softmax."""
        self.layers.append(
            _Spec(name, "other", params=params, out_elems=self.c * self.h * self.h, inplace=inplace)
        )

    def fc(self, name: str, nout: int) -> None:
        nin = self.c * self.h * self.h
        self.layers.append(_Spec(name, "fc", nin * nout + nout, nin * nout, nout))
        self.c, self.h = nout, 1

    def block(
        self, name: str, params: int, macs: int, cout: int, size: int, kind: str = "conv"
    ) -> None:
        """A unit given by its totals (a GoogLeNet inception half)."""
        workspace = 9 * self.c * size * size // 4  # a 3x3 im2col over a quarter of the inputs
        self.layers.append(_Spec(name, kind, params, macs, cout * size * size, workspace))
        self.c, self.h = cout, size


def _levi_hassner(classes: int) -> list[_Spec]:
    a = _Arch(3, 227)
    a.conv("conv1", 96, 7, s=4)
    a.same("relu1")
    a.pool("pool1", 3, 2)
    a.same("norm1", inplace=False)
    a.conv("conv2", 256, 5, p=2)
    a.same("relu2")
    a.pool("pool2", 3, 2)
    a.same("norm2", inplace=False)
    a.conv("conv3", 384, 3, p=1)
    a.same("relu3")
    a.pool("pool5", 3, 2)
    _fc_head(a, 512, 512, classes)
    return a.layers


def _fc_head(
    a: _Arch, n6: int, n7: int, classes: int, dropout: bool = True, prob: bool = True
) -> None:
    a.fc("fc6", n6)
    a.same("relu6")
    if dropout:
        a.same("drop6")
    a.fc("fc7", n7)
    a.same("relu7")
    if dropout:
        a.same("drop7")
    a.fc("fc8", classes)
    if prob:
        a.same("prob", inplace=False)


def _alexnet(classes: int, dropout: bool = True, prob: bool = True) -> list[_Spec]:
    a = _Arch(3, 227)
    a.conv("conv1", 96, 11, s=4)
    a.same("relu1")
    a.pool("pool1", 3, 2)
    a.same("norm1", inplace=False)
    a.conv("conv2", 256, 5, p=2, g=2)
    a.same("relu2")
    a.pool("pool2", 3, 2)
    a.same("norm2", inplace=False)
    a.conv("conv3", 384, 3, p=1)
    a.same("relu3")
    a.conv("conv4", 384, 3, p=1, g=2)
    a.same("relu4")
    a.conv("conv5", 256, 3, p=1, g=2)
    a.same("relu5")
    a.pool("pool5", 3, 2)
    _fc_head(a, 4096, 4096, classes, dropout=dropout, prob=prob)
    return a.layers


def _vgg_s(classes: int) -> list[_Spec]:
    a = _Arch(3, 224)
    a.conv("conv1", 96, 7, s=2)
    a.same("relu1")
    a.same("norm1", inplace=False)
    a.pool("pool1", 3, 3)
    a.conv("conv2", 256, 5)
    a.same("relu2")
    a.pool("pool2", 2, 2)
    a.conv("conv3", 512, 3, p=1)
    a.same("relu3")
    a.conv("conv4", 512, 3, p=1)
    a.same("relu4")
    a.conv("conv5", 512, 3, p=1)
    a.same("relu5")
    a.pool("pool5", 3, 3)
    _fc_head(a, 4096, 4096, classes)
    return a.layers


def _tiny_yolo() -> list[_Spec]:
    a = _Arch(3, 416)
    widths = [16, 32, 64, 128, 256, 512, 1024, 1024]
    for i, width in enumerate(widths, start=1):
        a.conv(f"conv{i}", width, 3, p=1, bias=False)
        a.same(f"bn{i}", params=2 * width + 1)
        a.same(f"scale{i}", params=2 * width)
        a.same(f"relu{i}")
        if i <= 5:
            a.pool(f"pool{i}", 2, 2)
        elif i == 6:
            a.h -= 1  # stride-1 pool keeps 13x13 (Darknet pads it)
            a.pool(f"pool{i}", 2, 1)
    a.conv("conv9", 125, 1)
    return a.layers


# GoogLeNet (Szegedy et al. 2015, Table 1): name -> (params, MACs, output channels, size)
_INCEPTIONS = [
    ("3a", 159_000, 128_000_000, 256, 28),
    ("3b", 380_000, 304_000_000, 480, 28),
    ("4a", 364_000, 73_000_000, 512, 14),
    ("4b", 437_000, 88_000_000, 512, 14),
    ("4c", 463_000, 100_000_000, 512, 14),
    ("4d", 580_000, 119_000_000, 528, 14),
    ("4e", 840_000, 170_000_000, 832, 14),
    ("5a", 1_072_000, 54_000_000, 832, 7),
    ("5b", 1_388_000, 71_000_000, 1024, 7),
]


def _googlenet(classes: int) -> list[_Spec]:
    """22 conv units (stem 3, inceptions 2 each, 5b in 3), 2 fc, 127 other layers = 151."""
    a = _Arch(3, 224)
    a.conv("conv1", 64, 7, s=2, p=3)
    a.same("conv1/relu")
    a.pool("pool1", 3, 2)
    a.same("pool1/norm", inplace=False)
    a.conv("conv2/reduce", 64, 1)
    a.same("conv2/reduce/relu")
    a.conv("conv2", 192, 3, p=1)
    a.same("conv2/relu")
    a.same("conv2/norm", inplace=False)
    a.pool("pool2", 3, 2)
    extra_others = {"3a": 13, "3b": 13, "4a": 13, "4b": 13, "4c": 13, "4d": 13}
    for name, params, macs, cout, size in _INCEPTIONS:
        parts = 3 if name == "5b" else 2
        for part in range(parts):
            a.block(f"inception_{name}/part{part + 1}", params // parts, macs // parts, cout, size)
            a.same(f"inception_{name}/part{part + 1}/relu")
        for extra in range(extra_others.get(name, 12) - parts - 2):
            a.same(f"inception_{name}/relu{extra + parts + 1}")
        a.same(f"inception_{name}/pool", inplace=False)
        a.same(f"inception_{name}/output", inplace=False)  # concat
        if name in ("3b", "4e"):
            a.pool(f"pool{name[0]}", 3, 2)
    a.pool("pool5", 7, 1)
    a.same("pool5/drop")
    a.fc("fc1", 1024)
    a.same("fc1/relu")
    a.fc("fc2", classes)
    a.same("prob", inplace=False)
    return a.layers


_ARCHITECTURES = {
    "agenet": lambda: _levi_hassner(8),
    "gendernet": lambda: _levi_hassner(2),
    "facenet": lambda: _alexnet(2),
    "sos": lambda: _alexnet(5, dropout=False),
    "googlenet": lambda: _googlenet(5),
    "tinyyolo": _tiny_yolo,
    "emotionnet": lambda: _vgg_s(7),
    "memnet": lambda: _alexnet(1, prob=False),
    "scenenet": lambda: _alexnet(205),
}


def _derive(name: str) -> NetworkProfile:
    inference, storage_mib, memory_mib, n_conv, n_fc, n_total, architecture = TABLE_6_1[name]
    specs = _ARCHITECTURES[name]()
    weight_total = sum(spec.params for spec in specs) * 4
    storage_scale = storage_mib * MIB / weight_total
    activations = sum(spec.out_elems for spec in specs if not spec.inplace) * 4
    raw_layers = []
    for spec in specs:
        weights = int(round(spec.params * 4 * storage_scale))
        if spec.kind == "other":
            exec_time = 8 * spec.out_elems / MEMORY_BYTES_PER_S
        else:
            exec_time = spec.macs / MACS_PER_S
        raw_layers.append(
            LayerProfile(
                name=spec.name,
                kind=spec.kind,
                load_time=weights / DISK_BYTES_PER_S,
                exec_time=exec_time,
                memory=weights,
                load_memory=int(round(weights * LOAD_PEAK_FACTOR)),
                exec_memory=spec.workspace_elems * 4,
            )
        )
    raw = NetworkProfile(
        name=name,
        layers=tuple(raw_layers),
        init_time=INIT_TIME,
        init_memory=INIT_FOOTPRINT + activations,
        architecture=architecture,
        source=SOURCE,
    )
    factor = memory_mib * MIB / raw.bulk_peak
    notes = {
        "inference": inference,
        "table_6_1": {
            "storage_mib": storage_mib,
            "memory_mib": memory_mib,
            "conv_layers": n_conv,
            "fc_layers": n_fc,
            "total_layers": n_total,
        },
        "memory_scale": round(factor, 4),
        "assumptions": (
            f"per-layer split derived from the {architecture} architecture; loads at "
            f"{DISK_BYTES_PER_S / MIB:g} MiB/s, compute at {MACS_PER_S:g} MAC/s; memory scaled "
            "so the bulk peak equals Table 6.1 (see layerfit.schedule.experiments.thesis)"
        ),
    }
    if name in TABLE_7_2_LOAD_MS:
        notes["table_7_2_load_ms_laptop"] = {
            "single_file": TABLE_7_2_LOAD_MS[name][0],
            "per_layer_files": TABLE_7_2_LOAD_MS[name][1],
        }
    scaled = raw.scaled(memory_factor=factor)
    return NetworkProfile(
        name=name,
        layers=scaled.layers,
        init_time=scaled.init_time,
        init_memory=scaled.init_memory,
        architecture=architecture,
        source=SOURCE,
        notes=notes,
    )


def thesis_profiles() -> ProfileSet:
    """The nine networks of Table 6.1 as derived profiles (see the module docstring)."""
    return ProfileSet(
        (_derive(name) for name in TABLE_6_1), label="the built-in thesis-derived profiles"
    )
