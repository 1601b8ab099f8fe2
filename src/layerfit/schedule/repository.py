"""The model repository of the runtime: one prepared model per sub-folder.

A repository is a folder whose sub-folders are prepared models (``layerfit prepare``);
the sub-folder's name is the model's name. Hidden entries (``.name…``, e.g. the temp
folders ``prepare`` writes before its atomic rename) are not models.

Loading a model reads and validates its manifest, opens its weights file, builds one
engine (a meta-device skeleton, no weights: units are read later by load tasks) and
fixes the scheduler's profile of it. A folder that fails to load is UNAVAILABLE with
the reason; the other models are unaffected.

Names are checked before any path is built from them: a name is one path component of
letters, digits, ``.``, ``_`` and ``-`` starting with a letter or digit, so no request
can reach outside the repository.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from layerfit.backports import StrEnum
from layerfit.engine.engine import Engine
from layerfit.errors import LayerfitError, ModelNotReadyError, UnknownModelError
from layerfit.schedule.profile import NetworkProfile
from layerfit.store.manifest import Manifest

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class ModelState(StrEnum):
    """Whether a model can serve requests (the KServe v2 repository index states)."""

    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"


def check_name(name: object) -> str:
    """``name`` if it is a valid model name; :class:`UnknownModelError` otherwise."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise UnknownModelError(
            f"invalid model name {name!r}: a model name is one folder name of letters, digits, "
            "'.', '_' and '-' starting with a letter or digit"
        )
    return name


class EnginePool:
    """Idle engines of one model; an engine runs one forward pass at a time.

    Every network in flight checks one out (its skeleton holds that network's bound
    units) and returns it when its forward thread has left the model; the pool grows to
    the number of networks of the model in flight at once, and its engines verify each
    unit's checksum once between them. Engines returned after the pool was closed (the
    model was unloaded or reloaded) are closed.
    """

    def __init__(self, factory: Callable[[], Engine], first: Engine | None = None) -> None:
        self._factory = factory
        self._first = first  # new engines share its record of verified units
        self._idle: list[Engine] = [first] if first is not None else []
        self._lock = threading.Lock()
        self.closed = False
        self.created = 1 if first is not None else 0

    def checkout(self) -> Engine:
        with self._lock:
            if self.closed:
                raise ModelNotReadyError("the model was unloaded")
            if self._idle:
                return self._idle.pop()
            self.created += 1
        engine = self._factory()  # outside the lock: builds a skeleton, opens the file
        if self._first is not None:
            engine.share_verification(self._first)
        return engine

    def checkin(self, engine: Engine) -> None:
        with self._lock:
            if not self.closed:
                self._idle.append(engine)
                return
        engine.close()

    def close(self) -> None:
        with self._lock:
            self.closed = True
            idle, self._idle = self._idle, []
        for engine in idle:
            with contextlib.suppress(Exception):
                engine.close()


@dataclass
class ModelInfo:
    """A sub-folder of the repository and what the runtime knows about it."""

    name: str
    directory: Path
    manifest: Manifest | None = None
    loaded: bool = False
    reason: str = "not loaded"
    profile: NetworkProfile | None = field(default=None, repr=False)
    pool: EnginePool | None = field(default=None, repr=False)
    # held for a whole load or unload: they take effect one after the other, in call order
    changing: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def state(self) -> ModelState:
        return ModelState.READY if self.loaded else ModelState.UNAVAILABLE

    def index_entry(self) -> dict[str, str]:
        """This model's entry of the repository index (``name``, ``state``, ``reason``)."""
        return {
            "name": self.name,
            "state": self.state.value,
            "reason": "" if self.loaded else self.reason,
        }

    def require_ready(self) -> NetworkProfile:
        """The profile, or :class:`ModelNotReadyError` saying why the model cannot serve."""
        if not self.loaded or self.profile is None:
            raise ModelNotReadyError(
                f"model {self.name!r} is not ready ({self.reason}); load it first"
            )
        return self.profile


def scan(repository: Path) -> list[str]:
    """Names of the model folders of ``repository``, sorted."""
    if not repository.is_dir():
        raise LayerfitError(
            f"model repository {repository} is not a folder: create it and prepare models "
            "into sub-folders (`layerfit prepare MODEL -o REPO/NAME`)"
        )
    return sorted(
        entry.name
        for entry in repository.iterdir()
        if entry.is_dir() and NAME_PATTERN.fullmatch(entry.name)
    )


def model_directory(repository: Path, name: str) -> Path:
    """The folder of model ``name`` (validated; never outside the repository)."""
    directory = repository / check_name(name)
    if directory.resolve().parent != repository.resolve():
        raise UnknownModelError(f"model {name!r} is not a folder of the repository {repository}")
    return directory


__all__ = ["EnginePool", "ModelInfo", "ModelState", "check_name", "model_directory", "scan"]
