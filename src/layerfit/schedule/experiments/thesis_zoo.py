"""The thesis's nine Caffe networks as zoo architectures, prepared for the real executor.

MASA's experiments (thesis Table 6.1) use AgeNet, GenderNet, FaceNet, SoS, GoogLeNet,
TinyYOLO, EmotionNet, MemNet and SceneNet. Their architectures are in the zoo:
AgeNet/GenderNet are Levi & Hassner's network, FaceNet, SoS, MemNet and SceneNet are
AlexNet-style, EmotionNet is VGG-S, TinyYOLO is Tiny-YOLOv2 (VOC). Each is prepared
into its own folder of a model repository, named as in the workloads, with its own
number of outputs and its own seed (so two AlexNet-style networks have different
weights). Weights are the zoo's seeded initialisation; nothing is downloaded.

``resolution`` shrinks the input where the architecture allows it (AlexNet pools
adaptively, GoogLeNet and Tiny-YOLO are fully convolutional); AgeNet/GenderNet (227)
and VGG-S (224) have fully connected layers sized for their input and keep it.

The cache folder is the user's: an entry ``DIR/NAME`` is reused when it is this
network prepared at this input, and replaced only when it provably is this cache's
entry for the same network (same architecture, outputs and seed, nothing but the
manifest and the weights) at another input. Anything else there — a file, foreign
files, a folder that is not a prepared model, another model — is refused, never
deleted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from layerfit.errors import LayerfitError, ScheduleError

# thesis network -> (zoo architecture, factory arguments, seed)
THESIS_ZOO: dict[str, tuple[str, dict[str, int], int]] = {
    "agenet": ("agenet", {"num_classes": 8}, 1),
    "gendernet": ("gendernet", {"num_classes": 2}, 2),
    "facenet": ("alexnet", {"num_classes": 2}, 3),
    "sos": ("alexnet", {"num_classes": 5}, 4),
    "googlenet": ("googlenet", {"num_classes": 1000}, 5),
    "tinyyolo": ("tiny_yolov2", {"num_classes": 20}, 6),
    "emotionnet": ("vgg_s", {"num_classes": 7}, 7),
    "memnet": ("alexnet", {"num_classes": 1}, 8),
    "scenenet": ("alexnet", {"num_classes": 205}, 9),
}
FIXED_INPUT = {"agenet": 227, "gendernet": 227, "vgg_s": 224}  # fc layers sized for it
MIN_RESOLUTION = {"alexnet": 63, "googlenet": 32, "tiny_yolov2": 32}


def input_shape(network: str, resolution: int) -> tuple[int, int, int, int]:
    """The input a thesis network is prepared for at ``resolution`` (where it can change)."""
    architecture = architecture_of(network)
    size = FIXED_INPUT.get(architecture)
    if size is None:
        size = max(resolution, MIN_RESOLUTION.get(architecture, 32))
        if architecture == "tiny_yolov2":
            size = (size + 31) // 32 * 32
    return (1, 3, size, size)


def architecture_of(network: str) -> str:
    try:
        return THESIS_ZOO[network][0]
    except KeyError:
        raise ScheduleError(
            f"unknown thesis network {network!r}; known: {', '.join(THESIS_ZOO)}"
        ) from None


def prepare_thesis_models(
    directory: str | Path, networks: Iterable[str] | None = None, *, resolution: int = 64
) -> Path:
    """Prepare the thesis networks into ``directory``/NAME (kept when already there at this
    input). Every entry is checked before any is prepared; one that is not this cache's
    raises :class:`ScheduleError` naming it and nothing is touched."""
    from layerfit.store import prepare
    from layerfit.store.model_spec import resolve

    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ScheduleError(f"--zoo-cache {directory} is a file, not a folder")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ScheduleError(
            f"cannot create the --zoo-cache folder {directory}: {exc.strerror or exc}"
        ) from None
    todo = []
    for network in networks if networks is not None else THESIS_ZOO:
        architecture, kwargs, seed = THESIS_ZOO.get(network, (architecture_of(network), {}, 0))
        spec, shape = resolve(architecture, kwargs), input_shape(network, resolution)
        out = directory / network
        if not _cached(out, network, spec.to_dict(), seed, shape):
            todo.append((spec, out, shape, seed))
    for spec, out, shape, seed in todo:
        prepare(spec, out, input_shape=shape, seed=seed, force=True)
    return directory


def _cached(out: Path, network: str, model: dict, seed: int, shape: tuple[int, ...]) -> bool:
    """True if ``out`` holds ``network`` prepared at ``shape`` (reuse it); False if it is
    missing or provably this cache's ``network`` at another input (safe to replace):
    nothing but its manifest and weights, for this model and seed. Raise for anything
    else, which is the user's (a link too: the runtime loads no model from outside DIR)."""
    from layerfit.store import read_manifest
    from layerfit.store.manifest import MANIFEST

    if not os.path.lexists(out):
        return False
    refuse = (
        f"{out} is not this cache's {network} model, so it is left alone; move it away "
        "or choose another --zoo-cache folder"
    )
    if out.is_symlink() or not out.is_dir():
        raise ScheduleError(f"{refuse} (it is {'a link' if out.is_symlink() else 'a file'})")
    try:
        manifest = read_manifest(out)
    except LayerfitError as exc:
        raise ScheduleError(f"{refuse} ({exc})") from None
    if manifest.model != json.loads(json.dumps(model)) or manifest.seed != seed:
        raise ScheduleError(
            f"{refuse} (it holds {manifest.model.get('name')!r} {manifest.model.get('kwargs')} "
            f"seed {manifest.seed})"
        )
    if manifest.input_shape == shape:
        return True
    foreign = sorted(set(os.listdir(out)) - {MANIFEST, manifest.weights_file})
    if foreign:
        raise ScheduleError(f"{refuse} (it also holds {', '.join(foreign)})")
    return False


__all__ = ["THESIS_ZOO", "architecture_of", "input_shape", "prepare_thesis_models"]
