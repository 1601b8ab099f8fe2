"""What one task covers in the memory-aware runtime: a lone request's latency by granularity.

``layerfit.Runtime`` (and with it ``layerfit serve`` and ``schedule run``) schedules one
load, one execute and one unload task per unit. With ``units="layers"`` (the thesis's
granularity) a model's many small layers (batch norms, depthwise convolutions, biases)
are each one direct-I/O read and three tasks. ``units="merge:SIZE"`` joins consecutive
layers into blocks of at most SIZE bytes. This bench measures, per model, what that
buys and costs:

- the median latency of a lone request (submit to result) through the runtime, at a
  loose budget (4 x the weights) and at a tight one (the model's minimum at layer
  granularity, where a coarser setting may not fit), next to the same model run with
  every weight resident (``preload``, the plain-PyTorch speed) and streamed by the engine's
  own async pipeline at the loose budget;
- the number of units and the minimum budget (init + largest unit) per setting.

- requests per second when ``--concurrent`` requests are in flight at once.

Run it again with ``OMP_NUM_THREADS=1`` (``--output runtime_units_1thread``) to see what
PyTorch's intra-op threads cost the runtime on a small machine: every network runs on its
own thread, and each such thread gets its own OpenMP team.

Settings are measured in alternating rounds in one process (each round runs every setting
back to back), so slow drift of a shared machine affects them alike. Nothing asserts a
timing. Writes ``bench/results/runtime_units.{json,md}``::

    .venv/bin/python bench/runtime_units.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_setup import prepared_zoo_model  # noqa: E402
from reporting import machine, mb, write_results  # noqa: E402

CACHE = Path(__file__).parent / ".cache" / "runtime_units"
DEFAULT_MODELS = "mobilenet_v2,resnet50,deeplab_v3,blazeface"
DEFAULT_UNITS = "layers,merge:auto,merge:256kB,merge:1MB,merge:4MB"


def timed(call: Any, count: int) -> list[float]:
    out = []
    for _ in range(count):
        t0 = time.perf_counter()
        call()
        out.append(time.perf_counter() - t0)
    return out


def measure_model(name: str, args: argparse.Namespace, units: list[str]) -> dict[str, Any]:
    import layerfit
    from layerfit import zoo
    from layerfit.schedule.runtime.executor import Runtime
    from layerfit.store import example_input, read_manifest

    repository = CACHE / name  # a repository of this one model, at its default input size
    directory = prepared_zoo_model(name, zoo.get(name).input_shape[-1], repository)
    model = directory.name  # the runtime's name for it
    manifest = read_manifest(directory)
    x = example_input(manifest.input_shape, manifest.input_dtype, seed=1)
    weights = manifest.total_bytes
    loose = 4 * weights
    runtimes: dict[tuple[str, str], Runtime] = {}
    samples: dict[str, list[float]] = {}
    rows: dict[str, dict[str, Any]] = {}
    engines = {
        "preload": layerfit.load(directory, pipeline="preload"),
        "engine async": layerfit.load(directory, pipeline="async", budget=loose),
    }
    try:
        reference = engines["preload"](x)
        for setting in units:
            rt = Runtime(repository, loose, workers=args.workers, policy=args.policy, units=setting)
            runtimes[(setting, "loose")] = rt
            profile = rt.models[model].profile
            rows[setting] = {"units": len(profile.layers), "min_budget_bytes": profile.min_budget}
        tight = rows[units[0]]["min_budget_bytes"]
        for setting in units:
            if rows[setting]["min_budget_bytes"] <= tight:
                runtimes[(setting, "tight")] = Runtime(
                    repository, tight, workers=args.workers, policy=args.policy, units=setting
                )
        for (setting, budget), rt in runtimes.items():  # warm up; check the output once
            y = rt.infer(model, x).result(120)
            if not bool((y == reference).all()):
                raise SystemExit(f"{name} {setting} {budget}: the output differs from the preloaded model's")
            rt.infer(model, x).result(120)
        for engine in engines.values():
            engine(x)
        for _ in range(args.rounds):
            for label, engine in engines.items():
                samples.setdefault(label, []).extend(timed(lambda e=engine: e(x), args.requests))
            for (setting, budget), rt in runtimes.items():
                samples.setdefault(f"{setting} {budget}", []).extend(
                    timed(lambda r=rt: r.infer(model, x).result(120), args.requests)
                )
                if budget == "loose":  # a wave of concurrent requests: how many per second
                    wave = timed(lambda r=rt: [f.result(120) for f in [r.infer(model, x) for _ in range(args.concurrent)]], 1)
                    samples.setdefault(f"{setting} wave", []).append(args.concurrent / wave[0])
        progress = {f"{s} {b}": rt.stats()["progress_rule_fired"] for (s, b), rt in runtimes.items()}
    finally:
        for rt in runtimes.values():
            rt.shutdown()
        for engine in engines.values():
            engine.close()
    median = {k: statistics.median(v) for k, v in samples.items()}
    for setting, row in rows.items():
        for budget in ("loose", "tight"):
            key = f"{setting} {budget}"
            row[f"{budget}_median_s"] = median.get(key)
            row[f"{budget}_progress_rule_fired"] = progress.get(key)
        row["concurrent_per_s"] = median[f"{setting} wave"]
        row["loose_over_layers"] = median[f"{setting} loose"] / median[f"{units[0]} loose"]
        row["loose_over_preload"] = median[f"{setting} loose"] / median["preload"]
    return {
        "weights_bytes": weights,
        "stored_layers": len(manifest.units),
        "loose_budget_bytes": loose,
        "tight_budget_bytes": tight,
        "preload_median_s": median["preload"],
        "engine_async_median_s": median["engine async"],
        "settings": rows,
    }


def markdown(data: dict[str, Any]) -> str:
    m = data["machine"]
    lines = [
        "# Runtime granularity: a lone request's latency by `units`",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, load average at start "
        f"{', '.join(f'{v:.1f}' for v in m['load_average_at_start'])}. Policy {data['policy']}, "
        f"{data['workers']} workers, each model at its default input size. Median of "
        f"{data['rounds']} alternating rounds x {data['requests']} requests, submit to result, in ms. "
        "*Loose*: budget 4 x the weights. *Tight*: the model's minimum budget at layer granularity "
        "(a setting whose own minimum is larger is not run there). Every output was checked "
        "against the preloaded model's, bit for bit. Throughput: waves of concurrent requests at the "
        f"loose budget, median over the rounds. Torch intra-op threads: {m['torch_threads']} "
        f"(OMP_NUM_THREADS={data['torch_threads_env']['OMP_NUM_THREADS'] or 'unset'}). The preloaded and "
        "async references run in this same process, beside the runtimes' threads: with more than one "
        "intra-op thread they are slowed by the same OpenMP oversubscription (see the README), so "
        "*vs preload* understates what a model costs preloaded in a process of its own.",
        "",
    ]
    for name, r in data["models"].items():
        lines += [
            f"## {name}",
            "",
            f"{r['stored_layers']} stored layers, {mb(r['weights_bytes'])} MB of weights. Preloaded "
            f"(every weight resident): {r['preload_median_s'] * 1e3:.1f} ms; the engine's async "
            f"pipeline at the loose budget: {r['engine_async_median_s'] * 1e3:.1f} ms.",
            "",
            "| units | tasks' units | min budget MB | loose ms | vs layers | vs preload | "
            f"tight ({mb(r['tight_budget_bytes'])} MB) ms | {data['concurrent']} at once, per s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for setting, s in r["settings"].items():
            tight = "does not fit" if s["tight_median_s"] is None else f"{s['tight_median_s'] * 1e3:.1f}"
            lines.append(
                f"| {setting} | {s['units']} | {mb(s['min_budget_bytes'])} | {s['loose_median_s'] * 1e3:.1f} | "
                f"{s['loose_over_layers']:.2f} | {s['loose_over_preload']:.2f} | {tight} | {s['concurrent_per_s']:.1f} |"
            )
        lines.append("")
    lines.append(f"Wall time {data['wall_s']:.0f} s.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=DEFAULT_MODELS)
    p.add_argument("--units", default=DEFAULT_UNITS, help="settings to compare; the first is the reference")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=5, help="lone requests per setting and round")
    p.add_argument("--concurrent", type=int, default=4, help="requests per wave for the throughput column")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--policy", default="masa-fair")
    p.add_argument("--output", default="runtime_units")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    data: dict[str, Any] = {
        "machine": machine(), "policy": args.policy, "workers": args.workers,
        "rounds": args.rounds, "requests": args.requests, "concurrent": args.concurrent,
        "torch_threads_env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}, "models": {},
    }
    units = args.units.split(",")
    for name in args.models.split(","):
        data["models"][name] = measure_model(name, args, units)
        print(f"{name}: " + ", ".join(
            f"{k} {v['loose_median_s'] * 1e3:.1f} ms" for k, v in data["models"][name]["settings"].items()
        ), flush=True)
    data["wall_s"] = time.perf_counter() - t0
    js, md = write_results(args.output, data, markdown(data))
    print(f"wrote {js} and {md}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
