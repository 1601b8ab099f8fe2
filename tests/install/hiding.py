"""Run layerfit in a child process as if some packages were not installed.

Every import finder is wrapped so that it does not see the hidden top-level modules:
``import x`` raises ``ModuleNotFoundError`` and ``importlib.util.find_spec("x")`` is
``None``, exactly as when the package is absent (torch itself probes optional packages
with ``find_spec``, so raising from a finder would not be the same). Where the packages
really are absent (the core leg of ``make test-compat``) hiding changes nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

_PRELUDE = """
import sys

HIDDEN = set(sys.argv[1].split(",")) - {""}


class _Blind:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            return None
        find = getattr(self.finder, "find_spec", None)
        return find(name, path, target) if find else None

    def __getattr__(self, attr):
        return getattr(self.finder, attr)


sys.meta_path[:] = [_Blind(f) for f in sys.meta_path]
del sys.argv[1]
"""

_TESTS = Path(__file__).resolve().parents[1]


def run_without(modules: Iterable[str], code: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with ``args`` as ``sys.argv[1:]`` in a child in which ``modules`` are
    not installed; ``tests/`` is importable (the ``tinymodels`` factories)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_TESTS), env.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-c", _PRELUDE + code, ",".join(modules), *args],
        capture_output=True, text=True, timeout=timeout, env=env, check=False,
    )


def cli_without(modules: Iterable[str], *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``layerfit ARGV`` in a child in which ``modules`` are not installed."""
    return run_without(
        modules, "from layerfit.cli import main\nsys.exit(main(sys.argv[1:]))", *argv, timeout=timeout
    )
