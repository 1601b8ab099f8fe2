"""Reproduce Demand Layering's Table II on this machine.

For each model at the given resolution: memory and delay of Pre (all weights resident),
Seq, Sync, Async (at 2 x the largest layer) and Async-MD (minimal-delay search), each as
(weight-memory reduction %, delay overhead %) against Pre, plus the physical limit
``max(sum kernel, sum read) + first read`` measured on the same run. The sum of kernels
is Pre's delay (the paper's Eq. 1: Pre does nothing but kernels; it also counts the
operations between units, which own no weights), read times come from the Seq
timeline, where reads and kernels do not overlap. Every configuration runs in its own
child process (own peak RSS, own memory cgroup when one can be created). Writes bench/results/demand_layering.{json,md}.

    python bench/demand_layering.py                 # the five models at 608x608
    python bench/demand_layering.py --quick         # ResNet-152 and VGG-19 at 224
    python bench/demand_layering.py --resolution 416 --models resnet152,yolov3
    python bench/demand_layering.py --stages 3      # with the copy stage (--device cuda on a GPU)

Without a copy stage (two stages, the CPU default) the table is the paper's 2S rows under
the names of its pipelines; with ``--stages 3`` every streaming configuration holds a read
and a device buffer, as the paper's Seq/Sync/Async, and the physical limit includes the
copies: ``max(sum kernel, sum read, sum copy) + first read + first copy``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from model_setup import prepared_zoo_model  # noqa: E402
from processes import run_child  # noqa: E402
from reporting import machine, mb, progress, write_results  # noqa: E402

CACHE = Path(__file__).parent / ".cache"
MODELS = ["resnet152", "densenet201", "yolov3", "yolov4", "vgg19"]


def child(args: argparse.Namespace) -> None:
    """Measure one configuration; print one JSON line."""
    from layerfit.engine import load, measure
    from layerfit.store import example_input, read_manifest

    m = read_manifest(args.dir)
    budget = None
    if args.config == "async":
        budget = m.resident_bytes + 2 * m.largest_unit_bytes
    elif args.config == "async-md":
        budget = args.md_budget  # found by the paired search in the interleaved child
    pipeline = "async" if args.config.startswith("async") else args.config
    with load(args.dir, pipeline=pipeline, budget=budget, trace=True, **engine_options(args)) as engine:
        x = engine.device.to_device(example_input(m.input_shape, m.input_dtype, m.seed))
        _, report = measure(engine, (x,), repeats=args.repeats, warmup=1)
        tl = engine.last_timeline
        report["first_read_s"], report["first_copy_s"] = first_duration(tl, "read"), first_duration(tl, "copy")
        report["budget_bytes"] = engine.memory.weight_bytes
    report.pop("latencies_s", None)
    print(json.dumps(report))


def engine_options(args: argparse.Namespace) -> dict:
    """Where the engines of this run execute: ``--device`` and ``--stages``; the read-ahead
    across passes off, as in the paper: each inference's delay is its own, every read
    made after it starts (and engines run in turn here would read during each other's)."""
    return {"device": args.device, "stages": args.stages, "read_ahead": False}


def child_interleaved(args: argparse.Namespace) -> None:
    """Delay of every configuration against Pre, round-robin in one process; one JSON line.

    On a shared machine the speed drifts between (and within) child processes. Here every
    round runs all configurations back to back and each overhead is the median of the
    per-round ratios to Pre, with a bootstrap interval, so drift cancels. The Async-MD
    budget is found here as well, by the library's V-D search
    (:func:`layerfit.tradeoff.delay.minimal_delay_search`) with Pre as its reference: each
    point's delay is its fastest run over Pre's fastest, run alternately. The physical
    limit is paired too: each round's from that round's Pre delay and Seq reads (traced),
    so "vs limit" compares runs made seconds apart. Memory is not measured here
    (every engine is loaded at once); the isolated children measure it.
    """
    from reporting import StealMeter, paired_overhead

    from layerfit.engine import load
    from layerfit.store import example_input, read_manifest
    from layerfit.tradeoff.delay import minimal_delay_search

    m = read_manifest(args.dir)
    opts = engine_options(args)
    low = m.resident_bytes + 2 * m.largest_unit_bytes
    pre = load(args.dir, pipeline="preload", **opts)
    x = pre.device.to_device(example_input(m.input_shape, m.input_dtype, m.seed))
    pre(x)

    def timed(engine) -> float:
        t0 = time.perf_counter()
        engine(x)
        return time.perf_counter() - t0

    # Section V-D's two-phase search, each point measured alternately with Pre.
    with load(args.dir, pipeline="async", budget=low, **opts) as md_engine:
        md_engine(x)
        found = minimal_delay_search(
            md_engine, (x,), step=max(4096, int(m.total_bytes * args.md_step)),
            repeats=args.md_repeats, warmup=1, patience=args.md_patience,
            tolerance=args.md_tolerance, reference=pre,
        )
    curve = [
        {"budget_bytes": pt.budget_bytes, "overhead": pt.relative - 1, "median_s": pt.median_s}
        for pt in found.points
    ]
    md_budget = found.minimal.budget_bytes

    configs = {
        "preload": pre,
        "sequential": load(args.dir, pipeline="sequential", trace=True, **opts),
        "sync": load(args.dir, pipeline="sync", **opts),
        "async": load(args.dir, pipeline="async", budget=low, **opts),
        "async-md": load(args.dir, pipeline="async", budget=md_budget, **opts),
    }
    times: dict[str, list[float]] = {name: [] for name in configs}
    for engine in configs.values():
        engine(x)  # warm-up
    limits: list[float] = []
    meter = StealMeter()
    for _ in range(args.interleave_repeats):
        for name, engine in configs.items():
            times[name].append(timed(engine))
        seq = configs["sequential"].last_timeline
        limits.append(physical_limit(
            times["preload"][-1], seq.stage_total("read"), seq.stage_total("copy"),
            first_duration(seq, "read") + first_duration(seq, "copy"),
        ))
    quiet = meter.stop()
    out = {
        name: {"median_s": statistics.median(t), "all_s": t, "paired": paired_overhead(t, times["preload"]),
               "vs_limit": paired_overhead(t, limits)}
        for name, t in times.items()
    }
    print(json.dumps({**out, "physical_limit_s": statistics.median(limits), "md_budget_bytes": md_budget,
                      "md_curve": curve, "machine_state": quiet}))


def physical_limit(pre_s: float, sum_read: float, sum_copy: float, first: float) -> float:
    """``max(sum kernel, sum read, sum copy) + first read + first copy``: the sum of
    kernels is Pre's delay ``pre_s`` (Eq. 1); reads and copies come from Seq's timeline,
    where they do not overlap with kernels (``first``: its first read plus first copy)."""
    return max(pre_s, sum_read, sum_copy) + first


def first_duration(timeline, stage: str) -> float:
    """Seconds of the first ``stage`` event of ``timeline`` (0 if it has none)."""
    event = next((e for e in timeline.events if e.stage == stage), None)
    return 0.0 if event is None else event.end - event.start


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
    ap.add_argument("--md-repeats", type=int, default=3, help="paired rounds per MD search point")
    ap.add_argument("--md-tolerance", type=float, default=0.01, help="MD: within this fraction of the minimum")
    ap.add_argument("--output", default="demand_layering")
    ap.add_argument("--md-budget", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--interleave-repeats", type=int, default=15, help="round-robin rounds for the ratios")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--stages", type=int, default=None, help="2 (zero-copy, cpu default) or 3 (read, copy, kernel)")
    args = ap.parse_args()
    where = ["--device", args.device] + ([] if args.stages is None else ["--stages", str(args.stages)])
    if args.child:
        if args.config == "interleaved":
            child_interleaved(args)
        else:
            child(args)
        return
    if args.quick:
        args.models, args.resolution = "resnet152,vgg19", 224
    if args.stages == 3 and args.output == "demand_layering":
        args.output = "demand_layering_3stage"  # keep the two-stage table
    configs = ["preload", "sequential", "sync", "async", "async-md"]
    rows = []
    for name in progress(args.models.split(","), "demand layering: models"):
        directory = prepare_model(name, args.resolution)
        t0 = time.perf_counter()
        inter = run_child(
            __file__,
            ["--dir", str(directory), "--config", "interleaved", "--repeats", "1",
             "--interleave-repeats", str(args.interleave_repeats), "--md-step", str(args.md_step),
             "--md-patience", str(args.md_patience), "--md-repeats", str(args.md_repeats),
             "--md-tolerance", str(args.md_tolerance), *where],
        )
        if "error" in inter:
            raise SystemExit(f"{name} interleaved run failed: {inter['error']}")
        print(f"{name} interleaved ({time.perf_counter() - t0:.0f}s): " + ", ".join(
            f"{k} {v['paired']['median']:+.1%}" for k, v in inter.items() if isinstance(v, dict) and "paired" in v),
            f"MD {inter['md_budget_bytes'] / 1e6:.1f} MB", inter["machine_state"], flush=True)
        md_budget = inter["md_budget_bytes"]
        results = {}
        for config in configs:
            t0 = time.perf_counter()
            results[config] = run_child(
                __file__,
                ["--dir", str(directory), "--config", config, "--repeats", str(args.repeats),
                 "--md-budget", str(md_budget), *where],
            )
            print(f"{name} {config}: {time.perf_counter() - t0:.0f}s "
                  f"{results[config].get('latency_s', results[config].get('error'))}", flush=True)
        pre, seq = results["preload"], results["sequential"]
        sum_kernel = pre.get("latency_s", 0.0)  # Eq. 1: Pre's delay is the sum of its kernels
        sum_read, sum_copy = seq.get("read_s", 0.0), seq.get("copy_s", 0.0)
        limit = physical_limit(sum_kernel, sum_read, sum_copy, seq.get("first_read_s", 0.0) + seq.get("first_copy_s", 0.0))
        row = {"model": name, "resolution": args.resolution, "interleaved": inter, "sum_kernel_s": sum_kernel,
               "sum_read_s": sum_read, "sum_copy_s": sum_copy, "first_read_s": seq.get("first_read_s"),
               "first_copy_s": seq.get("first_copy_s"), "physical_limit_s": limit,
               "device": args.device, "stages": seq.get("stages"), "configs": {}}
        for config, r in results.items():
            if "error" in r:
                row["configs"][config] = r
                continue
            row["configs"][config] = {
                **r,
                "memory_reduction": 1 - r["weights_peak_bytes"] / pre["weights_peak_bytes"],
                "delay_overhead": r["latency_s"] / pre["latency_s"] - 1,
                "vs_physical_limit": r["latency_s"] / limit - 1 if limit else None,
            }
            if config in inter:
                row["configs"][config]["interleaved_overhead"] = inter[config]["paired"]["median"]
                row["configs"][config]["interleaved_overhead_ci90"] = [
                    inter[config]["paired"]["ci90_low"], inter[config]["paired"]["ci90_high"]]
        rows.append(row)
    data = {"benchmark": "demand_layering_table2", "machine": machine(), "rows": rows,
            "args": {k: v for k, v in vars(args).items() if k not in ("child", "dir", "config")}}
    write_results(args.output, data, markdown(rows))
    print(markdown(rows))


def markdown(rows: list[dict]) -> str:
    lines = [
        "# Demand Layering Table II on this machine",
        "",
        "Each configuration in its own child process: weight memory (engine ledger, MB) and delay",
        "(median, ms); in brackets (memory reduction %, delay overhead %) against Pre's child.",
        "RSS and cgroup peaks in MB. Delays of separate children drift with the machine's load;",
        "the paired table below is the one for overheads.",
        "Physical limit = max(sum kernel, sum read, sum copy) + first read + first copy (no copy",
        "with two stages); sum kernel = Pre's delay (Eq. 1). Pipeline: " + ", ".join(
            sorted({f"{r.get('stages') or 2} stages on {r.get('device', 'cpu')}" for r in rows})) + ".",
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
        "**Delay overhead against Pre, paired** (the numbers to trust on a shared machine):",
        "every round runs all configurations back to back in one process; the overhead is the",
        "median of the per-round ratios to Pre, [90 % bootstrap interval], and the ratio of the",
        "fastest runs (interference only slows a run, so the fastest show the undisturbed cost).",
        "Async-MD's budget is the paired minimal-delay search's (V-D); weight memory and",
        "reduction from the engine ledger. CPU steal = share of the VM's CPU time the",
        "hypervisor gave to others.",
        "",
        "| model | Seq | Sync | Async (memory) | Async-MD (memory) | best with >= 80 % reduction | Async, Async-MD vs paired physical limit | rounds | CPU steal |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        inter = row.get("interleaved", {})
        pre_bytes = row["configs"].get("preload", {}).get("weights_peak_bytes")

        def cell(c: str, inter: dict = inter, row: dict = row) -> str:
            if c not in inter:
                return "-"
            pr = inter[c]["paired"]
            text = f"{pr['median']:+.1%} [{pr['ci90_low']:+.1%}, {pr['ci90_high']:+.1%}] fastest {pr['min_ratio']:+.1%}"
            r = row["configs"].get(c, {})
            if c.startswith("async") and "weights_peak_bytes" in r:
                text += f" ({mb(r['weights_peak_bytes'])} MB, {-r['memory_reduction']:+.1%})"
            return text

        within = [pt for pt in inter.get("md_curve", []) if pre_bytes and pt["budget_bytes"] <= 0.2 * pre_bytes]
        best = min(within, key=lambda pt: pt["overhead"]) if within else None
        best_text = f"{best['overhead']:+.1%} at {mb(best['budget_bytes'])} MB" if best else "-"
        state = inter.get("machine_state", {})
        vs_limit = ", ".join(
            f"{inter[c]['vs_limit']['median']:+.1%}" for c in ("async", "async-md") if "vs_limit" in inter.get(c, {})
        )
        if "physical_limit_s" in inter:
            vs_limit += f" (limit {inter['physical_limit_s'] * 1e3:.0f} ms)"
        lines.append(
            f"| {row['model']} | " + " | ".join(cell(c) for c in ("sequential", "sync", "async", "async-md"))
            + f" | {best_text} | {vs_limit or '-'} | {inter.get('preload', {}).get('paired', {}).get('rounds', '-')}"
            + f" | {state.get('steal_share', 0):.1%} |"
        )
    lines += ["", "Minimal-delay search curves (budget MB: overhead, fastest of the point's runs vs Pre's):", ""]
    for row in rows:
        curve = row.get("interleaved", {}).get("md_curve", [])
        lines.append(f"- {row['model']}: " + ", ".join(f"{mb(pt['budget_bytes'])}: {pt['overhead']:+.1%}" for pt in curve))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
