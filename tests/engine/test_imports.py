"""A run imports what its model needs and no more (#55): each module imported is memory
the process keeps, beside the weights. ``from transformers import LlamaForCausalLM``
alone holds about 130 MB more than ``import torch`` (it imports ``torch._dynamo`` and
sympy, bench/results/footprint.md), so a zoo CNN's load and pass must import none of
them, and no run imports layerfit's optional packages.

Each probe runs in a fresh interpreter: what other tests imported would hide an import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from layerfit.store import prepare

TESTS = Path(__file__).resolve().parents[1]
HEAVY = ("transformers", "torch._dynamo", "sympy")
# layerfit's optional packages no run needs: the planner's solver, the searches, plots,
# the server, the simulator.
EXTRAS = ("ortools", "pymoo", "matplotlib", "fastapi", "uvicorn", "simpy", "networkx")

PROBE = f"""
import json, sys
import layerfit
from layerfit.store import read_manifest
from layerfit.store.examples import example_call

folder = sys.argv[1]
engine = layerfit.load(folder, budget=sys.argv[2])
args, kwargs = example_call(read_manifest(folder))
engine(*args, **kwargs)
engine(*args, **kwargs)
print(json.dumps(sorted(m for m in sys.modules if m in {set(HEAVY + EXTRAS)!r})))
"""


def imported_after_passes(folder: Path, budget: str) -> list[str]:
    """Which of ``HEAVY`` and ``EXTRAS`` a fresh interpreter holds after loading ``folder`` and two passes."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(folder), budget],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_a_zoo_cnn_runs_without_transformers(tmp_path: Path) -> None:
    folder = tmp_path / "mobilenet"
    prepare("mobilenet_v1_025", folder, input_shape=(1, 3, 64, 64))
    assert imported_after_passes(folder, "60%") == []


def test_a_transformers_model_imports_it(lm) -> None:
    """The probe sees the import where the model's class needs it (the check above can
    fail), and a decoder's run imports none of layerfit's optional packages either."""
    folder, *_ = lm
    imported = imported_after_passes(folder, "60%")
    assert "transformers" in imported
    assert not set(imported) & set(EXTRAS)
