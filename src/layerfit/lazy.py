"""Packages that name their public objects but import each module on first use.

``import layerfit.cli`` must not import PyTorch (a second or more on a small board, and
about 200 MB) before it knows which command runs, and importing any submodule of a
package runs the package's ``__init__`` first. So package ``__init__`` modules map names
to submodules and let :func:`lazy_exports` resolve them when asked.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps each public name to the
    submodule (relative to ``package``) that defines it."""

    def getattr_(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(f"{package}.{module}"), name)

    def dir_() -> list[str]:
        return sorted(exports)

    return getattr_, dir_
