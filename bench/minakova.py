"""Minakova & Stefanov (2022), Table 12 on this machine: memory and throughput of six
CNN-based applications under buffer reuse, processing by parts and both (Algorithm 2).

For every application (paper's Table 12 rows) it reports:

* memory with **no reduction** (every edge its own buffer), with **[23]** (Pisarchyk &
  Lee's per-network planner: best heuristic shared-objects plan of each CNN on its own,
  no sharing between CNNs, and blind to pipelining - so a pipelined CNN runs its stages
  one after the other), with **[17]** (every tileable layer by parts, no buffer reuse)
  and **ours** at the paper's memory constraints (``min`` = the least memory found) and,
  to show the trade-off, halfway between buffer reuse alone and that minimum (``mid``);
* throughput of every CNN for each: per-layer times measured on this machine (each
  layer whole and by parts, median of repeats) composed per configuration - the
  estimator the genetic search uses - and, for the chosen configurations, an
  end-to-end measured run on the engine (``measured``: each CNN prepared once, loaded
  with every weight resident, each partition a pass of its engine) as a check.

Two more measurements back the issue's items 3 and 5: peak edge-buffer bytes of the
by-parts executor vs plain layer-by-layer execution (with the output difference), and
a real two-thread pipeline of MobileNet v2 vs running its two stages sequentially.

Numbers are what this machine gives (CPU, one intra-op thread, PyTorch eager, fp32,
batch 1), not the
paper's Jetson TX2 + TensorRT; nothing is asserted. Run ``python bench/minakova.py``
(``--quick`` for a small-resolution smoke run). Writes ``results/minakova.{json,md}``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from reporting import machine, mb, write_results

from layerfit import zoo
from layerfit.engine.engine import Engine
from layerfit.store import prepare
from layerfit.tradeoff.parts import (
    Application,
    Constraints,
    GAParams,
    MeasuredThroughput,
    PartsExecutor,
    ProfiledThroughput,
    TwoStagePipeline,
    cnn_from_module,
    reduce_buffers,
    split_partitions,
    untiled_peak_bytes,
)
from layerfit.tradeoff.parts.application import BYTES_PER_ELEMENT
from layerfit.tradeoff.parts.reuse import planner_buffers, total_elems
from layerfit.tradeoff.parts.search import Evaluator, baselines


@dataclass(frozen=True)
class AppSpec:
    number: str
    title: str
    models: tuple[str, ...]
    stages: int  # 2 = each CNN split into a two-stage pipeline
    constraints: tuple[float | str, ...]  # MB (10^6 bytes) or "min"


APPS = (
    AppSpec("1", "MobileNetV2 1.0, sequential", ("mobilenet_v2",), 1, (25, 15, "min")),
    AppSpec("2", "EfficientNet-B0, sequential", ("efficientnet_b0",), 1, (150, 40, "min")),
    AppSpec("3", "MobileNetV2 1.0, pipelined", ("mobilenet_v2",), 2, (30, 15, "min")),
    AppSpec("4", "EfficientNet-B0, pipelined", ("efficientnet_b0",), 2, (150, 50, "min")),
    AppSpec("5", "Inception v3 + MobileNetV1 0.25 + ResNet-50", ("inception_v3", "mobilenet_v1_025", "resnet50"), 1, (200, "min")),
    AppSpec("6", "DenseNet-121 + MobileNetV1 1.0 + ResNet-50", ("densenet121", "mobilenet_v1", "resnet50"), 1, (500, "min")),
)


def example(size: int) -> torch.Tensor:
    return torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0))


def build_cnns(models: tuple[str, ...], size: int, cache: dict[str, Any]) -> list[Any]:
    cnns = []
    for name in models:
        if name not in cache:
            cache[name] = cnn_from_module(name, zoo.build(name), example(size))
        cnns.append(cache[name])
    return cnns


def pisarchyk(app: Application) -> int:
    """[23]: each CNN planned on its own, one partition, best heuristic of the memory planner."""
    total = app.param_bytes()
    from layerfit.memory.registry import strategy_names

    for cnn in app.cnns:
        single = Application([cnn], precision=app.precision)
        edges = single.derive(reuse=False).edges
        best = min(
            total_elems(planner_buffers(edges, s))
            for s in strategy_names("objects", heuristic_only=True)
            if s != "naive"
        )
        total += best * BYTES_PER_ELEMENT[app.precision]
    return total


ENGINES: dict[tuple[str, tuple[int, ...]], Engine] = {}
_CLOSING = contextlib.ExitStack()
atexit.register(_CLOSING.close)


def engine_of(name: str, shape: tuple[int, ...]) -> Engine:
    """The zoo model ``name`` prepared once at input ``shape`` (into a temporary folder)
    and loaded with every weight resident: what a measured configuration runs on."""
    key = (name, shape)
    if key not in ENGINES:
        folder = Path(_CLOSING.enter_context(tempfile.TemporaryDirectory(prefix="minakova-"))) / name
        prepare(name, folder, input_shape=shape)
        ENGINES[key] = _CLOSING.enter_context(Engine(folder, pipeline="preload", units="layers"))
    return ENGINES[key]


def measured_fps(app: Application, bits: tuple[bool, ...], repeats: int) -> dict[str, float]:
    """Each CNN of ``app`` under ``bits`` run for real, partition by partition, as passes
    of the engine of its prepared model."""
    engines = {cnn.name: engine_of(cnn.name, cnn.layers[0].shape) for cnn in app.cnns}
    return MeasuredThroughput(repeats=repeats, engines=engines).throughput(app, app.derive(bits))


def run_app(spec: AppSpec, size: int, ga: GAParams, estimator: ProfiledThroughput, cache: dict[str, Any], repeats: int) -> dict[str, Any]:
    cnns = build_cnns(spec.models, size, cache)
    partitions = []
    for cnn in cnns:
        partitions += split_partitions(cnn, spec.stages)
    app = Application(cnns, partitions, name=spec.title)
    start = time.perf_counter()
    evaluator = Evaluator(app, estimator)
    fps_whole = evaluator(None).throughput
    sequential = Application(cnns)  # what [23] runs: stages one after the other
    fps_23 = estimator.throughput(sequential, sequential.derive())
    rows: dict[str, Any] = {}
    reuse_only = evaluator.final(None)[0].memory.total
    for constraint in (*spec.constraints, "mid"):
        if constraint == "mid":  # not in the paper: halfway between reuse only and the minimum
            memory = (reuse_only + rows["min"]["memory_bytes"]) // 2
        else:
            memory = 0 if constraint == "min" else int(float(constraint) * 1e6)
        t0 = time.perf_counter()
        result = reduce_buffers(app, Constraints(memory=memory), estimator, ga, evaluator=evaluator)
        chosen = result.chosen
        label = f"{memory / 1e6:.1f} (mid)" if constraint == "mid" else str(constraint)
        rows[label] = {
            "constraint_bytes": memory,
            "feasible": result.feasible,
            "early_exit": result.early_exit,
            "memory_bytes": chosen.memory.total,
            "buffer_bytes": chosen.memory.buffers,
            "layers_by_parts": chosen.parts,
            "fps_profiled": chosen.throughput,
            "violations": [v.message() for v in result.violations],
            "pareto_points": len(result.pareto),
            "seconds": time.perf_counter() - t0,
            "bits": chosen.bits,
        }
    base = baselines(evaluator)
    every = base["all_parts"].bits
    for row in rows.values():
        row["fps_measured"] = measured_fps(app, row.pop("bits"), repeats)
    return {
        "app": spec.number,
        "title": spec.title,
        "models": list(spec.models),
        "stages": spec.stages,
        "layers": app.n_layers,
        "tileable_layers": sum(app.tileable_mask()),
        "params_bytes": app.param_bytes(),
        "no_reduction": {"memory_bytes": base["no_reduction"].memory.total, "fps": fps_whole},
        "pisarchyk_23": {"memory_bytes": pisarchyk(app), "fps": fps_23 if spec.stages > 1 else fps_whole},
        "reuse_only": {"memory_bytes": base["reuse_only"].memory.total, "fps": fps_whole},
        "all_parts_17": {
            "memory_bytes": base["all_parts"].memory.total,
            "fps": base["all_parts"].throughput,
            "fps_measured": measured_fps(app, every, repeats),
        },
        "all_parts_reuse": {"memory_bytes": base["all_parts_reuse"].memory.total, "fps": base["all_parts_reuse"].throughput},
        "ours": rows,
        "evaluations": len(evaluator.cache),
        "seconds": time.perf_counter() - start,
    }


def buffer_experiment(models: tuple[str, ...], size: int, cache: dict[str, Any]) -> list[dict[str, Any]]:
    """Item 3: peak edge-buffer bytes by parts vs untiled, output difference, time."""
    rows = []
    for name in models:
        cnn = build_cnns((name,), size, cache)[0]
        (x,) = cnn.runner.example
        with torch.no_grad():
            reference = cnn.runner.module(x)
        runs = {}
        for mode in ("none", "all"):
            executor = PartsExecutor(cnn, mode)
            out = executor.run(x)
            t0 = time.perf_counter()
            executor.run(x)
            runs[mode] = (executor.last_stats.peak_bytes, time.perf_counter() - t0, out, len(executor.plan.steps))
        diff = (runs["all"][2] - reference).abs().max().item()
        rows.append(
            {
                "model": name,
                "untiled_peak_bytes": runs["none"][0],
                "parts_peak_bytes": runs["all"][0],
                "reduction": runs["none"][0] / runs["all"][0],
                "max_abs_diff": diff,
                "max_abs_output": reference.abs().max().item(),
                "phases": runs["all"][3],
                "seconds_untiled": runs["none"][1],
                "seconds_parts": runs["all"][1],
            }
        )
        assert runs["none"][0] == untiled_peak_bytes(cnn)
    return rows


def stage_seconds(pipeline: TwoStagePipeline, x: torch.Tensor, repeats: int = 5) -> tuple[float, float]:
    """Median seconds of each stage run alone."""
    slot = pipeline._new_slot(x)
    first, second = [], []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        pipeline.first.run(x, out=slot)
        t1 = time.perf_counter()
        pipeline.second.run(*pipeline._second_inputs((x,), slot))
        first.append(t1 - t0)
        second.append(time.perf_counter() - t1)
    return statistics.median(first[1:]), statistics.median(second[1:])


def measure_pipeline(pipeline: TwoStagePipeline, frames: list[torch.Tensor], repeats: int) -> dict[str, Any]:
    """Frames per second sequential (both stages on one thread) and pipelined, medians of
    ``repeats`` alternating runs after a warm-up, and whether their outputs are identical."""
    pipeline.run_sequential(frames[:1])  # warm up both stages
    seconds: dict[str, list[float]] = {"sequential": [], "pipelined": []}
    outputs: dict[str, list[Any]] = {}
    for _ in range(repeats):
        for mode, run in (("sequential", pipeline.run_sequential), ("pipelined", pipeline.run)):
            start = time.perf_counter()
            outputs[mode] = run(frames)
            seconds[mode].append(time.perf_counter() - start)
    fps = {mode: len(frames) / statistics.median(times) for mode, times in seconds.items()}
    identical = all(torch.equal(a, b) for a, b in zip(outputs["sequential"], outputs["pipelined"], strict=True))
    return {"sequential_fps": fps["sequential"], "pipelined_fps": fps["pipelined"], "identical": identical}


def pipeline_experiment(size: int, frames: int, cache: dict[str, Any], estimator: ProfiledThroughput) -> list[dict[str, Any]]:
    """Item 5: MobileNet v2 as a two-stage pipeline on two threads vs sequential, each
    stage whole and each stage with every layer by parts; the cut balances measured time."""
    cnn = build_cnns(("mobilenet_v2",), size, cache)[0]
    times = estimator.layer_times(cnn)
    inputs = [example(size) + k for k in range(frames)]
    rows = []
    for parts, weights in (("none", times.whole), ("all", times.parts)):
        first, _ = split_partitions(cnn, 2, weights=weights)
        cut = first.stop
        pipeline = TwoStagePipeline(cnn, cut, parts)
        report = measure_pipeline(pipeline, inputs, repeats=3)
        alone = stage_seconds(pipeline, inputs[0])
        rows.append(
            {
                "stages": "whole" if parts == "none" else "all layers by parts",
                "cut_node": cnn.layers[cut].name,
                "frames": frames,
                "stage_seconds": alone,
                "bound_fps": 1 / max(alone),
                "sequential_fps": report["sequential_fps"],
                "pipelined_fps": report["pipelined_fps"],
                "speedup": report["pipelined_fps"] / report["sequential_fps"],
                "identical_outputs": report["identical"],
                "edge_bytes_per_slot": pipeline.edge_bytes(),
            }
        )
    return rows


def thread_scaling() -> float:
    """How much faster two threads of independent work finish than one doing both."""
    import threading

    a = torch.randn(384, 384)

    def work() -> None:
        for _ in range(40):
            a @ a

    work()
    t0 = time.perf_counter()
    work()
    work()
    sequential = time.perf_counter() - t0
    threads = [threading.Thread(target=work) for _ in range(2)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sequential / (time.perf_counter() - t0)


def fps_text(fps: dict[str, float]) -> str:
    return ", ".join(f"{v:.3g}" for v in fps.values())


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# Minakova & Stefanov, Table 12 on this machine",
        "",
        f"CPU ({data['machine']['cores']} cores, one PyTorch intra-op thread: the machine is shared and "
        f"oversubscribed threads stall), PyTorch {data['machine']['torch']}, fp32, batch 1, "
        f"input {data['size']}x{data['size']}; "
        f"GA population {data['ga']['population']}, {data['ga']['generations']} generations. "
        "Memory in MB (10^6 bytes) = parameters + buffers (Eq. 1). Throughput in frames/s per CNN "
        "(in the order of the CNN column): *profiled* = per-layer times measured here, composed per "
        "configuration (what the search optimises); *measured* = the configuration run end to end.",
        "",
        "| # | CNN(s) | constraint (MB) | no reduction | [23] | reuse only (Alg. 1) | [17] | ours | fps no red. | fps [23] | fps [17] (measured) | fps ours profiled (measured) | by parts | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for app in data["apps"]:
        for k, (constraint, row) in enumerate(app["ours"].items()):
            first = k == 0
            note = "early exit" if row["early_exit"] else ("" if row["feasible"] else "; ".join(row["violations"]))
            lines.append(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}/{} | {} |".format(
                    app["app"] if first else "",
                    (app["title"] + f" ({app['layers']} layers)") if first else "",
                    constraint,
                    mb(app["no_reduction"]["memory_bytes"]) if first else "",
                    mb(app["pisarchyk_23"]["memory_bytes"]) if first else "",
                    mb(app["reuse_only"]["memory_bytes"]) if first else "",
                    mb(app["all_parts_17"]["memory_bytes"]) if first else "",
                    mb(row["memory_bytes"]),
                    fps_text(app["no_reduction"]["fps"]) if first else "",
                    fps_text(app["pisarchyk_23"]["fps"]) if first else "",
                    f"{fps_text(app['all_parts_17']['fps'])} ({fps_text(app['all_parts_17']['fps_measured'])})" if first else "",
                    f"{fps_text(row['fps_profiled'])} ({fps_text(row['fps_measured'])})",
                    row["layers_by_parts"],
                    app["tileable_layers"],
                    note,
                )
            )
    lines += [
        "",
        "## Processing by parts: edge buffers (issue item 3)",
        "",
        "| model | untiled peak (MB) | by parts peak (MB) | reduction | max abs diff (max abs output) | phases | s untiled | s by parts |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in data["buffers"]:
        lines.append(
            f"| {row['model']} | {mb(row['untiled_peak_bytes'])} | {mb(row['parts_peak_bytes'])} | "
            f"{row['reduction']:.1f}x | {row['max_abs_diff']:.2e} ({row['max_abs_output']:.1f}) | {row['phases']} | "
            f"{row['seconds_untiled']:.2f} | {row['seconds_parts']:.2f} |"
        )
    lines += [
        "",
        "## Two-stage pipeline, MobileNet v2 (issue item 5)",
        "",
        "Stage one on a worker thread, stage two on the caller's, one intra-op thread each; the cut "
        "is double buffered (two slots). Sequential runs both stages on one thread.",
        "",
        "| stages | cut before | frames | stage times alone (ms) | bound 1/max (fps) | sequential fps | pipelined fps | speedup | identical outputs | edge slot (MB) x2 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in data["pipeline"]:
        stage_ms = " / ".join(f"{1000 * t:.1f}" for t in row["stage_seconds"])
        lines.append(
            f"| {row['stages']} | {row['cut_node']} | {row['frames']} | {stage_ms} | {row['bound_fps']:.3g} | "
            f"{row['sequential_fps']:.3g} | {row['pipelined_fps']:.3g} | {row['speedup']:.2f}x | "
            f"{row['identical_outputs']} | {mb(row['edge_bytes_per_slot'])} |"
        )
    lines += [
        "",
        f"Raw two-thread scaling of this machine at the time (two threads of matrix products vs one "
        f"after the other): {data['thread_scaling']:.2f}x.",
    ]
    lines += [
        "",
        f"Load average at start: {data['machine']['load_average_at_start']}; wall time {data['seconds']:.0f} s.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small inputs and a short search (smoke run)")
    parser.add_argument("--apps", default="1,2,3,4,5,6", help="comma-separated application numbers")
    parser.add_argument("--size", type=int, default=None, help="input height and width (default 224)")
    parser.add_argument("--population", type=int, default=None)
    parser.add_argument("--generations", type=int, default=None)
    args = parser.parse_args()
    size = args.size or (96 if args.quick else 224)
    ga = GAParams(
        population=args.population or (12 if args.quick else 40),
        generations=args.generations or (4 if args.quick else 25),
        seed=0,
    )
    repeats = 1 if args.quick else 2
    # One intra-op thread: on a small shared machine several threads per op spin against
    # other processes and times become meaningless; the pipeline adds its own thread.
    torch.set_num_threads(1)
    start = time.perf_counter()
    cache: dict[str, Any] = {}
    estimator = ProfiledThroughput(repeats=3 if args.quick else 7)
    wanted = set(args.apps.split(","))
    data: dict[str, Any] = {
        "machine": machine(),
        "size": size,
        "ga": {"population": ga.population, "generations": ga.generations, "seed": ga.seed},
        "apps": [],
    }
    for spec in APPS:
        if spec.number in wanted:
            print(f"application {spec.number}: {spec.title}", flush=True)
            data["apps"].append(run_app(spec, size, ga, estimator, cache, repeats))
    print("buffers", flush=True)
    data["buffers"] = buffer_experiment(("mobilenet_v2", "efficientnet_b0", "resnet50"), size, cache)
    print("pipeline", flush=True)
    data["thread_scaling"] = thread_scaling()
    data["pipeline"] = pipeline_experiment(size, 4 if args.quick else 8, cache, estimator)
    data["layer_times_seconds"] = {
        name: {"whole": statistics.fsum(t.whole), "all_parts": statistics.fsum(t.parts)}
        for name, t in estimator.cache.items()
    }
    data["seconds"] = time.perf_counter() - start
    js, md = write_results("minakova" + ("_quick" if args.quick else ""), data, markdown(data))
    print(markdown(data))
    print(f"wrote {js} and {md}")


if __name__ == "__main__":
    main()
