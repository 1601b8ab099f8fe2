"""layerfit vs Hugging Face Accelerate's disk offload, same model and input, one run.

Accelerate's documented big-model path for weights on disk: ``disk_offload(model,
offload_dir, execution_device=cpu)`` — weights live in memory-mapped files and a hook
per module moves them in before it runs. layerfit runs the same prepared weights with
the async pipeline. Each side runs in its own child process (own peak RSS, own memory
cgroup where possible); offload folders and prepared models are written beforehand so
neither side pays for building the model during measurement.

layerfit is reported at the smallest budget whose peak RSS is not above Accelerate's
(its minimum budget when that already is), and also at the largest such budget in the
sweep. Writes bench/results/vs_accelerate.{json,md}.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import machine, mb, prepared_zoo_model, run_child, write_results  # noqa: E402

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
    with load(args.dir, pipeline="async", budget=args.budget) as engine:
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
    sweep = []
    for b in budgets:
        r = run_child(__file__, ["--side", "layerfit", "--dir", str(prepared), "--budget", str(b), *common])
        r["budget_bytes"] = b
        sweep.append(r)
        print("layerfit", mb(b), "MB:", r.get("latency_s"), mb(r.get("rss_peak_bytes")), flush=True)
    fitting = [r for r in sweep if "rss_peak_bytes" in r and r["rss_peak_bytes"] <= acc.get("rss_peak_bytes", 0)]
    smallest = fitting[0] if fitting else None
    largest = fitting[-1] if fitting else None
    data = {
        "benchmark": "vs_accelerate",
        "machine": machine(),
        "model": args.model,
        "input_shape": list(shape),
        "accelerate": acc,
        "layerfit_sweep": sweep,
        "layerfit_smallest_fitting": smallest,
        "layerfit_largest_fitting": largest,
        "speedup_smallest": acc["latency_s"] / smallest["latency_s"] if smallest else None,
        "speedup_largest": acc["latency_s"] / largest["latency_s"] if largest else None,
        "same_output": bool(smallest and smallest["output_sha256"] == acc.get("output_sha256")),
    }
    lines = [
        f"# layerfit vs Accelerate disk offload: {args.model} {tuple(shape)}",
        "",
        "| system | budget (MB) | latency (median ms) | peak RSS (MB) | cgroup peak (MB) |",
        "|---|---|---|---|---|",
        f"| Accelerate disk_offload | - | {acc.get('latency_s', 0) * 1e3:.0f} | {mb(acc.get('rss_peak_bytes'))} | {mb(acc.get('cgroup_peak_bytes'))} |",
    ]
    for r in sweep:
        lines.append(
            f"| layerfit async | {mb(r['budget_bytes'])} | {r.get('latency_s', 0) * 1e3:.0f} | "
            f"{mb(r.get('rss_peak_bytes'))} | {mb(r.get('cgroup_peak_bytes'))} |"
        )
    lines += [
        "",
        "Speed-up at the smallest budget with RSS not above Accelerate's: "
        + (f"{data['speedup_smallest']:.2f}x" if smallest else "none fits"),
        "Speed-up at the largest such budget: " + (f"{data['speedup_largest']:.2f}x" if largest else "none fits"),
        f"Outputs identical: {data['same_output']}",
    ]
    write_results("vs_accelerate", data, "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
