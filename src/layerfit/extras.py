"""Optional dependencies, grouped into the package's extras.

``pip install layerfit`` brings only what preparing, running, inspecting and verifying
one model needs. Everything else (the HTTP server, exact solvers, the GA, the
simulator, plots, Hugging Face) comes with an extra named for what it enables. A module
that needs one imports it through :func:`require`, so that a missing extra is one line
naming the command to run (a :class:`MissingExtraError`, which the CLI prints and exits
2 on), never an ``ImportError`` traceback from deep inside the library.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from layerfit.errors import LayerfitError

#: The top-level modules each extra brings, as ``pyproject.toml`` lists their packages.
MODULES_OF_EXTRA: dict[str, tuple[str, ...]] = {
    "serve": ("fastapi", "uvicorn", "orjson", "prometheus_client"),
    "plan": ("ortools",),
    "schedule": ("simpy", "yaml", "networkx"),
    "tradeoff": ("pymoo", "yaml"),
    "plot": ("matplotlib",),
    "hf": ("transformers", "tokenizers"),
    "gguf": ("gguf", "transformers", "tokenizers", "accelerate"),
}

#: The extra named when an optional module is missing: the first above that brings it
#: (PyYAML comes with two; the tradeoff modules pass ``require(extra="tradeoff")``).
EXTRA_OF_MODULE: dict[str, str] = {}
for _extra, _modules in MODULES_OF_EXTRA.items():
    for _module in _modules:
        EXTRA_OF_MODULE.setdefault(_module, _extra)

#: What each extra enables, for the error message.
PURPOSE_OF_EXTRA: dict[str, str] = {
    "serve": "the HTTP server",
    "plan": "exact solvers",
    "tradeoff": "SwapNet and memory-throughput trade-offs",
    "schedule": "scheduling, workloads and the simulator",
    "plot": "plots",
    "hf": "Hugging Face models",
    "gguf": "preparing GGUF files",
}


class MissingExtraError(LayerfitError, ModuleNotFoundError):
    """An optional dependency that is not installed; the message names the extra.

    It is a ``ModuleNotFoundError`` too, so code that tolerates a missing module
    (``except ImportError``) keeps doing so.
    """

    def __init__(self, module: str, extra: str) -> None:
        purpose = PURPOSE_OF_EXTRA[extra]
        super().__init__(
            f"{module.split('.')[0]!r} is not installed; it comes with layerfit's {extra!r} "
            f"extra ({purpose}): pip install 'layerfit[{extra}]'"
        )
        self.name = module.split(".")[0]
        self.extra = extra


def extra_for(error: ModuleNotFoundError) -> str | None:
    """The extra that would have brought the module ``error`` could not find, if any: only
    for an optional package itself missing, not for a module missing inside one."""
    return EXTRA_OF_MODULE.get(error.name or "")


def require(module: str, extra: str | None = None) -> ModuleType:
    """Import ``module`` (e.g. ``"simpy"``, ``"matplotlib.pyplot"``), or raise a
    :class:`MissingExtraError` naming the extra that brings it: ``extra`` where several
    extras carry the module (PyYAML comes with ``schedule`` and ``tradeoff``), else the
    one :data:`EXTRA_OF_MODULE` gives.

    Only the optional package itself being absent is translated; an import error raised
    inside an installed package (a broken install) propagates as it is.
    """
    top = module.split(".")[0]
    extra = extra or EXTRA_OF_MODULE[top]  # a KeyError: list the module above
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != top:  # the package is there, a module inside it is not
            raise
        raise MissingExtraError(module, extra) from None


def ensure(extra: str) -> None:
    """Raise a :class:`MissingExtraError` unless every module ``extra`` brings is
    installed; finds them without importing them (a package's ``__init__`` stays cheap)."""
    for module in MODULES_OF_EXTRA[extra]:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise MissingExtraError(module, extra)
