"""layerfit vs Hugging Face Accelerate's disk offload, same model and input, one run.

Accelerate's documented big-model path for weights on disk: ``disk_offload(model,
offload_dir, execution_device=cpu)`` — weights live in memory-mapped files and a hook
per module moves them in before it runs. layerfit runs the same prepared weights with
the async pipeline (the paper's) and with ``auto`` (``layerfit run``'s default, which
keeps what the budget holds beyond async's buffer resident). Each side runs in its own child process (own peak RSS, own memory
cgroup where possible); offload folders and prepared models are written beforehand so
neither side pays for building the model during measurement.

Each layerfit pipeline is reported at the smallest budget whose peak RSS is not above
Accelerate's (its minimum budget when that already is), and also at the largest such
budget in the sweep. Writes bench/results/vs_accelerate.{json,md}.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from model_setup import prepared_zoo_model  # noqa: E402
from processes import run_child  # noqa: E402
from reporting import machine, mb, write_results  # noqa: E402

CACHE = Path(__file__).parent / ".cache"


def child_accelerate(args: argparse.Namespace) -> dict:
    import torch
    from accelerate import disk_offload

    from layerfit.engine.osmem import peak_rss_bytes, reset_peak_rss
    from layerfit.store import example_input
    from layerfit.zoo import get

    entry = get(args.model)
    shape = (*entry.input_shape[:-2], args.resolution, args.resolution)
    with torch.device("meta"):
        model = entry.factory(**entry.kwargs).eval()
    model = disk_offload(model, args.offload_dir, execution_device=torch.device("cpu"), offload_buffers=True)
    x = example_input(shape)
    with torch.no_grad():
        model(x)  # warm-up
        gc.collect()
        reset_peak_rss()
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            y = model(x)
            times.append(time.perf_counter() - t0)
    from layerfit.engine import output_digest

    return {"latency_s": statistics.median(times), "latencies_s": times, "rss_peak_bytes": peak_rss_bytes(),
            "output_sha256": output_digest(y)}


def child_layerfit(args: argparse.Namespace) -> dict:
    from layerfit.engine import load, measure
    from layerfit.store import example_input, read_manifest

    m = read_manifest(args.dir)
    x = example_input(m.input_shape, m.input_dtype, m.seed)
    with load(args.dir, pipeline=args.pipeline, budget=args.budget) as engine:
        _, report = measure(engine, (x,), repeats=args.repeats, warmup=1)
    return report


def offload_folder(model: str, resolution: int) -> Path:
    """Accelerate's offload folder for the zoo model's seeded weights (written once)."""
    from accelerate.utils import offload_state_dict

    from layerfit.zoo import build

    out = CACHE / f"accelerate-{model}"
    if not (out / "index.json").is_file():
        state = {k: v.contiguous() for k, v in build(model).state_dict().items()}
        offload_state_dict(str(out), state)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--side")
    ap.add_argument("--dir")
    ap.add_argument("--offload-dir")
    ap.add_argument("--budget", type=int)
    ap.add_argument("--model", default="resnet152")
    ap.add_argument("--resolution", type=int, default=224)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--budgets", type=int, default=6, help="budgets in the layerfit sweep")
    ap.add_argument("--pipeline", help=argparse.SUPPRESS)
    ap.add_argument("--pipelines", default="async,auto", help="layerfit pipelines to sweep")
    args = ap.parse_args()
    if args.child:
        result = child_accelerate(args) if args.side == "accelerate" else child_layerfit(args)
        print(json.dumps(result))
        return

    import importlib.util

    if importlib.util.find_spec("accelerate") is None:
        sys.exit("this benchmark needs Hugging Face Accelerate: .venv/bin/pip install -e '.[bench]'")

    from layerfit.store import read_manifest
    from layerfit.zoo import get

    entry = get(args.model)
    shape = (*entry.input_shape[:-2], args.resolution, args.resolution)
    prepared = prepared_zoo_model(args.model, args.resolution, CACHE)
    offload = offload_folder(args.model, args.resolution)
    common = ["--model", args.model, "--resolution", str(args.resolution), "--repeats", str(args.repeats)]

    acc = run_child(__file__, ["--side", "accelerate", "--offload-dir", str(offload), *common])
    print("accelerate:", acc, flush=True)
    m = read_manifest(prepared)
    low = m.resident_bytes + 2 * m.largest_unit_bytes
    high = m.resident_bytes + m.total_bytes
    budgets = sorted({int(low + (high - low) * i / max(1, args.budgets - 1)) for i in range(args.budgets)})
    pipelines = args.pipelines.split(",")
    sweep = []
    for b in budgets:
        for pipeline in pipelines:
            r = run_child(
                __file__, ["--side", "layerfit", "--dir", str(prepared), "--budget", str(b), "--pipeline", pipeline, *common]
            )
            r["budget_bytes"], r["pipeline_requested"] = b, pipeline
            sweep.append(r)
            print("layerfit", pipeline, mb(b), "MB:", r.get("latency_s"), mb(r.get("rss_peak_bytes")), flush=True)
    by_pipeline = {}
    for pipeline in pipelines:
        fitting = [
            r for r in sweep
            if r["pipeline_requested"] == pipeline and r.get("rss_peak_bytes", math.inf) <= acc.get("rss_peak_bytes", 0)
        ]
        smallest, largest = (fitting[0], fitting[-1]) if fitting else (None, None)
        by_pipeline[pipeline] = {
            "smallest_fitting": smallest,
            "largest_fitting": largest,
            "speedup_smallest": acc["latency_s"] / smallest["latency_s"] if smallest else None,
            "speedup_largest": acc["latency_s"] / largest["latency_s"] if largest else None,
            "same_output": bool(smallest and smallest["output_sha256"] == acc.get("output_sha256")),
        }
    from importlib.metadata import version

    data = {
        "benchmark": "vs_accelerate",
        "machine": machine(),
        "accelerate_version": version("accelerate"),
        "model": args.model,
        "input_shape": list(shape),
        "accelerate": acc,
        "layerfit_sweep": sweep,
        "by_pipeline": by_pipeline,
    }
    lines = [
        f"# layerfit vs Accelerate disk offload: {args.model} {tuple(shape)}",
        "",
        f"Accelerate {data['accelerate_version']}; one child process per row, its median of "
        f"{args.repeats} inferences (single runs: rows differ by the machine's noise too).",
        "",
        "| system | budget (MB) | latency (median ms) | peak RSS (MB) | cgroup peak (MB) |",
        "|---|---|---|---|---|",
        f"| Accelerate disk_offload | - | {acc.get('latency_s', 0) * 1e3:.0f} | {mb(acc.get('rss_peak_bytes'))} | {mb(acc.get('cgroup_peak_bytes'))} |",
    ]
    for r in sweep:
        ran = r.get("pipeline", "?")
        label = r["pipeline_requested"] if ran == r["pipeline_requested"] else f"{r['pipeline_requested']} ({ran})"
        lines.append(
            f"| layerfit {label} | {mb(r['budget_bytes'])} | {r.get('latency_s', 0) * 1e3:.0f} | "
            f"{mb(r.get('rss_peak_bytes'))} | {mb(r.get('cgroup_peak_bytes'))} |"
        )
    lines.append("")
    for pipeline, fit in by_pipeline.items():
        lines.append(
            f"layerfit {pipeline}: speed-up at the smallest budget with RSS not above Accelerate's "
            + (f"{fit['speedup_smallest']:.2f}x" if fit["smallest_fitting"] else "none fits")
            + ", at the largest such budget "
            + (f"{fit['speedup_largest']:.2f}x" if fit["largest_fitting"] else "none fits")
            + f"; outputs identical: {fit['same_output']}"
        )
    write_results("vs_accelerate", data, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
