"""What the engine's per-unit bookkeeping costs, against another checkout's engine.

A model of 256 tiny ``Linear(16, 16)`` layers makes a pass almost all hooks: each unit
runs a pre-hook and a post-hook around a kernel of a few microseconds. ``preload``
(every unit bound for good) shows the hooks' own cost; ``async`` adds the reader thread
and the handing over of every unit. Each configuration runs in a fresh child, this
checkout's library and ``--before-src``'s in alternation, ``--rounds`` times; each child
reports the median of 200 passes (one compute thread, after 20 warm-up passes).

    .venv/bin/python bench/hook_overhead.py --before-src /tmp/old/src --name hook_overhead

writes ``bench/results/<name>.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from reporting import machine, write_results  # noqa: E402

SRC = Path(__file__).resolve().parent.parent / "src"
LAYERS, WIDTH, PASSES, WARMUP = 256, 16, 200, 20

CHILD = f"""
import json, statistics, sys, time
import torch
from torch import nn
import layerfit.store.trust as trust
from layerfit.engine import load
from layerfit.store import prepare
directory, pipeline, factory_dir = sys.argv[1:4]
sys.path.insert(0, factory_dir)
trust.trust_factories(["hook_overhead_model"])
if not (__import__("pathlib").Path(directory) / "manifest.json").exists():
    prepare("hook_overhead_model:deep", directory, input_shape=(1, {WIDTH}))
torch.set_num_threads(1)
x = torch.randn(1, {WIDTH})
with load(directory, pipeline=pipeline, budget=None if pipeline == "preload" else "40%") as engine:
    for _ in range({WARMUP}):
        engine(x)
    times = []
    for _ in range({PASSES}):
        t0 = time.perf_counter(); engine(x); times.append(time.perf_counter() - t0)
print(json.dumps({{"median_s": statistics.median(times)}}))
"""

FACTORY = f"""from torch import nn


def deep():
    return nn.Sequential(*[nn.Linear({WIDTH}, {WIDTH}) for _ in range({LAYERS})])
"""


def child(src: Path, directory: Path, pipeline: str, factory_dir: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(directory), pipeline, str(factory_dir)],
        env=env, check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out.splitlines()[-1])["median_s"]


def markdown(data: dict) -> str:
    lines = [
        f"# Engine hook overhead: {LAYERS} layers of Linear({WIDTH}, {WIDTH}), {data['rounds']} rounds, alternating",
        "",
        "Per pass, median of each child's 200-pass median. Per hook call = the difference over "
        f"{2 * LAYERS} hook calls (a pre- and a post-hook per unit).",
        "",
        "| pipeline | before (ms) | after (ms) | after / before | difference per hook call (µs) | spread of rounds |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in data["pipelines"].items():
        lines.append(
            f"| {name} | {r['before_ms']:.3f} | {r['after_ms']:.3f} | {r['ratio']:.3f} | "
            f"{r['per_hook_us']:+.3f} | {r['spread']:.1%} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before-src", required=True, help="the other checkout's src folder")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--name", default="hook_overhead")
    args = p.parse_args()
    sides = {"before": Path(args.before_src).resolve(), "after": SRC}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hooks-") as tmp:
        factory_dir = Path(tmp)
        (factory_dir / "hook_overhead_model.py").write_text(FACTORY)
        runs: dict[str, dict[str, list[float]]] = {}
        for pipeline in ("preload", "async"):
            runs[pipeline] = {"before": [], "after": []}
            for _ in range(args.rounds):
                for side, src in sides.items():
                    runs[pipeline][side].append(child(src, factory_dir / side, pipeline, factory_dir))
    pipelines = {}
    for name, r in runs.items():
        b, a = statistics.median(r["before"]), statistics.median(r["after"])
        spread = max(max(v) / min(v) for v in r.values()) - 1
        pipelines[name] = {
            "before_s": r["before"], "after_s": r["after"], "before_ms": b * 1e3, "after_ms": a * 1e3,
            "ratio": a / b, "per_hook_us": (a - b) / (2 * LAYERS) * 1e6, "spread": spread,
        }
    data = {
        "machine": machine(), "before_src": str(sides["before"]), "rounds": args.rounds,
        "layers": LAYERS, "passes": PASSES, "pipelines": pipelines, "wall_s": time.perf_counter() - t0,
    }
    js, md = write_results(args.name, data, markdown(data))
    print(markdown(data))
    print(f"wrote {js} and {md}")


if __name__ == "__main__":
    main()
