"""Reproduce SwapNet's evaluation (Sections 8.2-8.5) on this machine, scaled down.

Models: YOLOv3, FCN (ResNet-101), VGG-19, ResNet-101 (the paper's 236, 207, 548 and
170 MB networks) at small resolutions. Every configuration runs in its own child
process (own peak RSS; own memory cgroup where one can be created, which also counts
the page cache); memory is reported *net* of the child's footprint after importing
torch, so the figures are the model's, not the interpreter's.

1. **Profile** - one child measures every model and fits the delay model (Section 6.1);
   the other children read that profile.
2. **Single models** - direct inference (DInf: the standard PyTorch workflow, a model
   object with random weights filled by ``load_state_dict`` from the safetensors file,
   which goes through the page cache), layerfit ``preload`` (every weight resident,
   direct I/O) and SwapNet mode at each of the paper's budget ratios for that model
   (self-driving 102/170, 142/236, 124/207, 475/548; RSU 119/170, 165/236, 520/548; UAV
   136/170, 189/236 of the model size).
3. **Ablation** (Section 8.3) at the self-driving ratio: ``copy`` (w/o-uni-add: each
   block copied into fresh tensors), ``instantiate`` (w/o-mod-ske: the block's modules
   instantiated and ``load_state_dict`` per swap), ``equal`` (w/o-pat-sch: equal-size
   blocks, as few as fit, instead of the partition search).
4. **Scenarios** - self-driving (YOLOv3, FCN, VGG-19, ResNet-101), road-side unit
   (2 x YOLOv3, 2 x ResNet-101, VGG-19) and UAV (YOLOv3, ResNet-101) run concurrently,
   one thread per model: direct inference vs SwapNet within the paper's total (843/1161,
   1088/1360 and 325/406 of the demand) split by Eq. 1.
5. **Adaptation** (Fig. 18) - ResNet-101 running at 0.8 of its size, budget lowered
   twice between inferences; time of each switch and the budget held before and after.

Writes bench/results/swapnet.{json,md}. Timings are medians after a warm-up; nothing
here asserts a timing.

    python bench/swapnet.py            # everything (about 10-15 min on 2 idle cores)
    python bench/swapnet.py --quick    # smoke: ResNet-101 at 64x64 only
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from memory_limits import own_memory_cgroup  # noqa: E402
from model_setup import prepared_zoo_model  # noqa: E402
from processes import run_child  # noqa: E402
from reporting import machine, mb, progress, write_results  # noqa: E402

CACHE = Path(__file__).parent / ".cache"
PROFILE = CACHE / "swapnet-profile.json"
MODELS = ["yolov3", "fcn_resnet101", "vgg19", "resnet101"]
RESOLUTION = {"yolov3": 256, "fcn_resnet101": 160, "vgg19": 224, "resnet101": 224}
# per-model budget / model size in the paper's three applications (Section 8.2)
RATIOS = {
    "self-driving": {"vgg19": 475 / 548, "resnet101": 102 / 170, "yolov3": 142 / 236, "fcn_resnet101": 124 / 207},
    "rsu": {"resnet101": 119 / 170, "yolov3": 165 / 236, "vgg19": 520 / 548},
    "uav": {"resnet101": 136 / 170, "yolov3": 189 / 236},
}
SCENARIOS = {
    "self-driving": (["yolov3", "fcn_resnet101", "vgg19", "resnet101"], 843 / 1161),
    "rsu": (["yolov3", "yolov3", "resnet101", "resnet101", "vgg19"], 1088 / 1360),
    "uav": (["yolov3", "resnet101"], (136 + 189) / (170 + 236)),
}
ABLATIONS = ("copy", "instantiate", "equal")
TARGET_MODELS = ("resnet101", "yolov3")


# --- child side ------------------------------------------------------------------------


class Footprint:
    """Peak RSS and cgroup usage from now on, net of the footprint at construction."""

    def __init__(self) -> None:
        import gc

        from layerfit.engine.osmem import reset_peak_rss, rss_bytes

        gc.collect()
        self.cgroup = own_memory_cgroup()
        self.rss0 = rss_bytes()
        reset_peak_rss()
        self.cg0 = None
        if self.cgroup is not None:
            try:
                (self.cgroup / "memory.max_usage_in_bytes").write_text("0")
                self.cg0 = int((self.cgroup / "memory.usage_in_bytes").read_text())
            except OSError:
                self.cgroup = None

    def report(self) -> dict[str, Any]:
        from layerfit.engine.osmem import peak_rss_bytes

        out = {"rss_net_peak_bytes": peak_rss_bytes() - self.rss0, "rss_baseline_bytes": self.rss0}
        if self.cgroup is not None and self.cg0 is not None:
            peak = int((self.cgroup / "memory.max_usage_in_bytes").read_text())
            out["cgroup_net_peak_bytes"] = peak - self.cg0
        return out


def _drop_page_cache(path: Path) -> None:
    """Evict the file's clean pages so a buffered reader pays for (and is charged) them."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _timed(fn, x, repeats: int, warmup: int) -> tuple[Any, list[float]]:
    out = None
    for _ in range(warmup):
        out = fn(x)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn(x)
        times.append(time.perf_counter() - t0)
    return out, times


def load_direct(directory: Path):
    """The standard PyTorch workflow: build the model object, then ``load_state_dict``."""
    import torch
    from safetensors.torch import load_file

    from layerfit.store import ModelSpec, read_manifest

    m = read_manifest(directory)
    spec = ModelSpec(m.model["source"], m.model["name"], m.model.get("kwargs", {}))
    model = spec.factory()(**spec.kwargs).eval()  # the dummy model, random weights
    state = {k: v for k, v in load_file(directory / m.weights_file).items() if not k.startswith("__pad")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    del state
    torch.set_grad_enabled(False)
    return model, m, {"missing_keys": len(missing), "unexpected_keys": len(unexpected)}


def child(args: argparse.Namespace) -> None:
    import torch

    from layerfit.engine import load, output_digest
    from layerfit.engine.units import make_blocks
    from layerfit.store import example_input, read_manifest

    torch.set_grad_enabled(False)
    directory = Path(args.dir) if args.dir else None
    if args.config == "profile":
        from layerfit.tradeoff.swapnet.profile import profile_models

        t0 = time.perf_counter()
        prof = profile_models(args.dirs.split(","), repeats=args.repeats, warmup=1)
        prof.save(args.profile)
        summary = prof.summary()
        summary["seconds"] = time.perf_counter() - t0
        summary["models_detail"] = {
            t.name: {"layers": len(t.nbytes), "preload_s": t.latency_s, "stream_layers_s": t.stream_latency_s,
                     "sum_read_s": sum(t.read_s), "sum_kernel_s": sum(t.kernel_s), "sum_glue_s": sum(t.glue_s)}
            for t in prof.models.values()
        }
        print(json.dumps(summary, default=str))
        return
    if args.config.startswith("scenario"):
        print(json.dumps(child_scenario(args), default=str))
        return
    if args.config == "adapt":
        print(json.dumps(child_adapt(args), default=str))
        return

    m = read_manifest(directory)
    x = example_input(m.input_shape, m.input_dtype, m.seed)
    _drop_page_cache(directory / m.weights_file)
    fp = Footprint()
    result: dict[str, Any] = {"config": args.config}
    t0 = time.perf_counter()
    if args.config == "dinf":
        model, m, info = load_direct(directory)
        result.update(info)
        result["load_s"] = time.perf_counter() - t0
        out, times = _timed(model, x, args.repeats, 1)
    elif args.config == "preload":
        engine = load(directory, pipeline="preload")
        result["load_s"] = time.perf_counter() - t0
        out, times = _timed(engine, x, args.repeats, 1)
        result["accounted_peak_bytes"] = engine.last_weights_peak
    else:
        from layerfit.tradeoff.swapnet.model import SwapNet
        from layerfit.tradeoff.swapnet.partition import SwapNetPlan
        from layerfit.tradeoff.swapnet.profile import load_profile

        plan = SwapNetPlan.build(directory, load_profile(args.profile))
        budget = int(args.budget)
        binding = args.config if args.config in ("copy", "instantiate") else "reference"
        model = SwapNet(directory, budget, plan=plan, binding=binding)
        d = model.decision
        result.update({"budget_bytes": budget, "blocks": d.choice.blocks, "points": list(d.points),
                       "predicted_s": d.choice.predicted_s, "pipeline": d.pipeline, "delta": d.delta,
                       "reserve": plan.reserve.to_dict(), "exec_source": plan.costs.exec_source,
                       "minimum_budget_bytes": plan.minimum_budget})
        if args.config == "equal" and d.pipeline == "async":
            n = d.choice.blocks
            while True:
                sizes = [b.nbytes for b in make_blocks(m.units, f"blocks:{n}")]
                if max(a + b for a, b in zip(sizes, sizes[1:], strict=False)) <= d.capacity or n >= len(m.units):
                    break
                n += 1
            model.engine.reconfigure(units=f"blocks:{n}")
            result.update({"blocks": n, "points": [blk.segments[0].index for blk in model.engine.blocks[1:]]})
        result["load_s"] = time.perf_counter() - t0
        out, times = _timed(model, x, args.repeats, 1)
        result["accounted_peak_bytes"] = model.accounted_peak_bytes
        result["weights_peak_bytes"] = model.engine.last_weights_peak
        model.close()
    result.update(fp.report())
    result.update({"latency_s": statistics.median(times), "latencies_s": times, "output_sha256": output_digest(out)})
    print(json.dumps(result, default=str))


def run_concurrently(
    calls: list[Any], repeats: int, warmup: int, after_each: Any = None
) -> tuple[list[list[float]], list[Any]]:
    """Call each of ``calls`` ``warmup + repeats`` times, all at once, one thread each.

    The threads warm up, meet at a barrier and then time each call: returns every
    thread's latencies and last output. ``after_each(i)`` runs after each timed call of
    thread ``i`` (outside the timing). A thread's error is raised here, after the others
    stop.
    """
    import torch

    latencies: list[list[float]] = [[] for _ in calls]
    outputs: list[Any] = [None] * len(calls)
    barrier = threading.Barrier(len(calls))
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            with torch.no_grad():  # grad mode is per thread
                for _ in range(warmup):
                    calls[i]()
                barrier.wait()
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    outputs[i] = calls[i]()
                    latencies[i].append(time.perf_counter() - t0)
                    if after_each is not None:
                        after_each(i)
        except BaseException as exc:  # re-raised in the caller's thread
            barrier.abort()
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,), name=f"swapnet-bench-{i}") for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    real = [e for e in errors if not isinstance(e, threading.BrokenBarrierError)]
    if real or errors:
        raise (real or errors)[0]
    return latencies, outputs


def child_scenario(args: argparse.Namespace) -> dict[str, Any]:
    from layerfit.engine import output_digest
    from layerfit.store import example_input, read_manifest

    dirs = [Path(d) for d in args.dirs.split(",")]
    for d in dirs:
        _drop_page_cache(d / read_manifest(d).weights_file)
    fp = Footprint()
    if args.config == "scenario-dinf":
        loaded = [load_direct(d) for d in dirs]
        calls = [partial(mdl, example_input(m.input_shape, m.input_dtype, m.seed)) for mdl, m, _ in loaded]
        names = [m.model["name"] for _, m, _ in loaded]
        latencies, outs = run_concurrently(calls, args.repeats, 1)
        rows = [{"name": n, "latency_s": statistics.median(lat), "latencies_s": lat,
                 "output_sha256": output_digest(o)} for n, lat, o in zip(names, latencies, outs, strict=True)]
        return {"config": args.config, "models": rows, **fp.report()}
    return {"config": args.config, **scenario_swapnet(dirs, float(args.fraction), args), **fp.report()}


def scenario_swapnet(dirs: list[Path], fraction: float, args: argparse.Namespace) -> dict[str, Any]:
    """The models within ``fraction`` of their demand, split by Eq. 1, run concurrently as SwapNet."""
    import contextlib

    from layerfit.engine import output_digest
    from layerfit.store import example_call
    from layerfit.tradeoff.swapnet.budget_split import (
        model_names,
        performance_score,
        split_between_models,
    )
    from layerfit.tradeoff.swapnet.model import SwapNet
    from layerfit.tradeoff.swapnet.partition import SwapNetPlan
    from layerfit.tradeoff.swapnet.profile import load_profile

    prof = load_profile(args.profile)
    plans = [SwapNetPlan.build(d, prof) for d in dirs]
    demand = sum(p.demand for p in plans)
    total = int(fraction * demand)
    budgets = split_between_models(total, plans)
    with contextlib.ExitStack() as stack:
        models = [stack.enter_context(SwapNet(p.directory, b, plan=p)) for p, b in zip(plans, budgets, strict=True)]
        weights_peak, accounted_peak = [0] * len(models), [0] * len(models)

        def peaks(i: int) -> None:
            weights_peak[i] = max(weights_peak[i], models[i].engine.last_weights_peak)
            accounted_peak[i] = max(accounted_peak[i], models[i].accounted_peak_bytes)

        calls = []
        for model, plan in zip(models, plans, strict=True):
            x, kwargs = example_call(plan.manifest)
            calls.append(partial(model, *x, **kwargs))
        latencies, outputs = run_concurrently(calls, args.repeats, 1, after_each=peaks)
        rows = []
        for i, (name, model, plan) in enumerate(zip(model_names(plans), models, plans, strict=True)):
            d = model.decision
            rows.append({
                "name": name, "budget_bytes": d.budget, "blocks": d.choice.blocks, "points": list(d.points),
                "latency_s": statistics.median(latencies[i]), "latencies_s": latencies[i],
                "weights_peak_bytes": weights_peak[i], "accounted_peak_bytes": accounted_peak[i],
                "demand_bytes": plan.demand, "minimum_budget_bytes": plan.minimum_budget,
                "performance_score": performance_score(plan.costs.direct_s, plan.demand),
                "predicted_s": d.choice.predicted_s, "output_sha256": output_digest(outputs[i]),
            })
    return {"total_budget_bytes": total, "total_demand_bytes": demand, "models": rows}


def child_adapt(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from layerfit.engine import output_digest
    from layerfit.errors import PartitionError
    from layerfit.store import example_input
    from layerfit.tradeoff.swapnet.model import SwapNet
    from layerfit.tradeoff.swapnet.partition import SwapNetPlan
    from layerfit.tradeoff.swapnet.profile import load_profile

    directory = Path(args.dir)
    plan = SwapNetPlan.build(directory, load_profile(args.profile))
    m = plan.manifest
    x = example_input(m.input_shape, m.input_dtype, m.seed)
    size = plan.costs.total_bytes
    steps = []
    with SwapNet(directory, int(0.8 * size), plan=plan) as model:
        reference = model(x)
        _, times = _timed(model, x, args.repeats, 0)
        steps.append({"budget_bytes": model.budget, "blocks": model.decision.choice.blocks,
                      "latency_s": statistics.median(times), "accounted_peak_bytes": model.accounted_peak_bytes,
                      "within_budget": model.accounted_peak_bytes <= model.budget})
        for ratio in (0.7, 0.6):
            change = model.set_budget(int(ratio * size))
            out, times = _timed(model, x, args.repeats, 0)
            steps.append({**change.to_dict(), "budget_bytes": model.budget, "blocks": model.decision.choice.blocks,
                          "latency_s": statistics.median(times), "accounted_peak_bytes": model.accounted_peak_bytes,
                          "within_budget": model.accounted_peak_bytes <= model.budget,
                          "bit_identical": bool(torch.equal(out, reference))})
        try:
            model.set_budget(plan.minimum_budget - 4096)
            refused = False
        except PartitionError:
            refused = True
        out = model(x)
        steps.append({"below_minimum_refused": refused, "still_runs_bit_identical": bool(torch.equal(out, reference)),
                      "within_budget": model.accounted_peak_bytes <= model.budget})
    return {"config": "adapt", "model": plan.name, "steps": steps, "output_sha256": output_digest(reference)}


# --- parent side ---------------------------------------------------------------------------


def prepare_model(name: str, resolution: int) -> Path:
    return prepared_zoo_model(name, resolution, CACHE)


def _child(config: str, options: argparse.Namespace, **kw: str) -> dict[str, Any]:
    """Run one configuration in its own child, with the run's repeats and profile file."""
    args = ["--config", config, "--repeats", str(options.repeats), "--profile", str(options.profile)]
    for k, v in kw.items():
        args += [f"--{k}", str(v)]
    t0 = time.perf_counter()
    r = run_child(__file__, args)
    r["wall_s"] = time.perf_counter() - t0
    print(f"  {config} {kw.get('budget', '')}: {r['wall_s']:.0f}s "
          f"{r.get('latency_s', r.get('error', ''))}", flush=True)
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--dir")
    ap.add_argument("--dirs")
    ap.add_argument("--config")
    ap.add_argument("--budget")
    ap.add_argument("--fraction")
    ap.add_argument("--profile", default=str(PROFILE))
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--resolution", type=int, help="one resolution for every model (default: per model)")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smoke test: ResNet-101 at 64x64 only")
    ap.add_argument("--output", default="swapnet")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    if args.quick:
        args.models, args.resolution, args.repeats = "resnet101", 64, 2
        args.output = args.output if args.output != "swapnet" else "swapnet-quick"
    started = time.perf_counter()
    names = args.models.split(",")
    CACHE.mkdir(parents=True, exist_ok=True)
    dirs = {}
    for name in names:
        t0 = time.perf_counter()
        dirs[name] = prepare_model(name, args.resolution or RESOLUTION[name])
        print(f"prepared {name}: {time.perf_counter() - t0:.0f}s", flush=True)
    print("profile", flush=True)
    profile = _child("profile", args, dirs=",".join(str(d) for d in dirs.values()))
    if "error" in profile:
        raise SystemExit(f"profiling failed: {profile['error']}")

    from layerfit.store import read_manifest

    models: dict[str, Any] = {}
    for name in progress(names, "swapnet: models"):
        print(name, flush=True)
        size = read_manifest(dirs[name]).total_bytes
        row: dict[str, Any] = {"model": name, "resolution": read_manifest(dirs[name]).input_shape[-1],
                               "weights_bytes": size, "configs": {}}
        for config in ("dinf", "preload"):
            row["configs"][config] = _child(config, args, dir=dirs[name])
        ratios = sorted({r[name] for r in RATIOS.values() if name in r}) if not args.quick else [0.6]
        for ratio in ratios:
            row["configs"][f"swapnet@{ratio:.3f}"] = _child("swapnet", args, dir=dirs[name],
                                                              budget=int(ratio * size))
        ablation_ratio = RATIOS["self-driving"].get(name, ratios[0]) if not args.quick else 0.6
        row["ablation_ratio"] = ablation_ratio
        for config in ABLATIONS:
            row["configs"][f"{config}@{ablation_ratio:.3f}"] = _child(config, args, dir=dirs[name],
                                                                     budget=int(ablation_ratio * size))
        models[name] = row

    scenarios: dict[str, Any] = {}
    plan = SCENARIOS if not args.quick else {"2x resnet101": (["resnet101", "resnet101"], 0.7)}
    for sname, (members, fraction) in plan.items():
        if sname not in args.scenarios.split(",") and not args.quick:
            continue
        if any(m not in dirs for m in members):
            continue
        print(f"scenario {sname}", flush=True)
        joined = ",".join(str(dirs[m]) for m in members)
        scenarios[sname] = {
            "fraction": fraction,
            "direct": _child("scenario-dinf", args, dirs=joined),
            "swapnet": _child("scenario-swapnet", args, dirs=joined, fraction=fraction),
        }
    adaptation = None
    if "resnet101" in dirs:
        print("adaptation", flush=True)
        adaptation = _child("adapt", args, dir=dirs["resnet101"])
    data = {"benchmark": "swapnet", "machine": machine(), "profile": profile, "models": models,
            "scenarios": scenarios, "adaptation": adaptation, "seconds": time.perf_counter() - started,
            "args": {k: v for k, v in vars(args).items() if k not in ("child", "dir", "dirs", "config", "budget", "fraction")}}
    md = markdown(data)
    write_results(args.output, data, md)
    print(md)


# --- report ----------------------------------------------------------------------------------


def _mem(r: dict[str, Any]) -> int | None:
    return r.get("cgroup_net_peak_bytes", r.get("rss_net_peak_bytes"))


def markdown(data: dict[str, Any]) -> str:
    prof = data["profile"]
    c, f = prof.get("coefficients", {}), prof.get("fits", {})
    lines = [
        "# SwapNet on this machine",
        "",
        f"{data['machine']['cpu']}, {data['machine']['cores']} cores, torch {data['machine']['torch']}; "
        f"load average at start {data['machine']['load_average_at_start']}; total {data['seconds'] / 60:.1f} min.",
        "",
        "## Delay model (Section 6.1)",
        "",
        "| delay | fit | R² |",
        "|---|---|---|",
    ]
    if f:
        lines += [
            f"| t_in = α·s + β·d + κ | α {c['alpha_s_per_byte']:.3e} s/B, β {c['beta_s_per_tensor']:.3e} s/tensor, "
            f"κ {c['kappa_read_s_per_block']:.3e} s/block | {f['t_in']['r2']:.3f} |",
            f"| t_in = α·s + β·d (paper's form) | α {f['t_in_paper']['coefficients']['alpha']:.3e}, "
            f"β {f['t_in_paper']['coefficients']['beta']:.3e} | {f['t_in_paper']['r2']:.3f} |",
            f"| t_ex = γ·f | γ {c['gamma_s_per_mac']:.3e} s/MAC (glue ratio {c['glue_ratio']:.3f}) | {f['t_ex']['r2']:.3f} |",
            f"| t_out = η·d | η {c['eta_s_per_tensor']:.3e} s/tensor | {f['t_out']['r2']:.3f} |",
            f"| block hand-over | {c['kappa_exec_s_per_block'] * 1e3:.3f} ms/block | - |",
        ]
    lines += [
        "",
        "## Single models: direct inference vs SwapNet, and the ablation",
        "",
        "Memory is the child's peak net of its footprint after importing torch: cgroup (counts the page cache) "
        "where available, else RSS. `accounted` is SwapNet's own ledger (weights peak + reserve δ). "
        "Ratios are budget / model size; Δ are against DInf.",
        "",
        "| model | config | budget MB | blocks | latency ms | Δ latency | memory MB | vs DInf memory | RSS MB | accounted MB | predicted ms | same output |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for name, row in data["models"].items():
        dinf = row["configs"].get("dinf", {})
        for config, r in row["configs"].items():
            if "latency_s" not in r:
                lines.append(f"| {name} | {config} | | | error: {r.get('error')} | | | | | | | |")
                continue
            dl = r["latency_s"] / dinf["latency_s"] - 1 if "latency_s" in dinf else None
            dm = _mem(r) / _mem(dinf) if _mem(dinf) else None
            pred = "-" if r.get("predicted_s") is None else f"{r['predicted_s'] * 1e3:.0f}"
            same = r.get("output_sha256") == dinf.get("output_sha256")
            lines.append(
                f"| {name} @{row['resolution']} | {config} | {mb(r.get('budget_bytes'))} | {r.get('blocks', '-')} | "
                f"{r['latency_s'] * 1e3:.0f} | {'-' if dl is None else f'{dl:+.1%}'} | {mb(_mem(r))} | "
                f"{'-' if dm is None else f'{dm:.0%}'} | {mb(r.get('rss_net_peak_bytes'))} | "
                f"{mb(r.get('accounted_peak_bytes'))} | "
                f"{pred} | {'yes' if same else 'NO'} |"
            )
            if name in TARGET_MODELS and config.startswith("swapnet@") and dl is not None and dm is not None:
                ok = dl <= 0.10 and dm <= 0.40
                verdicts.append(f"- {name} {config}: latency {dl:+.1%}, memory {dm:.0%} of DInf -> "
                                f"{'meets' if ok else 'misses'} the target (<= +10 %, <= 40 %)")
    if verdicts:
        lines += ["", "Target (ResNet-101, YOLOv3: latency within 10 % of DInf at <= 40 % of its peak memory):", "", *verdicts]
    if data["scenarios"]:
        lines += ["", "## Scenarios: several models concurrently (one thread each)", ""]
        for sname, sc in data["scenarios"].items():
            sw, di = sc["swapnet"], sc["direct"]
            if "models" not in sw or "models" not in di:
                lines.append(f"- {sname}: error {sw.get('error') or di.get('error')}")
                continue
            lines += [
                f"### {sname}: total {mb(sw['total_budget_bytes'])} MB of {mb(sw['total_demand_bytes'])} MB demand "
                f"({sc['fraction']:.3f}); process memory direct {mb(_mem(di))} MB, SwapNet {mb(_mem(sw))} MB",
                "",
                "| model | Eq. 1 budget MB | blocks | direct ms | SwapNet ms | Δ | accounted MB | same output |",
                "|---|---|---|---|---|---|---|---|",
            ]
            for a, b in zip(di["models"], sw["models"], strict=False):
                lines.append(
                    f"| {b['name']} | {mb(b['budget_bytes'])} | {b['blocks']} | {a['latency_s'] * 1e3:.0f} | "
                    f"{b['latency_s'] * 1e3:.0f} | {b['latency_s'] / a['latency_s'] - 1:+.1%} | "
                    f"{mb(b['accounted_peak_bytes'])} | {'yes' if a['output_sha256'] == b['output_sha256'] else 'NO'} |"
                )
            lines.append("")
    ad = data.get("adaptation")
    if ad and "steps" in ad:
        lines += ["## Adaptation (Fig. 18)", ""]
        for s in ad["steps"]:
            if "seconds" in s:
                lines.append(
                    f"- budget -> {mb(s['budget_bytes'])} MB: {s['blocks']} blocks, switch {s['seconds'] * 1e3:.0f} ms "
                    f"(lookup {s['lookup_s'] * 1e3:.2f} ms), then {s['latency_s'] * 1e3:.0f} ms/inference, "
                    f"peak {mb(s['accounted_peak_bytes'])} MB, within budget: {s['within_budget']}, "
                    f"same output: {s['bit_identical']}"
                )
            elif "below_minimum_refused" in s:
                lines.append(f"- below the minimum: refused {s['below_minimum_refused']}, old partition still runs "
                             f"(same output {s['still_runs_bit_identical']}, within budget {s['within_budget']})")
            else:
                lines.append(f"- start at {mb(s['budget_bytes'])} MB: {s['blocks']} blocks, "
                             f"{s['latency_s'] * 1e3:.0f} ms/inference, within budget: {s['within_budget']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
