"""Fixtures of the server tests: a small repository and real servers on loopback.

Every server here is the real one — ``layerfit.Runtime`` under FastAPI on uvicorn —
listening on a free loopback port; tests talk to it over HTTP only.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from serve_helpers import CHAIN, SLEEPY, SLOW, settings

from layerfit.serve.server import ServerThread
from layerfit.store import ModelSpec, prepare


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """chain (FP32 [1, 8]), cnn (FP32 [1, 3, 8, 8]), slow and sleepy (0.5 s and 2 s per
    inference, FP32 [1, 4]), and corrupt (a folder whose manifest is not JSON)."""
    root = tmp_path_factory.mktemp("repository")
    prepare(ModelSpec("factory", "tinymodels:chain", CHAIN), root / "chain", input_shape=(1, 8))
    prepare(ModelSpec("factory", "tinymodels:tiny_cnn", {}), root / "cnn", input_shape=(1, 3, 8, 8))
    prepare(ModelSpec("factory", "tinymodels:chain", SLOW), root / "slow", input_shape=(1, 4))
    prepare(ModelSpec("factory", "tinymodels:chain", SLEEPY), root / "sleepy", input_shape=(1, 4))
    shutil.copytree(root / "chain", root / "corrupt")
    (root / "corrupt" / "manifest.json").write_text('{"format": "layerfit-prepared", "vers')
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerThread]:
    """One shared server; ``torch.load`` is booby-trapped: weights are never unpickled."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the server must never call torch.load")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "load", refuse)
        with ServerThread(settings(repository)) as running:
            yield running


@pytest.fixture()
def make_server(repository: Path) -> Iterator[Callable[..., ServerThread]]:
    """Start servers with other settings; all are stopped at the end of the test."""
    started: list[ServerThread] = []

    def make(**overrides: object) -> ServerThread:
        overrides.setdefault("repository", repository)
        running = ServerThread(settings(**overrides)).start()
        started.append(running)
        return running

    yield make
    for running in started:
        running.stop()
