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

:class:`ModelRepository` is the runtime's room for this: which models are loaded, in
which version (a reload replaces a model's engines once the new ones open), load,
unload and taking a model out of service, and what the scheduler knows of each.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from layerfit.backports import StrEnum
from layerfit.engine.engine import Engine
from layerfit.errors import (
    LayerfitError,
    ModelNotReadyError,
    ModelOverBudgetError,
    ScheduleError,
    UnknownModelError,
)
from layerfit.schedule.profile import NetworkProfile, ProfileSet
from layerfit.schedule.runtime.config import AUTO_UNITS
from layerfit.schedule.runtime.profiler import estimate_profile, measure_profile
from layerfit.sizes import format_bytes
from layerfit.store.hf_folder import CONFIG as HF_CONFIG
from layerfit.store.manifest import MANIFEST, Manifest, read_manifest

if TYPE_CHECKING:
    import torch

    from layerfit.schedule.runtime.config import RuntimeConfig
    from layerfit.schedule.runtime.core import RuntimeCore
    from layerfit.schedule.runtime.frontend import JobRun

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class ModelState(StrEnum):
    """Whether a model can serve requests (the KServe v2 repository index states)."""

    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"


def check_name(name: object, error: type[LayerfitError] = UnknownModelError) -> str:
    """``name`` if it is a valid model name (a plain folder name: no path separators, no
    ``..``, no oddities); ``error`` otherwise.

    The one rule for model names: the runtime refuses a bad name as an unknown model,
    the server (``error=BadRequestError``) as a bad request, with the same words.
    """
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise error(
            f"invalid model name {name!r}: a model name is the name of a folder in the "
            "repository (letters, digits, '.', '_', '-', starting with a letter or digit; "
            "at most 128 characters)"
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
    """Names of the model folders of ``repository``, sorted. A prepared model given as
    the repository itself is refused: its models are its sub-folders, so it would serve
    none of them and look ready."""
    if not repository.is_dir():
        raise LayerfitError(
            f"model repository {repository} is not a folder: create it and prepare models "
            "into sub-folders (`layerfit prepare MODEL -o REPO/NAME`)"
        )
    if os.path.lexists(repository / MANIFEST):
        raise LayerfitError(
            f"model repository {repository} is itself a prepared model (it holds {MANIFEST}): a repository is "
            f"the folder above its models; pass its parent folder, or copy it into a repository folder as "
            f"REPO/{repository.resolve().name or 'NAME'}"
        )
    return sorted(
        entry.name
        for entry in repository.iterdir()
        if entry.is_dir() and NAME_PATTERN.fullmatch(entry.name)
    )


def check_prepared(directory: Path) -> None:
    """Refuse a Hugging Face folder as published (``config.json``, no manifest) put in
    the repository, saying how to prepare it: its manifest would only be "missing"."""
    if not os.path.lexists(directory / MANIFEST) and (directory / HF_CONFIG).is_file():
        raise LayerfitError(
            f"{directory} is a Hugging Face model folder, not a prepared model: run `layerfit prepare "
            f"hf:{directory} -o FOLDER` and put FOLDER in the repository in its place"
        )


def model_directory(repository: Path, name: str) -> Path:
    """The folder of model ``name`` (validated; never outside the repository)."""
    directory = repository / check_name(name)
    if directory.resolve().parent != repository.resolve():
        raise UnknownModelError(f"model {name!r} is not a folder of the repository {repository}")
    return directory


class ModelRepository:
    """The runtime's models: which are loaded, in which version, and their engines.

    ``models`` maps every model folder seen to its :class:`ModelInfo` (READY or
    UNAVAILABLE with the reason). Loading a model fixes its profile, in the runtime's
    ``units``, and gives it an :class:`EnginePool`; reloading replaces the pool only once
    the new version has loaded. A pool that a model no longer serves with (unloaded,
    replaced, taken out of service) is *retired*: closed as soon as no unresolved job
    holds it, so the jobs already accepted finish on the version they were accepted with.

    Everything it changes is guarded by the runtime's lock (``core``); a load or unload
    of one model also holds that model's ``changing`` lock, so they take effect in the
    order called. ``profiles`` are precomputed profiles by model name, used instead of
    measuring or estimating them.
    """

    def __init__(
        self,
        core: RuntimeCore,
        config: RuntimeConfig,
        profiles: Mapping[str, NetworkProfile] | None = None,
    ) -> None:
        self.path = Path(config.repository)
        self._core = core
        self._profiles = dict(profiles or {})
        self._estimates = config.estimates
        self._units = config.units
        self._direct_io = config.direct_io
        self._verify = config.verify  # when an engine checks a unit's SHA-256: each read from disk, its first, never
        self._dequantize = config.dequantize  # a GGUF model's weights as transformers' values, not packed
        self._retiring: list[EnginePool] = []  # unloaded or replaced, closed when no job holds them
        self.models: dict[str, ModelInfo] = {
            name: ModelInfo(name, self.path / name) for name in scan(self.path)
        }

    # --- the index ---------------------------------------------------------------------

    def index(self) -> list[dict[str, str]]:
        """Every model folder of the repository: ``name``, ``state`` (READY/UNAVAILABLE), ``reason``.

        Folders added since the runtime started are listed too (UNAVAILABLE until loaded).
        """
        with contextlib.suppress(LayerfitError):
            names = scan(self.path)
            with self._core.lock:
                for name in names:
                    if name not in self.models:
                        self.models[name] = ModelInfo(name, self.path / name)
        with self._core.lock:
            return [self.models[name].index_entry() for name in sorted(self.models)]

    # --- loading and unloading -----------------------------------------------------------

    def load_model(self, name: str, *, within_budget: bool = False) -> ModelInfo:
        """(Re)load model ``name``; see :meth:`layerfit.schedule.runtime.executor.Runtime.load_model`."""
        directory = model_directory(self.path, name)
        with self._core.lock:
            self._core.refuse_if_closing("it loads no models")
            info = self.models.get(name)
            if info is None:
                if not directory.is_dir():
                    raise UnknownModelError(
                        f"no model {name!r} in {self.path}: known models are "
                        f"{', '.join(sorted(self.models)) or 'none'}"
                    )
                info = self.models[name] = ModelInfo(name, directory)
        with info.changing:
            return self._load_locked(info, directory, within_budget)

    def _load_locked(self, info: ModelInfo, directory: Path, within_budget: bool) -> ModelInfo:
        """:meth:`load_model` with the model's ``changing`` lock held.

        A model that is READY keeps serving while it is reloaded, and if the reload fails
        (as Triton does): the new version replaces it only once it has loaded.
        """
        name = info.name
        with self._core.lock:
            serving = info.loaded and info.pool is not None
            if not serving:
                info.loaded, info.reason = False, "loading"
        engine: Engine | None = None
        try:
            check_prepared(directory)
            layered = self._profile(name, directory, read_manifest(directory))
            units = self._engine_units(layered)
            engine = self._new_engine(directory, units)
            # one task per unit of the engine: the profile by layers, grouped into its blocks
            profile = layered.grouped([len(b.segments) for b in engine.blocks]) if engine.blocks else layered
            if within_budget:
                self._check_fits(name, profile)
            with self._core.lock:
                self._core.refuse_if_closing("it loads no models")
                old_pool = info.pool
                info.manifest = engine.manifest
                info.profile = profile
                info.pool = EnginePool(partial(self._new_engine, directory, units), engine)
                info.loaded, info.reason = True, ""
            if old_pool is not None:
                self._retire_pool(old_pool)
        except Exception as exc:
            if engine is not None:
                engine.close()
            error = exc if isinstance(exc, LayerfitError) else LayerfitError(
                f"cannot load model {name!r} from {directory}: {type(exc).__name__}: {exc}"
            )
            with self._core.lock:
                closing = self._core.closing
                still = serving and info.loaded and not closing
                if not still:
                    info.reason = "the runtime is shut down" if closing else str(error)
            if still:  # as Triton: the version loaded before keeps serving
                raise LayerfitError(f"{error} (the version loaded before keeps serving)") from exc
            if error is exc:
                raise
            raise error from exc
        return info

    def mark_unavailable(self, name: str, reason: str) -> None:
        """Take model ``name`` out of service until it is loaded again; see
        :meth:`layerfit.schedule.runtime.executor.Runtime.mark_unavailable`."""
        with self._core.lock:
            self.take_down_locked(name, reason)
            if self._retiring:
                self.close_retired_locked()

    def take_down_locked(self, name: str, reason: str) -> None:
        """Make a READY model UNAVAILABLE with ``reason`` and retire its engines (lock held)."""
        info = self.models.get(name)
        if info is None or not info.loaded:
            return
        pool, info.pool = info.pool, None
        info.loaded, info.reason = False, reason
        if pool is not None:
            if self._core.cache is not None:
                self._core.cache.drop_model(pool)
            self._retiring.append(pool)

    def unload_model(self, name: str) -> None:
        """Stop serving model ``name``; see :meth:`layerfit.schedule.runtime.executor.Runtime.unload_model`."""
        check_name(name)
        with self._core.lock:
            info = self.models.get(name)
            if info is None:
                raise UnknownModelError(f"no model {name!r} in {self.path}")
        with info.changing:  # after a load in progress, not before it ends
            with self._core.lock:
                pool, info.pool = info.pool, None
                info.loaded, info.reason = False, "unloaded"
            if pool is not None:
                self._retire_pool(pool)

    def _retire_pool(self, pool: EnginePool) -> None:
        """Close ``pool`` now, or once no unresolved job was accepted with it."""
        with self._core.lock:
            if self._core.cache is not None:
                self._core.cache.drop_model(pool)
            if any(pool in run.pools.values() for run in self._core.jobs.values()):
                self._retiring.append(pool)
                return
        pool.close()

    def close_retired_locked(self) -> None:
        """Close the retired pools that no unresolved job holds any more (lock held)."""
        if not self._retiring:
            return
        held = {id(p) for run in self._core.jobs.values() for p in run.pools.values()}
        done = [p for p in self._retiring if id(p) not in held]
        self._retiring = [p for p in self._retiring if id(p) in held]
        for pool in done:
            pool.close()

    def close_all_locked(self) -> None:
        """Close every model's engines (the runtime is shut down and no job is left)."""
        pools = [info.pool for info in self.models.values() if info.pool is not None]
        pools += self._retiring
        self._retiring = []
        if self._core.cache is not None:
            self._core.cache.clear()
        for info in self.models.values():
            info.pool = None
            if info.loaded:
                info.loaded, info.reason = False, "the runtime is shut down"
        for pool in pools:  # engines still checked out close as their forward threads return them
            pool.close()

    def current_pool(self, run: JobRun, network: str) -> EnginePool | None:
        """The engine pool ``run`` holds for ``network`` while that is still its model's
        current one (what the weight cache keys a unit by), else ``None`` (lock held)."""
        pool = run.pools.get(network)
        if pool is None or self.models[run.models[network]].pool is not pool:
            return None
        return pool

    # --- engines and profiles ------------------------------------------------------------

    def _engine_units(self, layered: NetworkProfile) -> str | list[int]:
        """The engines' granularity for a model: the runtime's ``units``, or for
        ``merge:auto`` the partition points its profile by layers allows."""
        if self._units != AUTO_UNITS:
            return self._units
        return list(itertools.accumulate(layered.blocks_within_min_budget()))[:-1]

    def _new_engine(self, directory: Path, units: str | list[int]) -> Engine:
        return Engine(directory, pipeline="external", direct_io=self._direct_io, units=units, verify=self._verify,
                      dequantize=self._dequantize)

    def _profile(self, name: str, directory: Path, manifest: Manifest) -> NetworkProfile:
        """The model's profile, one layer per stored layer."""
        profile = self._profiles.get(name)
        if profile is None:
            if self._estimates == "profile":
                profile = measure_profile(directory, name)
            else:
                profile = estimate_profile(manifest, name)
        if profile.name != name:
            profile = NetworkProfile(
                name=name,
                layers=profile.layers,
                init_time=profile.init_time,
                init_memory=profile.init_memory,
                unload_time=profile.unload_time,
                architecture=profile.architecture,
                source=profile.source,
                notes=dict(profile.notes),
            )
        if len(profile.layers) != max(1, len(manifest.units)):  # no unit: the whole model
            raise ScheduleError(
                f"the profile of {name!r} has {len(profile.layers)} layers but the prepared "
                f"model has {len(manifest.units)} units: profile this prepared model"
            )
        return profile

    def required_budget(self, name: str) -> int:
        """The least memory budget under which jobs of model ``name`` are not rejected:
        its largest task as the scheduler is told it (profile × ``estimate_factor``)."""
        profile, _ = self.ready(name)
        return int(round(profile.largest_task_memory * self._core.dispatcher.estimate_factor))

    def budget_needed(self, profile: NetworkProfile) -> int:
        """The least budget ``profile``'s jobs run within (its init beside its largest unit)
        as the scheduler is told it (× ``estimate_factor``)."""
        return int(round(profile.min_budget * self._core.dispatcher.estimate_factor))

    def _check_fits(self, name: str, profile: NetworkProfile) -> None:
        """Raise :class:`ModelOverBudgetError` if ``profile`` cannot run within the budget.

        That is its init (resident weights, activations) beside its largest unit (load
        peak, or weights and execute scratch), not only its largest task: with less, its
        jobs would pass the job check and then run only through the progress rule, over
        the budget."""
        needed, budget = self.budget_needed(profile), self._core.ledger.budget
        if needed > budget:
            raise ModelOverBudgetError(
                f"model {name!r} needs a memory budget of at least {format_bytes(needed)} "
                f"({needed} bytes) to run within it (one streamed unit at a time beside its "
                f"resident weights and activations), more than the runtime's budget of "
                f"{format_bytes(budget)}",
                min_budget=needed,
            )

    def profile_set(self, *, ready_only: bool = True) -> ProfileSet:
        """The scheduler's profiles of the loaded models (for workloads and the simulator);
        with ``ready_only=False`` also of models unloaded since (e.g. after shutdown)."""
        with self._core.lock:
            profiles = [
                i.profile
                for i in self.models.values()
                if i.profile is not None and (i.loaded or not ready_only)
            ]
        return ProfileSet(profiles, label=f"models of {self.path}")

    def example_input(self, name: str, seed: int | None = None) -> torch.Tensor | dict[str, torch.Tensor]:
        """A deterministic input of the shape and dtype model ``name`` was prepared for: a
        tensor, or for a model prepared from keyword arguments a dict of them."""
        from layerfit.store import example_call

        args, keywords = example_call(self.ready(name)[1], seed)
        return keywords if keywords else args[0]

    def ready(self, name: str) -> tuple[NetworkProfile, Manifest]:
        """Model ``name``'s profile and manifest; raises if it is unknown or not READY."""
        check_name(name)
        with self._core.lock:
            info = self.models.get(name)
            if info is None:
                raise UnknownModelError(
                    f"no model {name!r} in {self.path}: known models are "
                    f"{', '.join(sorted(self.models)) or 'none'}"
                )
            profile = info.require_ready()
            assert info.manifest is not None
            return profile, info.manifest


__all__ = [
    "EnginePool",
    "ModelInfo",
    "ModelRepository",
    "ModelState",
    "check_name",
    "model_directory",
    "scan",
]
