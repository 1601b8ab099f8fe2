"""How much memory ``layerfit prepare`` needs beyond building the model.

Preparing runs where the model can be built: on an edge board itself when no workstation
is at hand, so its peak matters as much as the engine's. Each model is built (seeded zoo
weights) in one child process and prepared in another (each in its own memory cgroup
where one can be made); the bench reports both peak RSS values, their difference (what
capture and writing add) and the model's weights. The writer streams each tensor's bytes
to the file and the hash without copying a segment (a copy of vgg16's 411 MB fc6 and its
bytes once doubled the peak). Writes ``bench/results/prepare_memory.{json,md}``::

    .venv/bin/python bench/prepare_memory.py [--models vgg16@64,resnet152@224,mobilenet_v2@224]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, mb, run_child, write_results  # noqa: E402

DEFAULT_MODELS = "vgg16@64,resnet152@224,mobilenet_v2@224"


def child(what: str, name: str, size: int) -> dict[str, Any]:
    """Build (``what`` = build) or prepare the model; peak RSS of this process."""
    from layerfit import zoo

    shape = (*zoo.get(name).input_shape[:-2], size, size)
    t0 = time.perf_counter()
    if what == "build":
        model = zoo.build(name)
        weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    else:
        from layerfit.store import prepare

        with tempfile.TemporaryDirectory() as tmp:
            manifest = prepare(name, Path(tmp) / "m", input_shape=shape)
            weights = manifest.total_bytes
    return {
        "seconds": time.perf_counter() - t0,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "weights_bytes": weights,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--what", help=argparse.SUPPRESS)
    p.add_argument("--models", default=DEFAULT_MODELS, help="zoo models as NAME@SIZE (input resolution)")
    p.add_argument("--output", default="prepare_memory")
    args, rest = p.parse_known_args(argv)
    if args.child:
        name, size = rest[0].split("@")
        print(json.dumps(child(args.what, name, int(size))))
        return 0
    rows = {}
    for spec in args.models.split(","):
        build = run_child(__file__, ["--what", "build", spec])
        prep = run_child(__file__, ["--what", "prepare", spec])
        rows[spec] = {"build": build, "prepare": prep}
        if "error" not in build and "error" not in prep:
            rows[spec]["prepare_over_build_bytes"] = prep["peak_rss_bytes"] - build["peak_rss_bytes"]
        print(spec, rows[spec], flush=True)
    data = {"machine": machine(), "models": rows}
    js, md = write_results(args.output, data, markdown(data))
    print(f"wrote {js} and {md}")
    return 0


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# Peak memory of `layerfit prepare`",
        "",
        "| model | weights (MB) | build: peak RSS (MB) | prepare: peak RSS (MB) | prepare over build (MB) | prepare (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for spec, r in data["models"].items():
        b, p = r["build"], r["prepare"]
        if "error" in b or "error" in p:
            lines.append(f"| {spec} | failed: {b.get('error') or p.get('error')} | | | | |")
            continue
        lines.append(
            f"| {spec} | {mb(p['weights_bytes'])} | {mb(b['peak_rss_bytes'])} | {mb(p['peak_rss_bytes'])} | "
            f"{mb(r['prepare_over_build_bytes'])} | {p['seconds']:.1f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
