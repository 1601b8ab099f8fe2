"""Reproduce Demand Layering's Table II on this machine.

For each model at the given resolution: memory and delay of Pre (all weights resident),
Seq, Sync, Async (at 2 x the largest layer) and Async-MD (minimal-delay search), each as
(weight-memory reduction %, delay overhead %) against Pre, plus the physical limit
``max(sum kernel, sum read) + first read`` measured on the same run (kernel times from
the Pre timeline, read times from the Seq timeline, where reads and kernels do not
overlap). Every configuration runs in its own child process (own peak RSS, own memory
cgroup when one can be created). Writes bench/results/demand_layering.{json,md}.

    python bench/demand_layering.py                 # the five models at 608x608
    python bench/demand_layering.py --quick         # ResNet-152 and VGG-19 at 224
    python bench/demand_layering.py --resolution 416 --models resnet152,yolov3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import machine, mb, prepared_zoo_model, run_child, write_results  # noqa: E402

CACHE = Path(__file__).parent / ".cache"
MODELS = ["resnet152", "densenet201", "yolov3", "yolov4", "vgg19"]


def child(args: argparse.Namespace) -> None:
    """Measure one configuration; print one JSON line."""
    from layerfit.engine import load, measure
    from layerfit.store import example_input, read_manifest
    from layerfit.tradeoff.delay import minimal_delay_search

    m = read_manifest(args.dir)
    x = example_input(m.input_shape, m.input_dtype, m.seed)
    extra = {}
    budget = None
    if args.config in ("async", "async-md"):
        budget = m.resident_bytes + 2 * m.largest_unit_bytes
    pipeline = "async" if args.config.startswith("async") else args.config
    with load(args.dir, pipeline=pipeline, budget=budget, trace=True) as engine:
        if args.config == "async-md":
            step = max(4096, int(m.total_bytes * args.md_step))
            t0 = time.perf_counter()
            curve = minimal_delay_search(engine, (x,), step=step, repeats=args.md_repeats, warmup=1, patience=args.md_patience)
            extra["md_search_s"] = time.perf_counter() - t0
            extra["md_curve"] = [(p.budget_bytes, p.mean_s) for p in curve.points]
            engine.reconfigure(budget=curve.minimal.budget_bytes)
        _, report = measure(engine, (x,), repeats=args.repeats, warmup=1)
        tl = engine.last_timeline
        reads = [e for e in tl.events if e.stage == "read"]
        report["first_read_s"] = reads[0].end - reads[0].start if reads else 0.0
        report["kernel_times_s"] = [e.end - e.start for e in tl.events if e.stage == "kernel"]
        report["budget_bytes"] = engine.memory.resident_bytes + engine.memory.buffer_bytes
    report.update(extra)
    report.pop("latencies_s", None)
    print(json.dumps(report))


def child_interleaved(args: argparse.Namespace) -> None:
    """Latency of every configuration, round-robin in one process; one JSON line.

    On a shared machine load drifts between child processes; running the configurations
    in turn, repeat after repeat, exposes them all to the same drift, so their ratios
    hold even when absolute times move. Memory is not measured here (every engine is
    loaded at once); the isolated children measure it.
    """
    from layerfit.engine import load
    from layerfit.store import example_input, read_manifest

    m = read_manifest(args.dir)
    x = example_input(m.input_shape, m.input_dtype, m.seed)
    low = m.resident_bytes + 2 * m.largest_unit_bytes
    configs = {
        "preload": ("preload", None),
        "sequential": ("sequential", None),
        "sync": ("sync", None),
        "async": ("async", low),
        "async-md": ("async", args.md_budget),
    }
    engines = {name: load(args.dir, pipeline=p, budget=b) for name, (p, b) in configs.items() if b or p != "async"}
    times: dict[str, list[float]] = {name: [] for name in engines}
    for engine in engines.values():
        engine(x)  # warm-up
    for _ in range(args.repeats):
        for name, engine in engines.items():
            t0 = time.perf_counter()
            engine(x)
            times[name].append(time.perf_counter() - t0)
    print(json.dumps({name: {"median_s": statistics.median(t), "all_s": t} for name, t in times.items()}))


def prepare_model(name: str, resolution: int) -> Path:
    return prepared_zoo_model(name, resolution, CACHE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dir")
    ap.add_argument("--config")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--resolution", type=int, default=608)
    ap.add_argument("--quick", action="store_true", help="ResNet-152 and VGG-19 at 224x224")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--md-step", type=float, default=0.04, help="MD search step as a fraction of model size")
    ap.add_argument("--md-patience", type=int, default=4)
    ap.add_argument("--md-repeats", type=int, default=2)
    ap.add_argument("--output", default="demand_layering")
    ap.add_argument("--md-budget", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--interleave-repeats", type=int, default=5, help="round-robin repeats for the ratios")
    args = ap.parse_args()
    if args.child:
        if args.config == "interleaved":
            child_interleaved(args)
        else:
            child(args)
        return
    if args.quick:
        args.models, args.resolution = "resnet152,vgg19", 224
    configs = ["preload", "sequential", "sync", "async", "async-md"]
    rows = []
    for name in args.models.split(","):
        directory = prepare_model(name, args.resolution)
        results = {}
        for config in configs:
            t0 = time.perf_counter()
            results[config] = run_child(
                __file__,
                ["--dir", str(directory), "--config", config, "--repeats", str(args.repeats),
                 "--md-step", str(args.md_step), "--md-patience", str(args.md_patience),
                 "--md-repeats", str(args.md_repeats)],
            )
            print(f"{name} {config}: {time.perf_counter() - t0:.0f}s "
                  f"{results[config].get('latency_s', results[config].get('error'))}", flush=True)
        md_budget = results["async-md"].get("budget_bytes", 0)
        inter = run_child(
            __file__,
            ["--dir", str(directory), "--config", "interleaved", "--repeats", str(args.interleave_repeats),
             "--md-budget", str(md_budget)],
        )
        print(f"{name} interleaved: " + ", ".join(
            f"{k} {v['median_s']:.3f}" for k, v in inter.items() if isinstance(v, dict)), flush=True)
        pre, seq = results["preload"], results["sequential"]
        sum_kernel = sum(pre.get("kernel_times_s", []))
        sum_read = seq.get("read_s", 0.0)
        limit = max(sum_kernel, sum_read) + seq.get("first_read_s", 0.0)
        row = {"model": name, "resolution": args.resolution, "interleaved": inter, "sum_kernel_s": sum_kernel,
               "sum_read_s": sum_read, "first_read_s": seq.get("first_read_s"), "physical_limit_s": limit,
               "configs": {}}
        for config, r in results.items():
            if "error" in r:
                row["configs"][config] = r
                continue
            r.pop("kernel_times_s", None)
            row["configs"][config] = {
                **r,
                "memory_reduction": 1 - r["weights_peak_bytes"] / pre["weights_peak_bytes"],
                "delay_overhead": r["latency_s"] / pre["latency_s"] - 1,
                "vs_physical_limit": r["latency_s"] / limit - 1 if limit else None,
            }
            if config in inter and "preload" in inter:
                ratio = inter[config]["median_s"] / inter["preload"]["median_s"]
                row["configs"][config]["interleaved_overhead"] = ratio - 1
        rows.append(row)
    data = {"benchmark": "demand_layering_table2", "machine": machine(), "rows": rows,
            "args": {k: v for k, v in vars(args).items() if k not in ("child", "dir", "config")}}
    write_results(args.output, data, markdown(rows))
    print(markdown(rows))


def markdown(rows: list[dict]) -> str:
    lines = [
        "# Demand Layering Table II on this machine",
        "",
        "Weight memory (engine ledger, MB) and delay (median, ms) per configuration; in brackets",
        "(memory reduction %, delay overhead %) against Pre. RSS and cgroup peaks in MB.",
        "Physical limit = max(sum kernel, sum read) + first read.",
        "",
        "| model | res | Pre | Seq | Sync | Async | Async-MD | physical limit | Async vs limit | Async-MD vs limit |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cells = []
        for config in ("preload", "sequential", "sync", "async", "async-md"):
            r = row["configs"].get(config, {})
            if "latency_s" not in r:
                cells.append("error")
                continue
            cells.append(
                f"{mb(r['weights_peak_bytes'])} MB / {r['latency_s'] * 1e3:.0f} ms "
                f"({-r['memory_reduction']:+.1%}, {r['delay_overhead']:+.1%}) "
                f"RSS {mb(r['rss_peak_bytes'])} cg {mb(r.get('cgroup_peak_bytes'))}"
            )
        a, md = row["configs"].get("async", {}), row["configs"].get("async-md", {})
        lines.append(
            f"| {row['model']} | {row['resolution']} | " + " | ".join(cells)
            + f" | {row['physical_limit_s'] * 1e3:.0f} ms | "
            + (f"{a['vs_physical_limit']:+.1%}" if a.get("vs_physical_limit") is not None else "-") + " | "
            + (f"{md['vs_physical_limit']:+.1%}" if md.get("vs_physical_limit") is not None else "-") + " |"
        )
    lines += [
        "",
        "Delay overhead against Pre measured round-robin in one process (same load drift for",
        "every configuration; medians of the interleaved repeats):",
        "",
        "| model | Seq | Sync | Async | Async-MD |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        inter = row.get("interleaved", {})
        pre = inter.get("preload", {}).get("median_s")
        cells = [
            f"{inter[c]['median_s'] / pre - 1:+.1%}" if pre and c in inter else "-"
            for c in ("sequential", "sync", "async", "async-md")
        ]
        lines.append(f"| {row['model']} | " + " | ".join(cells) + " |")
    medians = [row["configs"]["async"]["delay_overhead"] for row in rows if "delay_overhead" in row["configs"].get("async", {})]
    if medians:
        lines += ["", f"Median Async overhead across models (separate children): {statistics.median(medians):+.1%}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
