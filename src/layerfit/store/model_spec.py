"""Resolve what the user names as a model: a zoo name or ``package.module:factory``.

The resolved spec is what the manifest records, so a prepared model can rebuild its
skeleton later from the same factory and arguments.
"""

from __future__ import annotations

import difflib
import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from layerfit.errors import FactoryImportError, LayerfitError, UnknownModelError
from layerfit.extras import MissingExtraError, extra_for


@dataclass(frozen=True)
class ModelSpec:
    """How to construct a model: from the zoo or from an importable factory."""

    source: str  # "zoo", "factory" or "hf" (a transformers class, built from its config)
    name: str  # zoo name, "package.module:factory" or a transformers class name
    kwargs: dict[str, Any] = field(default_factory=dict)
    input_shape: tuple[int, ...] | None = None  # default input shape, when known

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "name": self.name, "kwargs": dict(self.kwargs)}

    def factory(self) -> Callable[..., nn.Module]:
        """The pure constructor (default initialisation only, no weights)."""
        if self.source == "zoo":
            from layerfit import zoo

            return zoo.get(self.name).factory
        if self.source == "hf":
            from layerfit.store.hf_folder import build_model

            return functools.partial(build_model, self.name)
        return _import_factory(self.name)

    def build(self, seed: int = 0) -> nn.Module:
        """A fully initialised module: seeded zoo weights or the factory's own."""
        if self.source == "zoo":
            from layerfit import zoo

            return zoo.build(self.name, seed=seed, **self.kwargs)
        return self.instantiate("a factory takes no required arguments")

    def instantiate(self, hint: str) -> nn.Module:
        """Call the factory with the spec's arguments (on the current default device);
        a factory that raises or returns something else is a FactoryImportError ending
        in ``hint``, not a traceback from the user's code."""
        factory = self.factory()
        try:
            module = factory(**self.kwargs)
        except LayerfitError:  # the factory's own one line (a Hugging Face class says what to do)
            raise
        except Exception as exc:  # the user's factory may raise anything
            _raise_if_extra_missing(exc)
            raise FactoryImportError(
                f"factory {self.name!r} fails when called with arguments {self.kwargs}: "
                f"{type(exc).__name__}: {exc} ({hint})"
            ) from exc
        if not isinstance(module, nn.Module):
            raise FactoryImportError(
                f"factory {self.name!r} returned {type(module).__name__}, not a torch.nn.Module"
            )
        return module


def _raise_if_extra_missing(exc: Exception) -> None:
    """A factory that needs an optional package that is not installed: name the extra."""
    extra = extra_for(exc) if isinstance(exc, ModuleNotFoundError) else None
    if extra is not None:
        raise MissingExtraError(exc.name or "", extra) from None


def _import_factory(path: str) -> Callable[..., nn.Module]:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise FactoryImportError(f"factory path {path!r} must look like package.module:factory")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        _raise_if_extra_missing(exc)
        raise FactoryImportError(
            f"cannot import {module_name!r} for factory {path!r}: {exc}{_working_directory_hint(module_name, exc)}"
        ) from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise FactoryImportError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise FactoryImportError(f"{path!r} is not callable")
    return obj


def _working_directory_hint(module_name: str, exc: Exception) -> str:
    """Why a factory module that sits in the working directory does not import, when it
    does not: the ``layerfit`` script (unlike ``python -m`` or ``python -c``) does not put
    the working directory on Python's import path. Only said where the top-level package
    itself was not found and its file or folder is there; the path is never changed."""
    top = module_name.split(".")[0]
    if not isinstance(exc, ModuleNotFoundError) or exc.name != top:
        return ""
    try:
        cwd = Path.cwd()
    except OSError:  # the working directory was removed
        return ""
    found = next((p for p in (cwd / f"{top}.py", cwd / top / "__init__.py") if p.is_file()), None)
    if found is None:
        return ""
    return (
        f" ({found.relative_to(cwd)} is in the working directory, which is not on Python's import "
        "path: run with PYTHONPATH=. or install it)"
    )


def resolve(name: str, kwargs: dict[str, Any] | None = None) -> ModelSpec:
    """A :class:`ModelSpec` for a zoo name or a ``package.module:factory`` path."""
    kwargs = dict(kwargs or {})
    if ":" in name:
        _import_factory(name)  # fail now, with a clear message, rather than later
        return ModelSpec("factory", name, kwargs)
    from layerfit import zoo

    if name not in zoo.names():
        close = difflib.get_close_matches(name.lower(), zoo.names(), n=5, cutoff=0.5)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise UnknownModelError(
            f"unknown model {name!r}.{hint} (`layerfit zoo` lists the built-in models; "
            "a factory is written package.module:function)"
        )
    entry = zoo.get(name)
    return ModelSpec("zoo", name, {**entry.kwargs, **kwargs}, tuple(entry.input_shape))
