"""Helpers of the server tests: reference outputs, settings, bounded waiting."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import tinymodels
import torch

from layerfit.serve.server import ServeSettings

CHAIN = {"widths": [8, 16, 4]}
SLOW = {"widths": [4, 4, 4], "delays": [0.25, 0.25]}
SLEEPY = {"widths": [4, 4, 4], "delays": [1.0, 1.0]}


def reference(name: str, x: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch output of the model behind repository folder ``name``."""
    module = {
        "chain": lambda: tinymodels.chain(**CHAIN),
        "cnn": tinymodels.tiny_cnn,
        "slow": lambda: tinymodels.chain(**SLOW),
        "sleepy": lambda: tinymodels.chain(**SLEEPY),
    }[name]().eval()
    with torch.no_grad():
        return module(x)


def settings(repository: Path, **overrides: object) -> ServeSettings:
    """Test settings: loopback, a free port, small limits."""
    values: dict = {"repository": repository, "memory_budget": "4MB", "workers": 2, "port": 0,
                    "queue_limit": 8, "max_body": "64kB", "timeout": 20.0, "shutdown_grace": 5.0}
    values.update(overrides)
    return ServeSettings(**values)  # type: ignore[arg-type]


def json_body(x: torch.Tensor, datatype: str = "FP32", **extra: object) -> dict:
    """An inference request carrying ``x`` as the JSON data of the input ``input``."""
    return {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": datatype,
                        "data": x.reshape(-1).tolist()}], **extra}


def child_env() -> dict[str, str]:
    """The environment of a child process that imports these helpers and tinymodels."""
    here = Path(__file__).resolve().parent
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(here.parent),
                                                         os.environ.get("PYTHONPATH", "")])}


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for a condition the test cannot be notified of (bounded, 10 ms steps)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)
