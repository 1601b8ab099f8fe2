"""What identifies the device a profile was measured on, and the model it measured."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import psutil
import torch

from layerfit.store.manifest import Manifest


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_fingerprint() -> dict[str, Any]:
    """What makes delays of this device differ from another's: CPU, cores, memory, torch."""
    return {
        "system": platform.system(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def model_key(manifest: Manifest) -> str:
    """Identity of a prepared model for the per-layer table: factory, input, layer count."""
    m = manifest.model
    kwargs = json.dumps(m.get("kwargs", {}), sort_keys=True)
    shape = "x".join(str(d) for d in manifest.input_shape)
    return f"{m['source']}:{m['name']}({kwargs})@{shape}/{manifest.input_dtype}/{len(manifest.units)}u"
