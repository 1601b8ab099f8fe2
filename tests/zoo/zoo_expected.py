"""What the zoo tests expect of each model: exact parameter counts and small-input outputs."""

from __future__ import annotations

# Exact parameter counts at the default arguments (a change here is an architecture change).
PARAMS: dict[str, int] = {
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
    "vgg16": 138_357_544,
    "vgg19": 143_667_240,
    "densenet121": 7_978_856,
    "densenet201": 20_013_928,
    "mobilenet_v1": 4_231_976,
    "mobilenet_v1_025": 470_072,
    "mobilenet_v2": 3_504_872,
    "inception_v3": 23_834_568,
    "efficientnet_b0": 5_288_548,
    "yolov3": 61_949_149,
    "yolov4": 64_363_101,
    "tiny_yolov3": 8_852_366,
    "tiny_yolov2": 15_861_773,
    "deeplab_v3": 2_113_557,
    "fcn8s": 134_489_759,
    "fcn_resnet101": 54_314_346,
    "blazeface": 101_390,
    "posenet": 8_087_095,
    "agenet": 11_415_048,
    "gendernet": 11_411_970,
    "alexnet": 61_100_840,
    "vgg_s": 102_908_520,
    "googlenet": 6_998_552,
    "vit_s16": 22_050_664,
    "vit_b16": 86_567_656,
}

# Output shape on the entry's ``small_input_shape``.
SMALL_OUTPUT: dict[str, tuple[int, ...]] = {
    **{n: (1, 1000) for n in (
        "resnet50", "resnet101", "resnet152", "vgg16", "vgg19", "densenet121", "densenet201",
        "mobilenet_v1", "mobilenet_v1_025", "mobilenet_v2", "inception_v3", "efficientnet_b0",
        "alexnet", "vgg_s", "googlenet", "vit_s16", "vit_b16",
    )},
    "yolov3": (1, 3 * (2 * 2 + 4 * 4 + 8 * 8), 85),  # 64×64: strides 32, 16, 8
    "yolov4": (1, 3 * (8 * 8 + 4 * 4 + 2 * 2), 85),  # strides 8, 16, 32
    "tiny_yolov3": (1, 3 * (2 * 2 + 4 * 4), 85),
    "tiny_yolov2": (1, 5 * 2 * 2, 25),
    "deeplab_v3": (1, 21, 65, 65),
    "fcn8s": (1, 21, 32, 32),
    "fcn_resnet101": (1, 42, 64, 64),
    "blazeface": (1, 896, 17),
    "posenet": (1, 7),
    "agenet": (1, 8),
    "gendernet": (1, 2),
}

# Output shape on the entry's default ``input_shape`` (checked on the meta device).
DEFAULT_OUTPUT: dict[str, tuple[int, ...]] = {
    **{n: SMALL_OUTPUT[n] for n in SMALL_OUTPUT if SMALL_OUTPUT[n] == (1, 1000)},
    "yolov3": (1, 3 * (19 * 19 + 38 * 38 + 76 * 76), 85),  # 608×608: 22743 boxes
    "yolov4": (1, 3 * (76 * 76 + 38 * 38 + 19 * 19), 85),
    "tiny_yolov3": (1, 3 * (13 * 13 + 26 * 26), 85),
    "tiny_yolov2": (1, 5 * 13 * 13, 25),
    "deeplab_v3": (1, 21, 257, 257),
    "fcn8s": (1, 21, 500, 500),
    "fcn_resnet101": (1, 42, 520, 520),
    "blazeface": (1, 896, 17),
    "posenet": (1, 7),
    "agenet": (1, 8),
    "gendernet": (1, 2),
}
