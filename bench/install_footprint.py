"""What `pip install layerfit` costs: site-packages of the light core and of `all`, with and
without torch, and the core's start-up (`import layerfit`, `layerfit --help`).

Each variant is a fresh venv of this Python with the same torch as `make test` (the
wheel built from this checkout, installed with `requirements/test.lock` as constraints,
so the versions are the tested ones). Start-up times are medians of ``--repeat`` runs
of a new process, alternating between the two commands.

    .venv/bin/python bench/install_footprint.py            # writes bench/results/install_footprint.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def sh(cmd: list[str], **kw) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


_SIZES = r"""
import json, re
from importlib import metadata

def size(dist):
    total = 0
    for f in dist.files or []:
        try:
            total += f.locate().stat().st_size
        except OSError:
            pass
    return total

dists = {d.metadata["Name"].lower().replace("_", "-"): d for d in metadata.distributions()}
def closure(name):
    seen, todo = set(), [name]
    while todo:
        n = todo.pop()
        if n in seen or n not in dists:
            continue
        seen.add(n)
        for req in dists[n].requires or []:
            if "extra ==" in req:
                continue
            todo.append(re.match(r"[A-Za-z0-9._-]+", req).group(0).lower().replace("_", "-"))
    return seen
torch = closure("torch")
sizes = {n: size(d) for n, d in dists.items()}
print(json.dumps({"total": sum(sizes.values()), "torch_closure": sum(sizes[n] for n in torch),
                  "torch_closure_names": sorted(torch)}))
"""


def sizes(py: Path) -> tuple[float, float]:
    """(MB of every installed distribution, MB without torch and what torch itself
    requires: a Jetson or a Pi already has those, the rest is what layerfit adds)."""
    data = json.loads(sh([str(py), "-c", _SIZES]).strip().splitlines()[-1])
    return data["total"] / 1e6, (data["total"] - data["torch_closure"]) / 1e6


def startup(py: Path, repeat: int) -> dict[str, float]:
    """Median seconds of a new process importing layerfit, and of `layerfit --help`."""
    layerfit = py.parent / "layerfit"
    runs: dict[str, list[float]] = {"import layerfit": [], "layerfit --help": []}
    for _ in range(repeat):
        for label, cmd in (("import layerfit", [str(py), "-c", "import layerfit"]),
                           ("layerfit --help", [str(layerfit), "--help"])):
            start = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True)
            runs[label].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="layerfit-footprint-"))
    try:
        sh([sys.executable, "-m", "build", "--wheel", "--outdir", str(work / "dist"), str(ROOT)])
        wheel = next((work / "dist").glob("*.whl"))
        rows = []
        for variant, extras in (("core", ""), ("all", "[all]")):
            venv = work / variant
            sh([sys.executable, "-m", "venv", str(venv)])
            py = venv / "bin" / "python"
            start = time.perf_counter()
            sh([str(py), "-m", "pip", "install", "-q", "-c", str(ROOT / "requirements" / "test.lock"), f"{wheel}{extras}"])
            install_s = time.perf_counter() - start
            total, without = sizes(py)
            packages = len(sh([str(py), "-m", "pip", "list", "--format=freeze"]).splitlines())
            row = {"variant": variant, "packages": packages, "site_packages_mb": round(total, 1),
                   "without_torch_mb": round(without, 1), "install_s": round(install_s, 1)}
            if variant == "core":
                row.update({k: round(v, 3) for k, v in startup(py, args.repeat).items()})
            rows.append(row)
            print(row, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    machine = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
               "torch": sh([sys.executable, "-c", "import torch; print(torch.__version__)"]).strip()}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "install_footprint.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))
    core = rows[0]
    lines = [
        "# Install footprint",
        "",
        f"Python {machine['python']} on {machine['machine']} ({machine['cpus']} CPUs), torch {machine['torch']}; "
        f"`bench/install_footprint.py`, medians of {args.repeat} start-ups.",
        "",
        "| install | packages | site-packages MB | without torch and its dependencies MB | install s |",
        "|---|---:|---:|---:|---:|",
        *(f"| `layerfit{'' if r['variant'] == 'core' else '[all]'}` | {r['packages']} | {r['site_packages_mb']:.0f} | "
          f"{r['without_torch_mb']:.0f} | {r['install_s']:.0f} |" for r in rows),
        "",
        f"Core start-up: `import layerfit` {core['import layerfit']:.2f} s, `layerfit --help` {core['layerfit --help']:.2f} s.",
        "",
    ]
    (RESULTS / "install_footprint.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
