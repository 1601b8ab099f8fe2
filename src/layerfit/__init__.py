"""layerfit: run deep neural networks within a memory budget smaller than the networks.

Public entry points (imported lazily, so ``import layerfit`` stays cheap):

* ``layerfit.capture(model, example_input) -> ModelGraph``
* ``layerfit.prepare(MODEL, DIR)`` — pack a model for streaming
* ``layerfit.load(DIR, budget=..., pipeline=...)`` — an engine you call like the model
* ``layerfit.from_pretrained(FOLDER, budget="40%")`` — a Hugging Face folder (prepared
  once into a cache) or a prepared one, with ``generate``, ``config`` and ``tokenizer``
* ``layerfit.Runtime(REPO, budget, workers, policy)`` — many requests over many prepared
  models within one memory budget (``submit(layerfit.Job(...)) -> Future``)
* ``layerfit.release_thread_team()`` — after tensor work on a thread that lives on (your
  main thread, a pool's), let its OpenMP helpers go: idle, they halve the speed of every
  other thread's kernels
"""

from __future__ import annotations

from typing import Any

from layerfit.errors import LayerfitError

__all__ = [
    "InferenceJob", "Job", "LayerfitError", "Runtime", "capture", "from_pretrained", "load", "prepare",
    "release_thread_team",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "load":
        from layerfit.engine import load

        return load
    if name == "from_pretrained":
        from layerfit.engine.pretrained import from_pretrained

        return from_pretrained
    if name == "prepare":
        from layerfit.store import prepare

        return prepare
    if name in ("Runtime", "InferenceJob", "Job"):
        from layerfit.schedule.runtime import executor as runtime

        return getattr(runtime, name)
    if name == "release_thread_team":
        from layerfit.engine.openmp import release_thread_team

        return release_thread_team
    if name == "capture":
        import layerfit.capture as capture_package

        return capture_package
    raise AttributeError(f"module 'layerfit' has no attribute {name!r}")
