"""``layerfit.from_pretrained(PATH, budget="40%")``: a Hugging Face folder in one line.

PATH is a prepared folder, a GGUF file, or a Hugging Face folder as published, which is prepared
once into a cache folder (named in the result's ``directory``, and prepared again only
when the folder's files change); callers asking for it at once (processes or threads)
prepare it once: the others wait for the first and use its folder. The result is a :class:`PretrainedModel`: called like
the model, with ``generate``, the model's ``config``, ``generation_config`` and
``tokenizer`` at hand, and the :class:`~layerfit.engine.engine.Engine` that runs it as
``engine`` (its budget, memory plan, trace). ``streaming()`` lends the model itself to
code that takes a model, such as a transformers ``pipeline``, with every pass streamed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from pathlib import Path
from typing import Any

from torch import nn

from layerfit.engine.config import EngineConfig
from layerfit.engine.engine import Engine
from layerfit.engine.generation import streamed
from layerfit.errors import InputError, LayerfitError, OutputPathError
from layerfit.store.gguf_folder import PREFIX, gguf_path, is_gguf
from layerfit.store.hf_folder import CONFIG, HFOptions
from layerfit.store.manifest import MANIFEST, read_manifest
from layerfit.store.output_folder import OutputBusyError, output_lock

CACHE_ENVIRONMENT = "LAYERFIT_CACHE"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
CACHE_LOCK = ".layerfit-cache-lock"
"""Beside a cache folder (``.NAME`` + this), held while one caller prepares it: others wait."""
CACHE_WAIT = 30 * 60.0
"""Seconds a caller waits for another preparing the same cache folder (a large model's
prepare takes minutes) before it gives up in one line."""


def cache_root() -> Path:
    """Where prepared copies of Hugging Face folders live: ``$LAYERFIT_CACHE``, else
    ``$XDG_CACHE_HOME/layerfit``, else ``~/.cache/layerfit``."""
    if os.environ.get(CACHE_ENVIRONMENT):
        return Path(os.environ[CACHE_ENVIRONMENT])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "layerfit"


def cached_directory(folder: Path, options: HFOptions) -> Path:
    """The cache folder of ``folder`` (or of a GGUF file) prepared with ``options``: named
    after it and a digest of its path, its files' names, sizes and modification times and
    the options, so a changed checkpoint is prepared again rather than served stale."""
    digest = hashlib.sha256(str(folder.resolve()).encode())
    for path in sorted(folder.iterdir()) if folder.is_dir() else [folder]:
        if path.is_file():
            st = path.stat()
            digest.update(f"{path.name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    digest.update(repr((options.class_name, options.seq_len, options.dtype)).encode())
    return cache_root() / "prepared" / f"{folder.resolve().name}-{digest.hexdigest()[:16]}"


class PretrainedModel:
    """A prepared Hugging Face model run within a weight budget, used like the model."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.directory = engine.directory
        self._tokenizer: Any = None

    @property
    def model(self) -> nn.Module:
        """The model's skeleton (its weights are bound only during a pass)."""
        return self.engine.model

    @property
    def config(self) -> Any:
        """The model's own (transformers) config."""
        return self.engine.model.config

    @property
    def generation_config(self) -> Any:
        return getattr(self.engine.model, "generation_config", None)

    @property
    def tokenizer(self) -> Any:
        """The tokenizer prepare copied beside the weights (transformers' ``AutoTokenizer``,
        never with remote code), loaded on first use; None when the folder had none."""
        if self._tokenizer is None and any((self.directory / f).is_file() for f in TOKENIZER_FILES):
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self.directory), local_files_only=True, trust_remote_code=False)
        return self._tokenizer

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.engine(*args, **kwargs)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """The model's own ``generate``, every pass streamed."""
        return self.engine.generate(*args, **kwargs)

    def streaming(self) -> contextlib.AbstractContextManager[nn.Module]:
        """``with m.streaming() as model:`` — the model itself, its passes streamed by the
        engine, for code that takes a model (``pipeline("text-generation", model=model,
        tokenizer=m.tokenizer)``)."""
        return streamed(self.engine)

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> PretrainedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PretrainedModel({type(self.model).__name__}, {self.directory}, {self.engine.pipeline})"


def from_pretrained(
    path: str | Path,
    config: EngineConfig | None = None,
    *,
    hf: HFOptions | None = None,
    cache: str | Path | None = None,
    progress: Any = None,
    **options: Any,
) -> PretrainedModel:
    """The model at ``path`` run within a budget: a prepared folder is loaded; a Hugging
    Face folder is prepared first (once, into ``cache`` or :func:`cache_root`), then
    loaded. ``options`` are the engine's (``budget="40%"``, ``pipeline`` ...)."""
    folder = Path(str(path).removeprefix("hf:"))
    if is_gguf(str(path)):  # a GGUF file: prepared once into the cache, as its blocks
        folder = gguf_path(str(path))
        options_hf = hf or HFOptions()
        directory = Path(cache) / cached_directory(folder, options_hf).name if cache is not None else cached_directory(folder, options_hf)
        if not _usable(directory):
            _prepare_once(folder, directory, options_hf, progress, PREFIX + str(folder))
    elif os.path.lexists(folder / MANIFEST):  # a manifest that is not a regular file is refused for what it is
        directory = folder
    elif (folder / CONFIG).is_file():
        options_hf = hf or HFOptions()
        directory = cached_directory(folder, options_hf)
        if cache is not None:
            directory = Path(cache) / directory.name
        if not _usable(directory):
            _prepare_once(folder, directory, options_hf, progress)
    else:
        raise InputError(
            f"{path} is neither a prepared model nor a Hugging Face folder (it holds no {MANIFEST} and no {CONFIG})"
        )
    engine = Engine(directory, config, **options)
    if engine.manifest.model.get("source") != "hf":
        engine.close()
        raise InputError(f"{directory} was not prepared from a Hugging Face folder: use layerfit.load for it")
    return PretrainedModel(engine)


def _prepare_once(folder: Path, directory: Path, options: HFOptions, progress: Any, model: str | None = None) -> None:
    """Prepare ``folder`` into the cache folder ``directory`` unless a complete one is there
    by now, one caller at a time: a second process (or thread) asking for the same folder
    waits, at most :data:`CACHE_WAIT` seconds, for the first under the cache's own lock
    (``.NAME`` + :data:`CACHE_LOCK`, held with a blocking flock), then uses what it
    prepared. A ``prepare`` of the same folder from elsewhere (the command line) is
    waited for the same way. Waited too long, one line says who holds it. ``model`` is
    what ``prepare`` is given (``gguf:FILE``), by default ``hf:FOLDER``."""
    from layerfit.store.writer import prepare

    try:
        directory.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(f"cannot create {directory}: {exc.strerror or exc} (pass another cache)") from None
    deadline = time.monotonic() + CACHE_WAIT
    try:
        with output_lock(directory, wait=CACHE_WAIT, lock=CACHE_LOCK):
            while not _usable(directory):
                try:
                    prepare(model or "hf:" + str(folder), directory, hf=options, force=directory.exists(), progress=progress)
                except OutputBusyError:  # a prepare not of from_pretrained's writes it now: wait, then look again
                    with output_lock(directory, wait=max(deadline - time.monotonic(), 0.0)):
                        pass
    except OutputBusyError as busy:
        raise OutputBusyError(
            f"another process ({busy.holder}) is still preparing {folder} into {directory} after "
            f"{_duration(CACHE_WAIT)} of waiting: try again once it is done, or pass another cache",
            busy.holder,
        ) from None


def _duration(seconds: float) -> str:
    """``seconds`` in words: minutes from one minute on."""
    return f"{seconds / 60:g} minutes" if seconds >= 60 else f"{seconds:g} s"


def _usable(directory: Path) -> bool:
    """Whether ``directory`` holds a complete prepared model (one interrupted or written
    by another layerfit version is prepared again)."""
    try:
        read_manifest(directory)
    except LayerfitError:
        return False
    return True
