"""What pipeline ``auto`` buys over ``async`` at budgets between a model's minimum and its weights.

``async`` streams every unit on every inference, however large its buffer: once the
buffer overlaps reading with computing, more budget buys nothing. ``auto`` (the default of
``layerfit run``) keeps every weight resident when the budget holds them all, and below
that spends the room beyond async's buffer on keeping units resident
(:func:`layerfit.engine.policies.choose_kept_units`): each unit kept is one read fewer per
inference. This bench measures, per model and budget (a fraction of the weights), the
median latency of ``preload`` (every weight resident, the plain-PyTorch speed), ``async``
and ``auto`` in alternating rounds in one process (each round runs the three back to back,
each on a fresh engine), the units ``auto`` keeps, and the weights each holds at its peak,
which the budget bounds. Outputs are checked bit for bit against ``preload``'s. Nothing
asserts a timing. With ``--storage sd`` every read goes through a throttle that plays a
Raspberry Pi 4's microSD card (root), and each timed inference starts with the throttle
settled. Writes ``bench/results/auto_pipeline.{json,md}``::

    .venv/bin/python bench/auto_pipeline.py
    .venv/bin/python bench/auto_pipeline.py --storage sd --models blazeface,mobilenet_v2,deeplab_v3 \
        --passes 3 --rounds 2 --output auto_pipeline_sd
    .venv/bin/python bench/auto_pipeline.py --stages 3 --output auto_pipeline_3stage

``--stages 3`` runs the copy stage on CPU (a real copy into a second host buffer, see
:mod:`layerfit.engine.device`): the scheduling a GPU gets, without the GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_setup import prepared_zoo_model  # noqa: E402
from reporting import machine, mb, paired_overhead, progress, write_results  # noqa: E402
from storage import Storage  # noqa: E402

CACHE = Path(__file__).parent / ".cache" / "auto_pipeline"
DEFAULT_MODELS = "blazeface,mobilenet_v2,resnet50,deeplab_v3,resnet152@224"
DEFAULT_FRACTIONS = "0.2,0.4,0.6,0.8,0.95"


def one_engine(directory: Path, x: Any, expected: Any, passes: int, storage: Storage, **options: Any) -> dict[str, Any]:
    """Median latency of ``passes`` inferences (after one warm-up) on a fresh engine."""
    import torch

    from layerfit.engine import load

    with load(directory, **options) as engine:
        out = engine(x)
        times, peak = [], 0
        for _ in range(passes):
            storage.settle()  # the throttle must not credit this inference with idle time
            t0 = time.perf_counter()
            out = engine(x)
            times.append(time.perf_counter() - t0)
            peak = max(peak, engine.last_weights_peak)
        return {
            "median_s": statistics.median(times),
            "policy": engine.policy.name,
            "kept_units": len(engine.kept_units),
            "kept_bytes": engine.memory.kept_bytes,
            "buffer_bytes": engine.memory.buffer_bytes,
            "weights_peak_bytes": peak,
            "bit_identical": expected is None or bool(torch.equal(out, expected)),
            "output": out,
        }


def measure_model(spec: str, args: argparse.Namespace, storage: Storage) -> dict[str, Any]:
    """``spec`` is a zoo model, at its own input size or at ``NAME@SIZE`` pixels."""
    from layerfit import zoo
    from layerfit.store import example_input, read_manifest

    name, _, size = spec.partition("@")
    directory = prepared_zoo_model(name, int(size) if size else zoo.get(name).input_shape[-1], CACHE)
    m = read_manifest(directory)
    x = example_input(m.input_shape, m.input_dtype, m.seed)
    expected = one_engine(directory, x, None, 1, storage, pipeline="preload")["output"]
    weights = m.resident_bytes + m.total_bytes
    minimum = m.resident_bytes + (args.stages - 1) * m.largest_unit_bytes
    result: dict[str, Any] = {
        "weights_bytes": weights, "minimum_budget_bytes": minimum, "units": len(m.units), "budgets": []
    }
    for fraction in progress([float(f) for f in args.fractions.split(",")], f"auto pipeline {name}: budgets"):
        budget = int(fraction * weights)
        if budget < minimum:
            result["budgets"].append({"fraction": fraction, "budget_bytes": budget, "skipped": "below the minimum"})
            continue
        rows: dict[str, list[dict[str, Any]]] = {"preload": [], "async": [], "auto": []}
        for _ in range(args.rounds):
            rows["preload"].append(
                one_engine(directory, x, expected, args.passes, storage, pipeline="preload", stages=args.stages)
            )
            for pipeline in ("async", "auto"):
                rows[pipeline].append(one_engine(
                    directory, x, expected, args.passes, storage, pipeline=pipeline, budget=budget, stages=args.stages
                ))
        entry: dict[str, Any] = {"fraction": fraction, "budget_bytes": budget}
        for pipeline, runs in rows.items():
            entry[pipeline] = {
                "median_s": statistics.median(r["median_s"] for r in runs),
                "rounds_s": [r["median_s"] for r in runs],
                "policy": runs[0]["policy"],
                "kept_units": runs[0]["kept_units"],
                "kept_bytes": runs[0]["kept_bytes"],
                "buffer_bytes": runs[0]["buffer_bytes"],
                "weights_peak_bytes": max(r["weights_peak_bytes"] for r in runs),
                "bit_identical": all(r["bit_identical"] for r in runs),
            }
        pre = entry["preload"]["rounds_s"]
        for pipeline in ("async", "auto"):
            entry[pipeline]["over_preload"] = paired_overhead(entry[pipeline]["rounds_s"], pre)
            entry[pipeline]["within_budget"] = entry[pipeline]["weights_peak_bytes"] <= budget
        entry["auto_vs_async"] = paired_overhead(entry["auto"]["rounds_s"], entry["async"]["rounds_s"])
        result["budgets"].append(entry)
        print(
            f"{spec} at {fraction:.2f} of the weights ({mb(budget)} MB): preload "
            f"{entry['preload']['median_s'] * 1e3:.1f} ms, async {entry['async']['median_s'] * 1e3:.1f} ms, "
            f"auto {entry['auto']['median_s'] * 1e3:.1f} ms ({entry['auto']['policy']}, "
            f"{entry['auto']['kept_units']} units kept, {mb(entry['auto']['kept_bytes'])} MB)",
            flush=True,
        )
    return result


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# Pipeline auto against async, by budget",
        "",
        f"Machine: {data['machine']['cores']} cores, torch {data['machine']['torch']}, "
        f"{data['machine']['torch_threads']} threads, {data['stages']} stages, storage {data['storage']['kind']}"
        + (f" (throttled to {data['storage']['read_bps'] / 1e6:.1f} MB/s, {data['storage']['read_iops']} reads/s)"
           if data["storage"]["kind"] == "sd" else "")
        + f". {data['rounds']} alternating rounds of "
        f"{data['passes']} inferences per pipeline (medians of the round medians); overheads are "
        "the median of per-round ratios.",
        "",
        "| model | budget (of weights) | preload ms | async ms | auto ms | auto vs async | auto over preload "
        "| units kept (MB) | weights peak async / auto MB | bit-identical |",
        "|---|---|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for name, model in data["models"].items():
        for b in model["budgets"]:
            if "skipped" in b:
                lines.append(f"| {name} | {mb(b['budget_bytes'])} MB ({b['fraction']:.0%}) | | | | | | {b['skipped']} | | |")
                continue
            a, u = b["async"], b["auto"]
            lines.append(
                f"| {name} | {mb(b['budget_bytes'])} MB ({b['fraction']:.0%}) | {b['preload']['median_s'] * 1e3:.1f} "
                f"| {a['median_s'] * 1e3:.1f} | {u['median_s'] * 1e3:.1f} | {b['auto_vs_async']['median']:+.1%} "
                f"| {u['over_preload']['median']:+.1%} | {u['kept_units']} of {model['units']} ({mb(u['kept_bytes'])}) "
                f"| {mb(a['weights_peak_bytes'])} / {mb(u['weights_peak_bytes'])} "
                f"| {a['bit_identical'] and u['bit_identical']} |"
            )
    lines += ["", f"Wall time {data['wall_s']:.0f} s."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=DEFAULT_MODELS, help="zoo models, each at its own input size or NAME@SIZE")
    p.add_argument("--fractions", default=DEFAULT_FRACTIONS, help="budgets as fractions of each model's weights")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--passes", type=int, default=10, help="inferences per pipeline and round")
    p.add_argument("--storage", default="vm", help="vm: this machine's disk as it is; sd: reads throttled "
                   "to a Raspberry Pi 4's microSD card (root)")
    p.add_argument("--stages", type=int, default=2, help="2 (cpu default) or 3: a copy stage into a second buffer")
    p.add_argument("--output", default="auto_pipeline")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    CACHE.mkdir(parents=True, exist_ok=True)
    storage = Storage(args.storage, CACHE)
    data: dict[str, Any] = {
        "machine": machine(), "rounds": args.rounds, "passes": args.passes, "stages": args.stages,
        "storage": storage.describe(), "models": {},
    }
    try:
        storage.enter_here()  # from here on every read goes through the throttle, if any
        for name in args.models.split(","):
            data["models"][name] = measure_model(name, args, storage)
    finally:
        storage.leave_here()
        storage.remove()
    data["wall_s"] = time.perf_counter() - t0
    js, md = write_results(args.output, data, markdown(data))
    print(f"wrote {js} and {md}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
