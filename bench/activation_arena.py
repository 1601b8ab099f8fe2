"""Planned activation arena vs PyTorch's default allocation: peak RSS and latency.

For the six networks of Pisarchyk & Lee's tables (MobileNet v1/v2, DeepLab v3,
Inception v3, PoseNet, BlazeFace) at their zoo input shapes, the same prepared weights
run with the same weights pipeline (async, the pipeline's own budget) twice, each in its
own child process so each peak RSS is its own: ``activations="default"`` (PyTorch
allocates every activation) and ``activations="planned"`` (one arena laid out by the
``best`` offsets plan; see :mod:`layerfit.engine.arena`). Both outputs' SHA-256 are
compared. Latency is the median of ``--repeats`` runs after one warm-up. The machine may
be shared: timings are indicative, nothing here asserts them.
Writes bench/results/activation_arena.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from processes import run_child  # noqa: E402
from reporting import machine, mb, write_results  # noqa: E402

CACHE = Path(__file__).parent / ".cache"
MODELS = ("mobilenet_v1", "mobilenet_v2", "deeplab_v3", "inception_v3", "posenet", "blazeface")


def child(args: argparse.Namespace) -> dict:
    """One configuration in this process: the engine's measure() report."""
    import psutil
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from layerfit.engine import load, measure
    from layerfit.store import example_input, read_manifest

    # Planned mode runs ops under a dispatch mode, whose first use imports torch._dynamo
    # (tens of MB of Python). Both modes pay that here, so RSS differences are activations.
    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            return func(*args, **(kwargs or {}))

    with Passthrough():
        torch.zeros(1) + 1
    m = read_manifest(args.dir)
    x = example_input(m.input_shape, m.input_dtype, m.seed)
    with load(args.dir, pipeline=args.pipeline, activations=args.activations) as engine:
        loaded = psutil.Process().memory_info().rss
        _, report = measure(engine, (x,), repeats=args.repeats, warmup=1)
    report["rss_after_load_bytes"] = loaded
    report["rss_inference_growth_bytes"] = report["rss_peak_bytes"] - loaded
    report["activation_lower_bound_bytes"] = report.pop("activation_plan")["lower_bound_bytes"]
    return report


def prepared_dir(name: str) -> Path:
    """The zoo model prepared at its input shape (written once into bench/.cache)."""
    from layerfit.store import prepare, read_manifest
    from layerfit.zoo import get

    shape = tuple(get(name).input_shape)
    out = CACHE / f"arena-{name}-{'x'.join(map(str, shape))}"
    try:
        if tuple(read_manifest(out).input_shape) == shape:
            return out
    except Exception:
        pass
    prepare(name, out, input_shape=shape, force=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dir")
    ap.add_argument("--activations", default="default")
    ap.add_argument("--pipeline", default="async")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--models", default=",".join(MODELS))
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    rows = []
    for name in args.models.split(","):
        d = prepared_dir(name)
        common = ["--dir", str(d), "--pipeline", args.pipeline, "--repeats", str(args.repeats)]
        runs = {mode: run_child(__file__, [*common, "--activations", mode]) for mode in ("default", "planned")}
        row = {"model": name, **{mode: r for mode, r in runs.items()}}
        ok = all("error" not in r for r in runs.values())
        if ok:
            row["bit_identical"] = runs["default"]["output_sha256"] == runs["planned"]["output_sha256"]
        rows.append(row)
        print(name, {m: r.get("error") or (r["rss_peak_bytes"], r["latency_s"]) for m, r in runs.items()}, flush=True)
    data = {"machine": machine(), "pipeline": args.pipeline, "repeats": args.repeats, "rows": rows}
    lines = [
        "# Planned activation arena vs PyTorch's default allocation",
        "",
        f"Pipeline `{args.pipeline}` (its own budget), medians of {args.repeats} runs after one warm-up; each "
        "configuration in its own child process. MB = 10^6 bytes. Shared, noisy machine: timings indicative.",
        "RSS growth = peak RSS over the measured runs minus RSS after the engine was loaded "
        "(before the first inference): the activations' share, weights read during inference in both.",
        "",
        "| model | input | arena MB (best) | lower bound MB | weights buffer MB | peak RSS default MB | "
        "peak RSS planned MB | RSS growth default MB | RSS growth planned MB | latency default ms | "
        "latency planned ms | bit-identical |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        de, pl = row["default"], row["planned"]
        if "error" in de or "error" in pl:
            lines.append(f"| {row['model']} | error: {de.get('error') or pl.get('error')} |||||||||||")
            continue
        from layerfit.zoo import get

        shape = "x".join(map(str, get(row["model"]).input_shape))
        lines.append(
            f"| {row['model']} | {shape} | {mb(pl['activation_arena_bytes'])} | "
            f"{mb(pl.get('activation_lower_bound_bytes'))} | {mb(pl['weight_buffer_bytes'])} | "
            f"{mb(de['rss_peak_bytes'])} | {mb(pl['rss_peak_bytes'])} | {mb(de['rss_inference_growth_bytes'])} | "
            f"{mb(pl['rss_inference_growth_bytes'])} | {de['latency_s'] * 1e3:.1f} | "
            f"{pl['latency_s'] * 1e3:.1f} | {'yes' if row['bit_identical'] else 'NO'} |"
        )
    write_results("activation_arena", data, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
