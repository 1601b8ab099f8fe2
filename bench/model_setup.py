"""Models a bench measures: zoo models prepared once into the bench's cache, and one training
step for the benches that train a small model first.

Imports nothing beyond the standard library at load, so a child running in another virtual
environment (bench/vs_mmap.py's llama.cpp) uses it too. Nothing here asserts a timing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def prepared_zoo_model(name: str, resolution: int, cache: Path) -> Path:
    """A zoo model prepared at ``resolution`` x ``resolution`` under ``cache`` (reused)."""
    from layerfit import zoo
    from layerfit.errors import LayerfitError
    from layerfit.store import prepare, read_manifest

    entry = zoo.get(name)
    shape = (*entry.input_shape[:-2], resolution, resolution)
    out = cache / f"{name}-{resolution}"
    try:
        manifest = read_manifest(out)
        # prepared before the captured pass was measured: its estimates would be the old ones
        if manifest.input_shape == shape and manifest.graph.pass_peak_bytes:
            return out
    except LayerfitError:
        pass  # missing or stale: prepare it again
    prepare(name, out, input_shape=shape, force=True)
    return out


def train_step(model: Any, optimizer: Any, schedule: Any, ids: Any, labels: Any, bf16: bool) -> Any:
    """One optimizer step of a causal language model on ``ids`` (its loss on ``labels``),
    under bf16 autocast on the CPU when ``bf16``, gradients clipped to norm 1; the loss."""
    import torch

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(ids, labels=labels).loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    schedule.step()
    return loss



def cached_training(
    cache: Path, description: list[Any], data: bytes, train: Callable[[str, Path], dict[str, Any]]
) -> tuple[Path, dict[str, Any]]:
    """A model trained once and cached: its folder under ``cache``, keyed by a hash of
    ``description`` (its config and training settings) and of the training ``data``, and
    its training record. ``train(data_digest, folder)`` trains and saves it there when the
    folder holds none yet, and returns the record."""
    digest = hashlib.sha256(data).hexdigest()
    key = hashlib.sha256(json.dumps([*description, digest], sort_keys=True).encode()).hexdigest()[:12]
    out = cache / f"trained-{key}"
    record_file = out / "training.json"
    if record_file.is_file() and (out / "config.json").is_file():
        return out, json.loads(record_file.read_text())
    return out, train(digest, out)
