"""Which model factories a prepared folder may name: the trust model.

A prepared folder's manifest names the code that rebuilds the model's skeleton. The
zoo is layerfit's own code and always runs, and so does a Hugging Face model prepared
with ``hf:`` (its manifest names a class that is looked up among transformers' model
classes only, and holds its config as data). Any other factory is an import of, and a
call into, an arbitrary module (``os:system`` would do), so it runs only when the
person running layerfit said so, as transformers' ``trust_remote_code`` works:

* ``--trust-factory MODULE`` on the command line (``layerfit --trust-factory mypkg run DIR``),
* ``trust_factory=[...]`` in ``layerfit.load`` / ``Runtime`` / ``ServeSettings``,
  or :func:`trust_factories` once in a process (as ``torch.serialization.add_safe_globals``),
* ``LAYERFIT_TRUST_FACTORY=mypkg,otherpkg`` in the environment.

Trusting ``mypkg`` trusts ``mypkg`` and every module under it. Nothing a file or an HTTP
request says can add to the list. ``prepare`` runs the factory the caller names (that is
the caller's own decision) and does not consult the list.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable

from layerfit.errors import LayerfitError

ENVIRONMENT = "LAYERFIT_TRUST_FACTORY"
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")

_trusted: set[str] = set()
_lock = threading.Lock()


class UntrustedFactoryError(LayerfitError):
    """A prepared model whose factory is not trusted to run in this process."""


def check_module_name(module: str) -> str:
    """``module`` if it is a dotted Python module name, else a one-line error."""
    if not isinstance(module, str) or not _MODULE.match(module):
        raise LayerfitError(f"--trust-factory takes a module name such as mypkg or mypkg.models, not {module!r}")
    return module


def trust_factories(modules: Iterable[str]) -> None:
    """Trust the factories in ``modules`` (and their submodules) for this process."""
    names = [check_module_name(m) for m in modules]
    with _lock:
        _trusted.update(names)


def trusted_modules() -> frozenset[str]:
    """The modules trusted now: those given in this process and in the environment."""
    from_env = {m.strip() for m in os.environ.get(ENVIRONMENT, "").split(",") if m.strip()}
    with _lock:
        return frozenset(_trusted | from_env)


def is_trusted(factory: str) -> bool:
    """Whether ``package.module:function`` may be imported and called."""
    module = factory.partition(":")[0]
    return any(module == m or module.startswith(m + ".") for m in trusted_modules())


def check_trusted(source: str, name: str, where: str) -> None:
    """Refuse to rebuild a model whose manifest names code not trusted to run.

    ``where`` names the prepared folder in the message, which says what to pass.
    """
    if source in ("zoo", "hf"):  # layerfit's own code, or a transformers model class by name
        return
    if source != "factory" or not isinstance(name, str):
        raise UntrustedFactoryError(f"{where}: the manifest names a model of unknown source {source!r}; prepare it again")
    if is_trusted(name):
        return
    module = name.partition(":")[0] or name
    top = module.split(".")[0]
    raise UntrustedFactoryError(
        f"{where} is built by factory {name!r}, which runs code from module {module!r}; layerfit runs "
        f"a prepared folder's factory only if you trust it: layerfit --trust-factory {top} ... "
        f"(Python: trust_factory=[{top!r}]; or {ENVIRONMENT}={top})"
    )
