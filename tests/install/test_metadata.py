"""The installed distribution's metadata: ranges a vendor's torch fits, extras as the
code names them, and a version the command prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import layerfit
from layerfit.extras import MODULES_OF_EXTRA

pytestmark = [pytest.mark.compat, pytest.mark.core]

# The import name of each distribution an extra lists, where the two differ.
MODULE_OF_DISTRIBUTION = {"pyyaml": "yaml", "prometheus-client": "prometheus_client"}


def requirements() -> list[Requirement]:
    return [Requirement(r) for r in metadata.requires("layerfit") or []]


def test_torch_range_admits_vendor_builds_and_the_matrix() -> None:
    torch_req = next(r for r in requirements() if r.name == "torch" and r.marker is None)
    # NVIDIA's JetPack 6 build, versioned as a pre-release: a plain ">=2.5" refuses it and
    # pip would replace the CUDA torch with a PyPI wheel.
    for version in ("2.5.0a0+872d972e41.nv24.08", "2.5.1", "2.13.0", "2.13.0+cpu", "2.15.0"):
        assert torch_req.specifier.contains(Version(version), prereleases=True), version
    assert not torch_req.specifier.contains(Version("2.4.1"))


def test_python_range_is_what_the_matrix_runs() -> None:
    spec = metadata.metadata("layerfit")["Requires-Python"]
    from packaging.specifiers import SpecifierSet

    assert all(v in SpecifierSet(spec) for v in ("3.10", "3.11", "3.12", "3.13"))
    assert "3.9" not in SpecifierSet(spec)


def test_core_dependencies_are_the_light_core() -> None:
    core = {r.name.lower() for r in requirements() if r.marker is None}
    assert core == {"torch", "numpy", "safetensors", "psutil", "typer", "rich"}


def test_each_extra_lists_the_packages_the_code_asks_for() -> None:
    by_extra: dict[str, set[str]] = {}
    for r in requirements():
        match = re.search(r'extra == "([a-z]+)"', str(r.marker)) if r.marker else None
        if match:
            name = r.name.lower()
            by_extra.setdefault(match.group(1), set()).add(MODULE_OF_DISTRIBUTION.get(name, name))
    for extra, modules in MODULES_OF_EXTRA.items():
        assert by_extra[extra] == set(modules), extra
    everything = {m for modules in MODULES_OF_EXTRA.values() for m in modules}
    assert "layerfit" in by_extra["all"] or by_extra["all"] >= everything


def test_version_is_the_distributions() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "layerfit.cli", "--version"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"layerfit {layerfit.__version__}"
    assert metadata.version("layerfit") == layerfit.__version__


@pytest.mark.skipif("LAYERFIT_COMPAT_LEG" not in os.environ, reason="only on a leg of make test-compat")
def test_a_leg_runs_the_installed_wheel_beside_the_vendors_torch() -> None:
    import torch

    assert "site-packages" in layerfit.__file__, layerfit.__file__  # the wheel, not src/
    assert torch.__version__.split("+")[0] == os.environ["LAYERFIT_COMPAT_TORCH"]
