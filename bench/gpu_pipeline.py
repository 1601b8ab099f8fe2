"""The three-stage pipeline on a CUDA GPU: Demand Layering's Table II, and a decoder's tokens.

``table2``: for each zoo model at 608 x 608, Pre (every weight in device memory), Seq,
Sync, Async (two of the largest unit), Async-MD (the minimal-delay search against Pre)
and ``auto`` at 25 / 50 / 75 % of the weights, all loaded in one process and run in
alternating rounds, so each delay is a median of per-round ratios to Pre. Every output is
compared bit for bit with the model itself on the same GPU (cuDNN deterministic). Memory
is each engine's ledger (device ring + pinned read ring + resident + kept), and the
device memory its load took. The physical limit is ``max(sum kernel, sum read, sum
copy) + first read + first copy`` from each round's Pre delay and Seq timeline.

``decoder``: the Llama-style 0.5 GB decoder of ``bench/decoding.py``, a 32-token prompt
then 16 greedy tokens with the KV cache, under ``preload``, ``async`` and ``auto`` at
25 / 50 / 75 % of the weights: per-token latency against preloaded, every step's
logits checked against the model on the GPU, and the read, copy and kernel stages'
share of a traced token.

Both describe the device (GPU, driver, CUDA, torch) and the storage's direct-I/O read
bandwidth measured in the same run. Writes ``bench/results/gpu_table2.{json,md}`` and
``gpu_decoding.{json,md}``::

    python bench/gpu_pipeline.py table2 [--models resnet152,vgg19] [--rounds 10]
    python bench/gpu_pipeline.py decoder [--rounds 3] [--tokens 16]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_setup import prepared_zoo_model  # noqa: E402
from reporting import machine, paired_overhead, write_results  # noqa: E402
from storage import direct_read_bandwidth  # noqa: E402

CACHE = Path(__file__).parent / ".cache" / "gpu"
MODELS = ["resnet152", "densenet201", "yolov3", "yolov4", "vgg19"]
SHARES = ["25%", "50%", "75%"]
DEVICE = "cuda"  # --device cpu checks the bench itself where there is no GPU


def gpu() -> dict[str, Any]:
    """The GPU and its software, as the run saw them."""
    if DEVICE == "cpu":
        return {"name": "none (cpu)", "nvidia_smi": "-", "cuda": None, "cudnn": None, "torch": torch.__version__}
    props = torch.cuda.get_device_properties(0)
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        smi = f"nvidia-smi failed: {exc}"
    return {
        "name": props.name, "capability": f"{props.major}.{props.minor}", "memory_bytes": props.total_memory,
        "multiprocessors": props.multi_processor_count, "nvidia_smi": smi, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(), "torch": torch.__version__,
    }


def synced(engine: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """``engine(*args)`` and its seconds, its last kernels included."""
    t0 = time.perf_counter()
    out = engine(*args, **kwargs)
    if DEVICE != "cpu":
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def stages_of(timeline: Any) -> dict[str, float]:
    """Seconds each stage of a traced pass was busy."""
    if timeline is None:
        return {}
    return {stage: timeline.stage_total(stage) for stage in ("read", "copy", "kernel")}


def loaded(directory: Path, **options: Any) -> tuple[Any, int]:
    """An engine on the GPU, and the device memory its load took."""
    from layerfit.engine import load

    if DEVICE == "cpu":
        return load(directory, device="cpu", stages=3, **options), 0
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    engine = load(directory, device=DEVICE, **options)
    torch.cuda.synchronize()
    return engine, torch.cuda.memory_allocated() - before


def table2_row(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every configuration of ``name``, loaded at once and run in alternating rounds."""
    from demand_layering import first_duration, physical_limit

    from layerfit import zoo
    from layerfit.store import example_input, read_manifest
    from layerfit.tradeoff.delay import minimal_delay_search

    directory = prepared_zoo_model(name, args.resolution, CACHE)
    m = read_manifest(directory)
    x = example_input(m.input_shape, m.input_dtype, m.seed).to(DEVICE)
    model = zoo.build(name, seed=m.seed).to(DEVICE)
    with torch.no_grad():
        expected = model(x)
    del model
    if DEVICE != "cpu":
        torch.cuda.empty_cache()
    low = m.resident_bytes + 2 * m.largest_unit_bytes
    options: dict[str, dict[str, Any]] = {
        "preload": {"pipeline": "preload"},
        "sequential": {"pipeline": "sequential", "trace": True},
        "sync": {"pipeline": "sync", "trace": True},
        "async": {"pipeline": "async", "budget": low, "trace": True},
    }
    engines: dict[str, Any] = {}
    device_bytes: dict[str, int] = {}
    engines["preload"], device_bytes["preload"] = loaded(directory, **options["preload"])
    pre = engines["preload"]
    t0 = time.perf_counter()
    md_engine, _ = loaded(directory, pipeline="async", budget=low)
    with torch.no_grad():
        found = minimal_delay_search(
            md_engine, (x,), step=max(4096, int(m.total_bytes * args.md_step)), repeats=args.md_repeats,
            warmup=1, patience=args.md_patience, tolerance=0.01, reference=pre,
        )
    md_engine.close()
    md_s = time.perf_counter() - t0
    options["async-md"] = {"pipeline": "async", "budget": found.minimal.budget_bytes, "trace": True}
    for share in SHARES:
        options[f"auto {share}"] = {"pipeline": "auto", "budget": share, "trace": True}
    for config, opts in options.items():
        if config != "preload":
            engines[config], device_bytes[config] = loaded(directory, **opts)
    identical = {}
    with torch.no_grad():
        for config, engine in engines.items():
            out, _ = synced(engine, x)
            identical[config] = bool(torch.equal(out, expected))
        times: dict[str, list[float]] = {c: [] for c in engines}
        limits, stage_seconds = [], {c: [] for c in engines}
        for _ in range(args.rounds):
            for config, engine in engines.items():
                times[config].append(synced(engine, x)[1])
                stage_seconds[config].append(stages_of(engine.last_timeline))
            seq = engines["sequential"].last_timeline
            limits.append(physical_limit(
                times["preload"][-1], seq.stage_total("read"), seq.stage_total("copy"),
                first_duration(seq, "read") + first_duration(seq, "copy"),
            ))
    configs = {}
    for config, engine in engines.items():
        mem = engine.memory
        stage = {s: statistics.median(r[s] for r in stage_seconds[config]) for s in ("read", "copy", "kernel")} \
            if stage_seconds[config][0] else {}
        configs[config] = {
            "pipeline": engine.policy.name, "budget": options[config].get("budget"),
            "bit_identical": identical[config], "median_s": statistics.median(times[config]), "all_s": times[config],
            "vs_preload": paired_overhead(times[config], times["preload"]),
            "vs_limit": paired_overhead(times[config], limits),
            "weights_peak_bytes": engine.last_weights_peak if config != "preload" else m.total_bytes,
            "memory_reduction": 1 - (engine.last_weights_peak if config != "preload" else m.total_bytes) / m.total_bytes,
            "resident_bytes": mem.resident_bytes, "kept_bytes": mem.kept_bytes, "kept_units": len(engine.kept_units),
            "pinned_read_ring_bytes": mem.buffer_bytes, "device_ring_bytes": mem.device_buffer_bytes,
            "device_bytes_at_load": device_bytes[config], "stage_s": stage,
        }
        engine.close()
    return {
        "model": name, "resolution": args.resolution, "units": len(m.units), "weights_bytes": m.total_bytes,
        "largest_unit_bytes": m.largest_unit_bytes, "physical_limit_s": statistics.median(limits),
        "md_budget_bytes": found.minimal.budget_bytes, "md_search_s": md_s,
        "md_curve": [{"budget_bytes": p.budget_bytes, "relative": p.relative} for p in found.points],
        "storage_read_bps": direct_read_bandwidth(directory / m.weights_file), "configs": configs,
    }


def table2(args: argparse.Namespace) -> None:
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    rows = []
    for name in args.models.split(","):
        t0 = time.perf_counter()
        try:
            row = table2_row(name, args)
        except Exception as exc:  # one model's failure is a finding, not the end of the run
            import traceback

            traceback.print_exc()
            row = {"model": name, "error": f"{type(exc).__name__}: {exc}"}
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        print(table2_markdown([row]).split("\n|---", 1)[-1], flush=True)
        # written after every model, so that a run stopped at its time limit keeps the rows it made
        data = {"benchmark": "demand_layering_table2_gpu", "machine": machine(), "gpu": gpu(), "rows": rows,
                "args": vars(args)}
        write_results(args.output or "gpu_table2", data, table2_markdown(rows, data))


COLUMNS = ["preload", "sequential", "sync", "async", "async-md", "auto 25%", "auto 50%", "auto 75%"]


def table2_markdown(rows: list[dict[str, Any]], data: dict[str, Any] | None = None) -> str:
    lines = ["# Demand Layering Table II on a GPU", ""]
    if data is not None:
        g = data["gpu"]
        lines += [
            f"GPU: {g['name']} ({g['nvidia_smi']}), CUDA {g['cuda']}, cuDNN {g['cudnn']}, torch {g['torch']}; "
            f"host: {data['machine']['cores']} cores. Three stages (pinned read ring, copy stream, device ring).",
            "Each cell: weight memory reduction against Pre / delay overhead against Pre (median of per-round",
            "ratios, all configurations alternating in one process); Pre's cell is its delay. 'exact': output",
            "equal bit for bit to the model on the same GPU.",
            "",
        ]
    lines += ["| model | " + " | ".join(COLUMNS) + " | physical limit | storage |",
              "|---|" + "---|" * (len(COLUMNS) + 2)]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | failed: {row['error'][:200]} |" + " |" * (len(COLUMNS) + 1))
            continue
        cells = []
        for config in COLUMNS:
            c = row["configs"][config]
            mark = "" if c["bit_identical"] else " (NOT exact)"
            if config == "preload":
                cells.append(f"{c['median_s'] * 1e3:.1f} ms, {c['weights_peak_bytes'] / 1e6:.0f} MB{mark}")
            else:
                cells.append(f"−{c['memory_reduction']:.0%} / {c['vs_preload']['median']:+.1%}{mark}")
        lines.append(f"| {row['model']} {row['resolution']} | " + " | ".join(cells)
                     + f" | {row['physical_limit_s'] * 1e3:.1f} ms | {row['storage_read_bps'] / 1e9:.2f} GB/s |")
    lines += ["", "Stage seconds of one pass (median over rounds; read / copy / kernel, ms) and device memory at load (MB):",
              "", "| model | config | read | copy | kernel | delay | vs limit | device MB | pinned ring MB |",
              "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        for config, c in row.get("configs", {}).items():
            st = c["stage_s"]
            lines.append(
                f"| {row['model']} | {config} | " + " | ".join(f"{st.get(s, 0) * 1e3:.1f}" for s in ("read", "copy", "kernel"))
                + f" | {c['median_s'] * 1e3:.1f} | {c['vs_limit']['median']:+.1%} | {c['device_bytes_at_load'] / 1e6:.1f}"
                f" | {c['pinned_read_ring_bytes'] / 1e6:.1f} |"
            )
    return "\n".join(lines) + "\n"


def greedy(model: Any, ids: torch.Tensor, tokens: int) -> tuple[list[torch.Tensor], list[float], list[dict]]:
    """Logits, seconds and traced stages of the prompt's pass and each generated token's."""
    logits, times, stages = [], [], []
    past = None
    for step in range(tokens + 1):
        kwargs = {"use_cache": True} if step == 0 else {"past_key_values": past, "use_cache": True}
        out, seconds = synced(model, ids, **kwargs)
        times.append(seconds)
        stages.append(stages_of(getattr(model, "last_timeline", None)))
        logits.append(out.logits)
        past, ids = out.past_key_values, out.logits[:, -1:].argmax(-1)
    return logits, times, stages


def decoder(args: argparse.Namespace) -> None:
    import decoding

    from layerfit.errors import LayerfitError
    from layerfit.store import example_input, prepare

    directory = CACHE / "llama"
    m = prepare("decoding:llama", directory, input_shape=(1, decoding.PROMPT), input_dtype="int64", force=True)
    ids = (example_input((1, decoding.PROMPT), "int64", seed=1) % 1000).to(DEVICE)
    model = decoding.llama().to(DEVICE)
    with torch.no_grad():
        expected, _, _ = greedy(model, ids, args.tokens)
        ref_times = [greedy(model, ids, args.tokens)[1] for _ in range(args.rounds)]
    del model
    if DEVICE != "cpu":
        torch.cuda.empty_cache()
    options = {"preload": {"pipeline": "preload"}, "async (default budget)": {"pipeline": "async", "trace": True}}
    for share in SHARES:
        options[f"auto {share}"] = {"pipeline": "auto", "budget": share, "trace": True}
    engines, refused = {}, {}
    for config, opts in options.items():
        try:
            engines[config] = loaded(directory, **opts)
        except LayerfitError as exc:  # a share below the three-stage minimum: reported as such
            refused[config] = str(exc)
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in engines}
    identical = dict.fromkeys(engines, True)
    with torch.no_grad():
        for _ in range(args.rounds):
            for config, (engine, _) in engines.items():
                got, times, stages = greedy(engine, ids, args.tokens)
                identical[config] &= all(torch.equal(g, e) for g, e in zip(got, expected, strict=True))
                token = statistics.median(times[1:])
                runs[config].append({"prompt_s": times[0], "token_s": token, "stages": stages[1:]})
    preload_tokens = [r["token_s"] for r in runs["preload"]]
    results = {}
    for config, (engine, device_bytes) in engines.items():
        tokens = [r["token_s"] for r in runs[config]]
        traced = [s for r in runs[config] for s in r["stages"] if s]
        share = {s: statistics.median(t[s] for t in traced) for s in ("read", "copy", "kernel")} if traced else {}
        mem = engine.memory
        results[config] = {
            "bit_identical": identical[config], "prompt_s": statistics.median(r["prompt_s"] for r in runs[config]),
            "token_s": statistics.median(tokens), "rounds_token_s": tokens,
            "vs_preload": paired_overhead(tokens, preload_tokens),
            "weights_peak_bytes": engine.last_weights_peak if config != "preload" else m.total_bytes,
            "kept_bytes": mem.kept_bytes, "pinned_read_ring_bytes": mem.buffer_bytes,
            "device_ring_bytes": mem.device_buffer_bytes, "device_bytes_at_load": device_bytes,
            "token_stage_s": share,
            "copy_share_of_token": share.get("copy", 0) / statistics.median(tokens) if share else 0.0,
        }
        engine.close()
    data = {
        "benchmark": "gpu_decoding", "machine": machine(), "gpu": gpu(), "prompt_tokens": decoding.PROMPT,
        "generated_tokens": args.tokens, "rounds": args.rounds, "weights_bytes": m.total_bytes,
        "model_token_s": statistics.median(statistics.median(t[1:]) for t in ref_times),
        "storage_read_bps": direct_read_bandwidth(directory / m.weights_file), "results": results,
        "refused": refused,
    }
    write_results(args.output or "gpu_decoding", data, decoder_markdown(data))
    print(decoder_markdown(data))


def decoder_markdown(data: dict[str, Any]) -> str:
    g = data["gpu"]
    lines = [
        "# A decoder's tokens on a GPU under a weight budget", "",
        f"GPU: {g['name']} ({g['nvidia_smi']}), CUDA {g['cuda']}, torch {g['torch']}; storage "
        f"{data['storage_read_bps'] / 1e9:.2f} GB/s (direct I/O, same run). Llama-style decoder, "
        f"{data['weights_bytes'] / 1e6:.0f} MB of float32 weights; a {data['prompt_tokens']}-token prompt, then "
        f"{data['generated_tokens']} greedy tokens with the KV cache; {data['rounds']} alternating rounds. The model "
        f"itself on the GPU: {data['model_token_s'] * 1e3:.2f} ms per token.", "",
        "| config | weights held (MB) | prompt (ms) | per token (ms) | vs preload | read / copy / kernel per token (ms) "
        "| copy share | exact |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for config, r in data["results"].items():
        st = r["token_stage_s"]
        stages = " / ".join(f"{st.get(s, 0) * 1e3:.1f}" for s in ("read", "copy", "kernel")) if st else "-"
        lines.append(
            f"| {config} | {r['weights_peak_bytes'] / 1e6:.0f} | {r['prompt_s'] * 1e3:.1f} | {r['token_s'] * 1e3:.2f} "
            f"| {r['vs_preload']['median']:+.0%} | {stages} | {r['copy_share_of_token']:.0%} "
            f"| {'yes' if r['bit_identical'] else 'NO'} |"
        )
    for config, why in data["refused"].items():
        lines.append(f"| {config} | refused: {why} |" + " |" * 6)
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=["table2", "decoder"])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--resolution", type=int, default=608)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--md-step", type=float, default=0.04, help="MD search step as a fraction of the model")
    ap.add_argument("--md-patience", type=int, default=3)
    ap.add_argument("--md-repeats", type=int, default=2)
    ap.add_argument("--output", default=None)
    ap.add_argument("--device", default="cuda", help="cuda (cpu only to check the bench: three stages on the host)")
    args = ap.parse_args()
    global DEVICE
    DEVICE = args.device
    if DEVICE != "cpu" and not torch.cuda.is_available():
        raise SystemExit("this bench needs a CUDA device")
    table2(args) if args.part == "table2" else decoder(args)


if __name__ == "__main__":
    main()
