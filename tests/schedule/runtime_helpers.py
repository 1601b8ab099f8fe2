"""Tiny prepared models for the real-executor tests, and their reference outputs."""

from __future__ import annotations

import threading
from pathlib import Path

import tinymodels
import torch

from layerfit.store import ModelSpec, example_input, prepare

# name -> (factory, kwargs, input shape)
MODELS = {
    "tiny": ("tinymodels:tiny_cnn", {}, (1, 3, 16, 16)),
    "chain": ("tinymodels:chain", {"widths": [32, 64, 64, 16]}, (1, 32)),
    "slow": ("tinymodels:chain", {"widths": [8, 8, 8, 8], "delays": [0.1, 0.1, 0.1]}, (1, 8)),
    "big": ("tinymodels:chain", {"widths": [4, 2048, 4]}, (1, 4)),
    "outside": ("tinymodels:outside_reads", {}, (2, 8)),
    "noweights": ("tinymodels:no_weights", {}, (2, 3, 4, 4)),
    "resident": ("tinymodels:all_resident", {}, (2, 8)),
    "pause": ("tinymodels:pause", {"seconds": 0.2}, (1, 4)),
}

NAMES = ["tiny", "chain", "big"]  # the models of the shared ``repo`` fixture (conftest.py)


def prepare_models(directory: Path, names: list[str] | None = None) -> Path:
    """Prepare ``names`` (default: all of :data:`MODELS`) into ``directory``/NAME."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in names or list(MODELS):
        factory, kwargs, shape = MODELS[name]
        prepare(ModelSpec("factory", factory, kwargs), directory / name, input_shape=shape)
    return directory


def model_input(name: str, seed: int = 0) -> torch.Tensor:
    return example_input(MODELS[name][2], seed=seed)


def reference(name: str, x: torch.Tensor) -> torch.Tensor:
    """Plain ``model(x)`` of the model the store was prepared from."""
    factory, kwargs, _ = MODELS[name]
    model = getattr(tinymodels, factory.split(":")[1])(**kwargs).eval()
    with torch.no_grad():
        return model(x)


def largest_task(repo: Path, names: list[str]) -> int:
    """The most memory one task of these prepared models reserves (the smallest budget
    that runs each of them without the progress rule)."""
    from layerfit.schedule.runtime.profiler import estimate_profile
    from layerfit.store import read_manifest

    return max(estimate_profile(read_manifest(repo / name), name).largest_task_memory for name in names)


def runtime_threads() -> list[str]:
    """Names of the runtime's threads still alive (workers, timer, forward threads)."""
    return [
        t.name
        for t in threading.enumerate()
        if t.name.startswith(("layerfit-worker", "layerfit-timer", "layerfit-forward"))
    ]
