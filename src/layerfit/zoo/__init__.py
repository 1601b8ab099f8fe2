"""The model zoo: plain ``torch.nn`` architectures of the networks the papers evaluate.

Every entry names a *pure* factory (it builds the architecture with PyTorch's default
initialisation, nothing data-dependent, and works under ``torch.device("meta")``), the
default input shape at the resolution the papers use, and the published parameter count
with its source. :func:`build` adds layerfit's seeded, calibrated initialisation
(:mod:`layerfit.zoo.init`). No weights are ever downloaded.

All tensor state of every model is registered parameters or buffers, and ``forward``
only depends on input shapes, never on values: the prepared-model store rebuilds a
skeleton on the meta device and binds every tensor from disk.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from layerfit.errors import UnknownModelError
from layerfit.zoo import (
    alexnet,
    blazeface,
    deeplab,
    densenet,
    efficientnet,
    fcn,
    googlenet,
    inception,
    levi_hassner,
    mobilenet,
    posenet,
    resnet,
    vgg,
    vgg_s,
    vit,
    yolo,
)
from layerfit.zoo.init import initialise

__all__ = ["ZooEntry", "build", "get", "initialise", "names", "param_count", "table"]


@dataclass(frozen=True)
class ZooEntry:
    """One model of the zoo.

    ``input_shape`` is the default input (batch 1) at the papers' resolution;
    ``small_input_shape`` the smallest cheap input the architecture accepts (tests,
    calibration); ``published_params`` the published parameter count in millions (None
    where no source states one) and ``source`` where that figure and the resolution come
    from.
    """

    name: str
    factory: Callable[..., nn.Module]
    input_shape: tuple[int, ...]
    published_params: float | None
    description: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    small_input_shape: tuple[int, ...] = (1, 3, 64, 64)
    source: str = ""
    calibration_input_shape: tuple[int, ...] | None = None

    def calibration_shape(self, batch_norm: bool = True) -> tuple[int, ...]:
        """Input shape of the initialiser's calibration pass.

        ``calibration_input_shape`` if set; otherwise, with BatchNorm, a batch of 8 at
        128×128 — enough samples per channel on stride-32 maps (see
        :mod:`layerfit.zoo.init`) — and without BatchNorm one ``small_input_shape``
        input, which is all the per-layer rescaling needs.
        """
        if self.calibration_input_shape is not None:
            return self.calibration_input_shape
        if not batch_norm:
            return (1, *self.small_input_shape[1:])
        return (8, 3, 128, 128)


def _img(size: int) -> tuple[int, int, int, int]:
    return (1, 3, size, size)


_ENTRIES: list[ZooEntry] = [
    ZooEntry(
        "resnet50", resnet.resnet50, _img(224), 25.6,
        "ResNet-50 (He et al. 2016), ImageNet classifier",
        calibration_input_shape=(8, 3, 64, 64),
        source="25.6 M: He et al. 2016 / torchvision (25,557,032); 224: ImageNet, Minakova et al. multi-CNN app",
    ),
    ZooEntry(
        "resnet101", resnet.resnet101, _img(224), 44.5,
        "ResNet-101 (He et al. 2016), ImageNet classifier",
        calibration_input_shape=(8, 3, 64, 64),
        source="44.5 M: torchvision (44,549,160) = SwapNet's 170 MB ResNet-101; 224: ImageNet",
    ),
    ZooEntry(
        "resnet152", resnet.resnet152, _img(608), 60.2,
        "ResNet-152 (He et al. 2016), ImageNet classifier",
        calibration_input_shape=(8, 3, 64, 64),
        source="60.2 M: torchvision (60,192,808); 608x608: Demand Layering Table I default resolution",
    ),
    ZooEntry(
        "vgg16", vgg.vgg16, _img(224), 138.4,
        "VGG-16 (Simonyan & Zisserman 2015), configuration D",
        small_input_shape=_img(32),
        source="138.4 M: Simonyan & Zisserman Table 2 (138 M) / torchvision (138,357,544); 224: paper",
    ),
    ZooEntry(
        "vgg19", vgg.vgg19, _img(224), 143.7,
        "VGG-19 (Simonyan & Zisserman 2015), configuration E",
        small_input_shape=_img(32),
        source="143.7 M: torchvision (143,667,240) = SwapNet's 548 MB VGG 19; 224: paper",
    ),
    ZooEntry(
        "densenet121", densenet.densenet121, _img(224), 8.0,
        "DenseNet-121 (Huang et al. 2017), growth 32",
        source="8.0 M: torchvision (7,978,856); 224: Minakova et al. (all CNNs 224x224)",
    ),
    ZooEntry(
        "densenet201", densenet.densenet201, _img(608), 20.0,
        "DenseNet-201 (Huang et al. 2017), growth 32",
        source="20.0 M: torchvision (20,013,928); 608x608: Demand Layering Table I default resolution",
    ),
    ZooEntry(
        "mobilenet_v1", mobilenet.mobilenet_v1, _img(224), 4.2,
        "MobileNet v1 (Howard et al. 2017), width 1.0",
        kwargs={"width_mult": 1.0},
        source="4.2 M: Howard et al. Table 8 (1.0 MobileNet-224); 224: TFLite mobilenet_v1_1.0_224",
    ),
    ZooEntry(
        "mobilenet_v1_025", mobilenet.mobilenet_v1, _img(224), 0.47,
        "MobileNet v1 (Howard et al. 2017), width 0.25",
        kwargs={"width_mult": 0.25},
        source="0.47 M: Howard et al. Table 6 (0.25 MobileNet-224); 224: Minakova et al.",
    ),
    ZooEntry(
        "mobilenet_v2", mobilenet.mobilenet_v2, _img(224), 3.5,
        "MobileNet v2 (Sandler et al. 2018), width 1.0",
        kwargs={"width_mult": 1.0},
        source="3.5 M: torchvision (3,504,872; paper Table 4: 3.4 M); 224: Minakova et al., TFLite",
    ),
    ZooEntry(
        "inception_v3", inception.inception_v3, _img(299), 23.8,
        "Inception v3 (Szegedy et al. 2016), inference graph without the auxiliary head",
        small_input_shape=_img(96),
        calibration_input_shape=(8, 3, 171, 171),
        source="23.8 M: torchvision 27,161,264 minus the 3.3 M aux head (Keras: 23,851,784); 299: paper/TFLite",
    ),
    ZooEntry(
        "efficientnet_b0", efficientnet.efficientnet_b0, _img(224), 5.3,
        "EfficientNet-B0 (Tan & Le 2019)",
        source="5.3 M: Tan & Le Table 2 / torchvision (5,288,548); 224: paper, Minakova et al.",
    ),
    ZooEntry(
        "yolov3", yolo.yolov3, _img(608), 61.9,
        "YOLOv3 (Redmon & Farhadi 2018), Darknet-53, COCO (80 classes, 255 channels per scale)",
        source="61.9 M: Darknet yolov3.cfg (61,949,149) = Demand Layering's 236.5 MB; 608: Demand Layering",
    ),
    ZooEntry(
        "yolov4", yolo.yolov4, _img(608), 64.4,
        "YOLOv4 (Bochkovskiy et al. 2020), CSPDarknet-53 + SPP + PAN, COCO, 162 Darknet layers",
        source="64.4 M: Darknet yolov4.cfg (64,363,101) = Demand Layering's 245.8 MB; 608: Demand Layering",
    ),
    ZooEntry(
        "tiny_yolov3", yolo.tiny_yolov3, _img(416), 8.86,
        "Tiny-YOLOv3 (yolov3-tiny.cfg), COCO, two detection scales",
        source="8.86 M: Darknet yolov3-tiny.cfg (8,852,366 per Ultralytics); 416: cfg default",
    ),
    ZooEntry(
        "tiny_yolov2", yolo.tiny_yolov2, _img(416), None,
        "Tiny-YOLOv2 (yolov2-tiny-voc.cfg), PASCAL VOC: MASA/EdgeCaffe's TinyYOLO (9 conv layers)",
        source="no published count; MASA Table 6.1 lists 62 MB of storage (15.9 M float32); 416: cfg",
    ),
    ZooEntry(
        "deeplab_v3", deeplab.deeplab_v3, _img(257), 2.11,
        "DeepLab v3 with MobileNet v2 backbone, output stride 16, mobile ASPP, 21 classes",
        small_input_shape=_img(65),
        source="2.11 M: Sandler et al. 2018 Table 7 (MNet V2*, OS 16, no atrous ASPP); 257: TFLite model",
    ),
    ZooEntry(
        "fcn8s", fcn.fcn8s, _img(500), 134.0,
        "FCN-8s (Long et al. 2015), VGG-16 backbone, PASCAL VOC (21 classes)",
        small_input_shape=_img(32),
        source="134 M: Long et al. Table 1 (FCN-VGG16); 500: PASCAL VOC images (at most 500x500)",
    ),
    ZooEntry(
        "fcn_resnet101", fcn.fcn_resnet101, _img(520), 54.3,
        "FCN with dilated ResNet-101 and auxiliary head (SwapNet's 207 MB FCN), 21 classes",
        calibration_input_shape=(2, 3, 64, 64),  # output stride 8: 8×8 maps, 128 samples
        source="54.3 M: torchvision fcn_resnet101 (54,314,346) = SwapNet's 207 MB FCN; 520: torchvision",
    ),
    ZooEntry(
        "blazeface", blazeface.blazeface, _img(128), None,
        "BlazeFace (Bazarevsky et al. 2019), MediaPipe front-camera face detector",
        small_input_shape=_img(128),
        source="no published count; architecture of MediaPipe face_detection_front.tflite; 128: paper",
    ),
    ZooEntry(
        "posenet", posenet.posenet, _img(224), None,
        "PoseNet (Kendall et al. 2015), GoogLeNet-based 6-DoF camera pose regressor",
        source="no published count; head of caffe-posenet (cls3_fc1_pose 2048); 224: paper",
    ),
    ZooEntry(
        "agenet", levi_hassner.agenet, (1, 3, 227, 227), None,
        "AgeNet (Levi & Hassner 2015), 8 age groups",
        small_input_shape=(1, 3, 227, 227),
        source="no published count; MASA Table 6.1: 44 MB (11.4 M float32); 227: paper",
    ),
    ZooEntry(
        "gendernet", levi_hassner.gendernet, (1, 3, 227, 227), None,
        "GenderNet (Levi & Hassner 2015), 2 genders",
        small_input_shape=(1, 3, 227, 227),
        source="no published count; MASA Table 6.1: 44 MB (11.4 M float32); 227: paper",
    ),
    ZooEntry(
        "alexnet", alexnet.alexnet, _img(224), 61.1,
        "AlexNet (Krizhevsky et al. 2012), single-tower variant",
        source="61.1 M: torchvision (61,100,840); 224: torchvision",
    ),
    ZooEntry(
        "vgg_s", vgg_s.vgg_s, _img(224), None,
        "VGG-S / CNN-S (Chatfield et al. 2014); MASA's EmotionNet architecture",
        small_input_shape=_img(224),
        source="no published count; 7-class EmotionNet = 378 MB in MASA Table 6.1; 224: paper",
    ),
    ZooEntry(
        "googlenet", googlenet.googlenet, _img(224), 6.96,
        "GoogLeNet / Inception v1 (Szegedy et al. 2015), Caffe version, no auxiliary heads",
        source=(
            "6.96 M: Szegedy et al. 2015 Table 1, params column summed (6,798 K with K = 1024, "
            "often quoted as 6.8 M; weights only); 224: paper"
        ),
    ),
    ZooEntry(
        "vit_s16", vit.vit_s16, _img(224), 22.1,
        "ViT-S/16 (Touvron et al. 2021, DeiT-S), torchvision's ViT layout, nn.MultiheadAttention",
        source="22.1 M: Touvron et al. 2021 Table 1 (DeiT-S 22 M) / timm (22,050,664); 224: paper",
    ),
    ZooEntry(
        "vit_b16", vit.vit_b16, _img(224), 86.6,
        "ViT-B/16 (Dosovitskiy et al. 2021), torchvision's ViT layout, nn.MultiheadAttention",
        source="86.6 M: torchvision vit_b_16 (86,567,656; paper Table 1: 86 M); 224: paper",
    ),
]

_REGISTRY: dict[str, ZooEntry] = {e.name: e for e in _ENTRIES}


def names() -> list[str]:
    """Names of every zoo model, in registry order."""
    return list(_REGISTRY)


def get(name: str) -> ZooEntry:
    """The entry called ``name``; :class:`UnknownModelError` (with close matches) otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        pass
    key = str(name).strip().lower().replace("-", "_")
    if key in _REGISTRY:
        return _REGISTRY[key]
    close = difflib.get_close_matches(key, list(_REGISTRY), n=5, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise UnknownModelError(
        f"unknown model {name!r}.{hint} (`layerfit zoo` lists the {len(_REGISTRY)} built-in models)"
    )


def build(name: str, *, seed: int = 0, **kwargs: Any) -> nn.Module:
    """Construct zoo model ``name`` and initialise it from ``seed``; returns it in eval mode.

    ``kwargs`` override the entry's default factory arguments. The structure is built on
    the meta device and then materialised, so no time is spent on PyTorch's default
    initialisation that :func:`initialise` would overwrite anyway.
    """
    entry = get(name)
    args = {**entry.kwargs, **kwargs}
    with torch.device("meta"):
        model = entry.factory(**args)
    model = model.to_empty(device="cpu")
    for module in model.modules():  # buffers are not drawn: give them their defined values
        reset = getattr(module, "reset_running_stats", None)
        if callable(reset):
            reset()
    _check_no_other_buffers(model, name)
    has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    initialise(model, seed, entry.calibration_shape(has_bn))
    return model.eval()


def _check_no_other_buffers(model: nn.Module, name: str) -> None:
    for module_name, module in model.named_modules():
        for buf_name, buf in module.named_buffers(recurse=False):
            if buf is not None and not hasattr(module, "reset_running_stats"):
                raise RuntimeError(
                    f"zoo model {name}: buffer {module_name}.{buf_name} has no defined value "
                    "after materialisation; register it in a norm layer or initialise it"
                )


@functools.cache
def _meta_sizes(name: str) -> tuple[int, int]:
    """(parameters, parameter bytes) of ``name`` at its default arguments, built on meta."""
    entry = get(name)
    with torch.device("meta"):
        model = entry.factory(**entry.kwargs)
    params = list(model.parameters())
    return sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params)


def param_count(name: str) -> int:
    """Number of parameters of ``name`` at its default arguments (computed on meta)."""
    return _meta_sizes(get(name).name)[0]


def table() -> list[dict[str, Any]]:
    """One row per model: name, params, param_mb (10⁶ bytes, float32), input_shape, …"""
    rows = []
    for entry in _ENTRIES:
        params, nbytes = _meta_sizes(entry.name)
        rows.append({
            "name": entry.name,
            "params": params,
            "param_mb": round(nbytes / 1e6, 2),
            "input_shape": list(entry.input_shape),
            "published_params_m": entry.published_params,
            "description": entry.description,
        })
    return rows
