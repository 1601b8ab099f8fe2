"""Starting the command: PyTorch (a second or more, about 200 MB) is imported only by
commands that run a model, and the packages that load their names on first use give
the same objects as importing them from their modules."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

LAZY_PACKAGES = ("layerfit.engine", "layerfit.store", "layerfit.schedule", "layerfit.serve")

_IMPORTED = """
import json, sys
from layerfit.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "torch": "torch" in sys.modules}))
"""


def run_cli(*args: str, cwd: Path) -> dict:
    """``layerfit ARGS`` in a fresh process: its exit code and whether it imported torch."""
    out = subprocess.run([sys.executable, "-c", _IMPORTED, *args], capture_output=True, text=True,
                         cwd=cwd, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_help_and_simulated_scheduling_never_import_torch(tmp_path: Path) -> None:
    assert run_cli("schedule", "--help", cwd=tmp_path) == {"code": 0, "torch": False}
    generated = run_cli("schedule", "generate", "small-3", "--count", "6", "-o", "w.yaml", cwd=tmp_path)
    assert generated == {"code": 0, "torch": False}
    simulated = run_cli("schedule", "run", "--workload", "w.yaml", "--simulate", "--budget", "512MB",
                        cwd=tmp_path)
    assert simulated == {"code": 0, "torch": False}
    refused = run_cli("schedule", "run", "--workload", "w.yaml", "--simulate", "--budget", "512MB",
                      "--threads", "1", cwd=tmp_path)
    assert refused == {"code": 2, "torch": False}  # a real run's option, refused before anything loads


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_a_lazy_package_gives_the_objects_its_modules_define(package: str) -> None:
    module = importlib.import_module(package)
    submodules = {info.name for info in pkgutil.iter_modules(module.__path__)}
    exports = module._EXPORTS
    # a name shared with a submodule would turn into the module once that is imported
    assert sorted(set(exports) & submodules) == []
    assert sorted(module.__all__) == sorted(exports) == sorted(dir(module))
    for name, where in exports.items():
        value = getattr(module, name)
        assert not isinstance(value, types.ModuleType), name
        assert value is getattr(importlib.import_module(f"{package}.{where}"), name)
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        module.nothing_here  # noqa: B018
