"""How the scheduler's activation estimates compare with what a forward pass takes.

The runtime's ledger counts, for each network in flight, the activations of one pass:
the larger of the capture's tensor usage records (the largest set of tensors alive at
once, as leaf modules hand them to each other) and what the captured eager pass held at
once (``pass_peak_bytes``, every operator's output, functional code's too). A pass also
holds what neither sees: oneDNN's convolution buffers, and freed scratch that glibc
keeps until it is given back. This bench measures the difference for the four edge
models at their own resolutions and for Whisper-base (30 s of audio features, a 4-token
prompt: its attention scores and returned cross-attention cache are functional code's),
through ``layerfit.Runtime`` as ``serve`` runs them (``merge:auto``, weight cache on, a
budget of twice the weights and activations, so that after the first pass every weight
is cached and only compute remains).

Each model and each ``return_freed_memory`` mode runs in a fresh child process: three
passes to warm up (weights cached, kernels compiled, library code paged in), then
``--repeats`` passes, each measured as the peak RSS (``VmHWM``, reset before it) above
the RSS before it, with every free page given back first (``malloc_trim``), so that the
rise is all the pass needs above what the process holds idle. Outputs are checked bit
for bit against the model run preloaded in the same process. Writes
``bench/results/activation_estimates.{json,md}``::

    .venv/bin/python bench/activation_estimates.py [--models NAME ...] [--modes MODE ...]
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
from processes import off_main, run_child  # noqa: E402
from reporting import machine, mb, write_results  # noqa: E402

from layerfit.store.trust import trust_factories  # noqa: E402

trust_factories(["encoder_decoder"])  # this bench's own factories rebuild the models it prepares

CACHE = Path(__file__).parent / ".cache"
MODELS = ("mobilenet_v1_025", "blazeface", "deeplab_v3", "mobilenet_v2", "whisper_base")
MODES = ("after-pass", "eagerly", "never")


def prepared_model(name: str) -> Path:
    """A zoo model at its own resolution, or one of serve_load's keyword models."""
    from serve_load import KEYWORD_MODELS

    from layerfit import zoo
    from layerfit.errors import LayerfitError
    from layerfit.store import prepare, read_manifest

    root = CACHE / "activation_estimates"
    if name not in KEYWORD_MODELS:
        return prepared_zoo_model(name, zoo.get(name).input_shape[-1], root)
    try:  # reused unless prepared before the captured pass was measured (as zoo models)
        if read_manifest(root / name).graph.pass_peak_bytes:
            return root / name
    except LayerfitError:
        pass  # missing or stale: prepare it again
    factory, example = KEYWORD_MODELS[name]
    prepare(factory, root / name, example=example(), force=True)
    return root / name


def child(model_dir: Path, mode: str, repeats: int) -> dict[str, Any]:
    import torch

    from layerfit.engine import load, output_digest
    from layerfit.engine.osmem import peak_rss_bytes, reset_peak_rss, rss_bytes, trim_heap
    from layerfit.schedule.runtime.executor import Runtime
    from layerfit.schedule.runtime.profiler import activation_peak_bytes, estimate_profile
    from layerfit.store import example_call, read_manifest

    manifest = read_manifest(model_dir)
    args, kwargs = example_call(manifest)
    x = kwargs or args[0]  # the runtime takes a model's keyword arguments as a mapping

    def reference() -> str:
        with load(model_dir, pipeline="preload") as engine, torch.no_grad():
            return output_digest(engine(*args, **kwargs))

    expected = off_main(reference)
    estimate = estimate_profile(manifest, model_dir.name)
    budget = 2 * (manifest.weights_size + estimate.init_memory)  # room to cache every weight
    runtime = Runtime(model_dir.parent, budget, workers=1, units="merge:auto",
                      cache_weights=True, return_freed_memory=mode, load=False)
    try:
        runtime.load_model(model_dir.name)
        for _ in range(3):
            assert output_digest(runtime.infer(model_dir.name, x).result()) == expected
        rises, seconds = [], []
        for _ in range(repeats):
            # the baseline is what the process holds idle: the pass before may still be
            # giving its scratch back on its own thread, and glibc may keep some of it
            time.sleep(0.05)
            trim_heap()
            before = rss_bytes()
            if not reset_peak_rss():
                raise RuntimeError("this kernel cannot reset the peak RSS (/proc/self/clear_refs)")
            t0 = time.perf_counter()
            out = runtime.infer(model_dir.name, x).result()
            seconds.append(time.perf_counter() - t0)
            rises.append(peak_rss_bytes() - before)
            assert output_digest(out) == expected, "output differs from the preloaded model's"
        stats = runtime.stats()
    finally:
        runtime.shutdown()
    return {
        "records_activation_bytes": activation_peak_bytes(manifest.graph),
        "pass_peak_bytes": manifest.graph.pass_peak_bytes,
        "captured_activation_bytes": estimate.init_memory - manifest.resident_bytes,
        "budget_bytes": budget,
        "rss_rise_bytes": rises,
        "rss_rise_median_bytes": statistics.median(rises),
        "pass_median_s": statistics.median(seconds),
        "weights_bytes": manifest.weights_size,
        "weight_cache_hits": stats["weight_cache"]["hits"],
        "freed_memory": stats["freed_memory"],
        "compute_threads": stats["compute_threads"],
        "bit_identical": True,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=7, help="measured passes per run")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--name", default="activation_estimates", help="result file name under bench/results/")
    p.add_argument("--child", nargs=3, metavar=("DIR", "MODE", "REPEATS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        import json

        print(json.dumps(child(Path(args.child[0]), args.child[1], int(args.child[2]))))
        return
    rows = []
    for name in args.models:
        model_dir = prepared_model(name)
        for mode in args.modes:
            result = run_child(__file__, [str(model_dir), mode, str(args.repeats)])
            rows.append({"model": model_dir.name, "mode": mode, **result})
            print(name, mode, {k: v for k, v in result.items() if k != "rss_rise_bytes"}, flush=True)
    # glibc's own settings from the environment (MALLOC_MMAP_THRESHOLD_, ...), which the
    # children inherit: under "never" the runtime leaves them as they are
    malloc_env = {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")}
    data = {"machine": machine(), "repeats": args.repeats, "malloc_env": malloc_env, "rows": rows}
    write_results(args.name, data, markdown(data))


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# Activation estimates against a forward pass's resident memory",
        "",
        f"Machine: {data['machine'].get('cpu', '?')}, torch {data['machine'].get('torch', '?')}. "
        f"Through `layerfit.Runtime` (`merge:auto`, weight cache on, budget 2x the weights and "
        f"activations, every weight cached); each model and mode in a fresh process; RSS rise = peak "
        f"RSS of one pass above the RSS before it with every free page given back (`malloc_trim`), "
        f"median of {data['repeats']} passes after three warm-up passes. "
        "MB = 10^6 bytes.",
        "",
        "*Records*: the usage records' peak (the estimate until the pass was measured); *pass*: "
        "what the captured eager pass held at once; *estimate*: what the ledger counts, the larger. "
        "*Pass ms*: the median wall time of the measured passes (a request through the runtime).",
        "",
        *([f"glibc settings from the environment: {', '.join(f'`{k}={v}`' for k, v in data['malloc_env'].items())}.", ""]
          if data.get("malloc_env") else []),
        "| model | records MB | pass MB | estimate MB | mode | RSS rise MB (median) | min - max "
        "| rise / records | rise / estimate | pass ms | bit-identical |",
        "|---|---:|---:|---:|---|---:|---|---:|---:|---:|---|",
    ]
    for row in data["rows"]:
        if "error" in row:
            lines.append(f"| {row['model']} | | | | {row['mode']} | error: {row['error']} | | | | | |")
            continue
        records, estimate = row["records_activation_bytes"], row["captured_activation_bytes"]
        rise = row["rss_rise_median_bytes"]
        lines.append(
            f"| {row['model']} | {mb(records)} | {mb(row['pass_peak_bytes'])} | {mb(estimate)} | "
            f"{row['mode']} | {mb(rise)} | "
            f"{mb(min(row['rss_rise_bytes']))} - {mb(max(row['rss_rise_bytes']))} | "
            f"{rise / records:.2f} | {rise / estimate:.2f} | {row['pass_median_s'] * 1e3:.0f} | "
            f"{'yes' if row['bit_identical'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
