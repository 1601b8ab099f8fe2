"""A command or function that needs a missing extra stops with one line naming it.

Each case hides the extra's packages from a child process (see :mod:`hiding`) and runs
the command a user would: exit status 2, one line on stderr naming the ``pip install``
to run, no traceback. The core commands run with every extra hidden.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from hiding import cli_without, run_without

from layerfit.extras import EXTRA_OF_MODULE, MODULES_OF_EXTRA, MissingExtraError, require

pytestmark = [pytest.mark.compat, pytest.mark.core]

EVERY_EXTRA_MODULE = sorted(EXTRA_OF_MODULE)


def modules_of(extra: str) -> list[str]:
    return sorted(MODULES_OF_EXTRA[extra])


def absent_extras() -> set[str]:
    """The extras not installed here at all (every one on the core leg of the matrix)."""
    return {e for e, modules in MODULES_OF_EXTRA.items() if any(importlib.util.find_spec(m) is None for m in modules)}


def assert_names_extra(result, extra: str) -> None:
    """One line naming ``extra``'s install, or that of another extra missing here too
    (where nothing is installed, a command may stop at the first it needs)."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    named = {e for e in MODULES_OF_EXTRA if f"pip install 'layerfit[{e}]'" in lines[0]}
    assert len(named) == 1 and named <= {extra} | absent_extras(), lines[0]


@pytest.mark.parametrize(
    ("extra", "argv"),
    [
        ("serve", ["serve", "--repository", "{tmp}"]),
        ("tradeoff", ["partition", "vgg16", "--budget", "50MB"]),
        ("schedule", ["schedule", "graph", "vgg16", "-o", "{tmp}/graph.png"]),
        ("plot", ["plot-trace", "{tmp}/trace.json", "-o", "{tmp}/trace.png"]),
        ("hf", ["prepare", "tinymodels:tiny_gpt2", "-o", "{tmp}/gpt2", "--input-shape", "1,8", "--input-dtype", "int64"]),
    ],
)
def test_a_command_without_its_extra_names_the_install(extra: str, argv: list[str], tmp_path: Path) -> None:
    result = cli_without(modules_of(extra), *(a.replace("{tmp}", str(tmp_path)) for a in argv))
    assert_names_extra(result, extra)
    assert not (tmp_path / "gpt2").exists()  # nothing written


def test_the_exact_solvers_without_their_extra_name_the_install() -> None:
    # CP-SAT runs only where a heuristic misses the bound: ask for the solver itself.
    result = run_without(
        ["ortools"],
        "from layerfit.memory.cpsat_common import cp_model\n"
        "from layerfit.extras import MissingExtraError\n"
        "try:\n    cp_model()\nexcept MissingExtraError as e:\n    print(e)\n",
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'layerfit[plan]'" in result.stdout


@pytest.mark.parametrize(("package", "extra"), [("layerfit.serve", "serve"), ("layerfit.schedule.experiments.simulator", "schedule"),
                                                ("layerfit.tradeoff", "tradeoff")])
def test_importing_a_feature_without_its_extra_raises_a_layerfit_error(package: str, extra: str) -> None:
    result = run_without(
        modules_of(extra),
        "import importlib\nfrom layerfit.errors import LayerfitError\n"
        f"try:\n    importlib.import_module({package!r})\nexcept LayerfitError as e:\n"
        "    print(type(e).__name__, '|', e)\n",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("MissingExtraError |")
    assert f"pip install 'layerfit[{extra}]'" in result.stdout


def test_the_core_commands_need_no_extra(tmp_path: Path) -> None:
    """prepare → inspect → verify → run, and the Python API's load, with every optional
    package hidden: the light core does all of it, and imports none of them."""
    out = tmp_path / "m"
    steps = [
        ["prepare", "mobilenet_v2", "-o", str(out), "--input-shape", "1,3,64,64"],
        ["inspect", str(out)],
        ["verify", str(out)],
        ["run", str(out), "--budget", "60%", "--json"],
    ]
    for argv in steps:
        result = cli_without(EVERY_EXTRA_MODULE, *argv)
        assert result.returncode == 0, (argv, result.stderr)
    assert json.loads(result.stdout)["output_shape"] == [1, 1000]
    loaded = run_without(
        EVERY_EXTRA_MODULE,
        "import layerfit\nfrom layerfit.store import example_input\n"
        f"with layerfit.load({str(out)!r}, budget='60%') as engine:\n"
        "    print(tuple(engine(example_input((1, 3, 64, 64))).shape))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in HIDDEN))\n",
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.splitlines() == ["(1, 1000)", "[]"]


def test_require_names_the_extra_only_for_the_missing_package_itself() -> None:
    result = run_without(
        ["networkx"],
        "from layerfit.extras import require\n"
        "try:\n    require('networkx')\nexcept ImportError as e:\n    print(type(e).__name__, '|', e)\n",
    )
    assert result.stdout.startswith("MissingExtraError |"), result.stderr
    assert "pip install 'layerfit[schedule]'" in result.stdout
    pytest.importorskip("yaml")  # installed, with a module inside it missing: not an extra's fault
    with pytest.raises(ModuleNotFoundError) as caught:
        require("yaml.surely_not_a_module")
    assert not isinstance(caught.value, MissingExtraError)


def test_ensure_checks_an_extra_without_importing_it() -> None:
    present = run_without(
        [], "from layerfit.extras import ensure\nensure('serve')\nprint('fastapi' in sys.modules)\n"
    )
    if present.returncode == 0:  # the serve extra is installed (not on the core leg)
        assert present.stdout.strip() == "False"
    hidden = run_without(["uvicorn"], "from layerfit.extras import ensure\nensure('serve')\n")
    assert hidden.returncode == 1
    last = hidden.stderr.strip().splitlines()[-1]
    assert last.startswith("layerfit.extras.MissingExtraError: ") and "pip install 'layerfit[serve]'" in last
