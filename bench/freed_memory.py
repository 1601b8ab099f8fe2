"""When freed scratch leaves the process: ``Runtime(return_freed_memory=...)`` compared.

The budget counts what the scheduler hands out; what a forward pass frees must also leave
the process, or it stays resident in glibc's heap beside the budget. How eagerly it
leaves trades resident memory against page faults, and the setting is process-wide, so
each run here is a fresh child process:

- ``eagerly``: every block of 4 MiB or more is a mapping of its own and the heap gives
  its free top back above 128 KiB (the runtime's setting until this bench);
- ``after-pass`` (the default): the same 4 MiB mappings, but the heap keeps up to
  16 MiB of free top during a pass, and ``malloc_trim`` gives every free page back when
  each network's forward pass ends;
- ``never``: glibc's adaptive thresholds, which keep freed blocks of up to 32 MiB.

Two workloads, each run in every mode, modes interleaved over ``--rounds``:

- ``thesis``: the thesis's nine networks at 64 px under masa-fcfs at 378.7 MB (the
  workload on which the eager setting was chosen): 24 jobs of 1-3 random networks,
  submitted at once, twice;
- ``edge``: four zoo models at their own resolutions (mobilenet_v1_025, blazeface,
  deeplab_v3, mobilenet_v2 at 224 px) under masa-fair at 32.8 MB with the weight cache:
  32 single-model requests at once, twice.

Per run: mean response, RSS sampled every 3 ms (median, p95, max) and RSS when idle
after the run; then the median of 25 lone requests of mobilenet_v2 at 224 px with every
weight cached (compute only, where the allocator's faults show). Outputs are checked
bit for bit against each model run in the same process, preloaded. Writes
``bench/results/freed_memory.{json,md}``::

    .venv/bin/python bench/freed_memory.py
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_setup import prepared_zoo_model  # noqa: E402
from processes import off_main, run_child  # noqa: E402
from reporting import machine, mb, write_results  # noqa: E402

CACHE = Path(__file__).parent / ".cache"
REFERENCES = CACHE / "freed_memory_references.safetensors"
MODES = ("eagerly", "after-pass", "never")
EDGE_MODELS = ("mobilenet_v1_025", "blazeface", "deeplab_v3", "mobilenet_v2")
WORKLOADS = {
    "thesis": {"budget": int(378.7e6), "policy": "masa-fcfs", "units": "layers", "cache_weights": False},
    "edge": {"budget": int(32.8e6), "policy": "masa-fair", "units": "merge:auto", "cache_weights": True},
}
LONE = "mobilenet_v2"


def repositories() -> dict[str, Path]:
    from layerfit import zoo
    from layerfit.schedule.experiments.thesis_zoo import THESIS_ZOO, prepare_thesis_models

    thesis = CACHE / "masa-64"
    prepare_thesis_models(thesis, tuple(THESIS_ZOO), resolution=64)
    edge = CACHE / "weight_cache"  # shared with bench/weight_cache.py: the same models
    for name in EDGE_MODELS:
        prepared_zoo_model(name, zoo.get(name).input_shape[-1], edge)
    return {"thesis": thesis, "edge": edge}


def model_names(repository: Path) -> list[str]:
    return sorted(p.name for p in repository.iterdir() if (p / "manifest.json").exists())


def model_inputs(repository: Path) -> dict[str, Any]:
    from layerfit.store import example_input, read_manifest

    manifests = {n: read_manifest(repository / n) for n in model_names(repository)}
    return off_main(lambda: {n: example_input(m.input_shape, m.input_dtype, seed=1) for n, m in manifests.items()})


def save_references(repos: dict[str, Path]) -> None:
    """Every model's output, preloaded, for the children to check against (computed here,
    so that no child's memory holds a preloaded model)."""
    from safetensors.torch import save_file

    import layerfit

    def output(directory: Path, x: Any) -> Any:
        engine = layerfit.load(directory, pipeline="preload")
        try:
            return engine(x).contiguous()
        finally:
            engine.close()

    refs = {}
    for workload, repository in repos.items():
        inputs = model_inputs(repository)
        refs.update(off_main(lambda r=repository, i=inputs, w=workload: {
            f"{w}/{n}": output(r / n, i[n]) for n in model_names(r)}))
    save_file(refs, str(REFERENCES))


def child(mode: str, workload: str, repository: Path, edge: Path) -> dict[str, Any]:
    """One mode on one workload in this fresh process; then the lone requests."""
    import torch
    from safetensors.torch import load_file

    from layerfit.engine.osmem import rss_bytes
    from layerfit.schedule.runtime.executor import Job, Runtime

    names = model_names(repository)
    inputs = model_inputs(repository)
    refs = load_file(str(REFERENCES))
    expected = {n: refs[f"{workload}/{n}"] for n in names}
    config = WORKLOADS[workload]
    rng = random.Random(0)
    if workload == "thesis":
        jobs = [tuple(rng.sample(names, rng.randint(1, 3))) for _ in range(24)]
    else:
        jobs = [(names[i % len(names)],) for i in range(32)]
    out: dict[str, Any] = {"mode": mode, "workload": workload}
    with Runtime(
        repository, config["budget"], workers=2, policy=config["policy"], units=config["units"],
        cache_weights=config["cache_weights"], return_freed_memory=mode,
    ) as rt:
        out["freed_memory"] = rt.stats()["freed_memory"]
        for n in names:  # warm: every model once
            rt.infer(n, inputs[n]).result(300)
        samples: list[int] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                samples.append(rss_bytes())
                time.sleep(0.003)

        idle_before = rss_bytes()
        sampler = threading.Thread(target=sample)
        sampler.start()
        responses = []
        try:
            for _ in range(2):
                futures = [(time.perf_counter(), job, rt.submit(Job(job, {n: inputs[n] for n in job}))) for job in jobs]
                while futures:  # each answer checked and dropped, so live outputs do not fill RSS
                    t, job, future = futures.pop(0)
                    result = future.result(600)
                    responses.append(time.perf_counter() - t)
                    bad = off_main(lambda result=result, job=job: [n for n in job if not torch.equal(result[n], expected[n])])
                    if bad:
                        raise SystemExit(f"{', '.join(bad)}: the output differs from the preloaded model's")
                    del result, future
        finally:
            stop.set()
            sampler.join()
        samples.sort()
        out.update({
            "mean_response_s": statistics.mean(responses),
            "rss_idle_before_bytes": idle_before,
            "rss_median_bytes": statistics.median(samples),
            "rss_p95_bytes": samples[int(0.95 * (len(samples) - 1))],
            "rss_max_bytes": samples[-1],
            "rss_idle_after_bytes": rss_bytes(),
            "ledger_peak_bytes": rt.stats()["peak_bytes"],
        })
    # compute only: every weight of mobilenet_v2 cached, one request at a time
    name = f"{LONE}-224"
    x = model_inputs(edge)[name]
    want = refs[f"edge/{name}"]
    with Runtime(edge, "200MB", workers=2, units="merge:auto", cache_weights=True,
                 return_freed_memory=mode, load=False) as rt:
        rt.load_model(name)
        for _ in range(3):
            rt.infer(name, x).result(300)
        lone = []
        for _ in range(25):
            t = time.perf_counter()
            y = rt.infer(name, x).result(300)
            lone.append(time.perf_counter() - t)
        if not off_main(lambda: torch.equal(y, want)):
            raise SystemExit(f"{name}: the output differs from the preloaded model's")
    out["lone_median_s"] = statistics.median(lone)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", nargs=2, metavar=("MODE", "WORKLOAD"), help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=3, help="runs of every mode and workload, interleaved")
    p.add_argument("--workloads", default="thesis,edge")
    p.add_argument("--output", default="freed_memory")
    args = p.parse_args(argv)
    if args.child:
        mode, workload = args.child
        repos = repositories()
        print(json.dumps(child(mode, workload, repos[workload], repos["edge"])))
        return 0
    t0 = time.perf_counter()
    save_references(repositories())  # prepared once, before any child runs
    runs: list[dict[str, Any]] = []
    for r in range(args.rounds):
        for workload in args.workloads.split(","):
            for mode in MODES:
                run = run_child(__file__, [mode, workload])
                if "error" in run:
                    raise SystemExit(f"{mode} on {workload} failed: {run['error']}")
                run["round"] = r
                runs.append(run)
                print(f"round {r} {workload} {mode}: mean {run['mean_response_s']:.3f} s, RSS p95 "
                      f"{mb(run['rss_p95_bytes'])} MB, lone {run['lone_median_s'] * 1e3:.1f} ms", flush=True)
    data = {"machine": machine(), "rounds": args.rounds, "workloads": WORKLOADS, "runs": runs,
            "summary": summary(runs), "wall_s": time.perf_counter() - t0}
    write_results(args.output, data, markdown(data))
    print(markdown(data))
    return 0


def summary(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per workload and mode, the median over rounds of each measure."""
    keys = ("mean_response_s", "rss_median_bytes", "rss_p95_bytes", "rss_max_bytes", "rss_idle_before_bytes",
            "rss_idle_after_bytes", "lone_median_s")
    values: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for run in runs:
        for k in keys:
            values[run["workload"], run["mode"], k].append(run[k])
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (workload, mode, k), v in values.items():
        out.setdefault(workload, {}).setdefault(mode, {})[k] = statistics.median(v)
    return out


def markdown(data: dict[str, Any]) -> str:
    m = data["machine"]
    lines = [
        "# When freed scratch leaves the process (`Runtime(return_freed_memory=...)`)",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}. Each run a fresh process; medians "
        f"of {data['rounds']} interleaved rounds (each round's values in the JSON). Mean response: the "
        "workload's jobs submitted at once, twice (thesis 24, edge 32). RSS sampled every 3 ms meanwhile; each "
        "answer is checked and dropped as it comes. Lone: mobilenet_v2 at 224 px, "
        "every weight cached, median of 25 requests. Outputs checked bit for bit.",
        "",
        "| workload | mode | mean response s | RSS median MB | RSS p95 MB | RSS max MB | RSS idle after (before) MB | lone mobilenet_v2 ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for workload, modes in data["summary"].items():
        config = data["workloads"][workload]
        for mode in MODES:
            s = modes.get(mode)
            if s is None:
                continue
            lines.append(
                f"| {workload} ({config['policy']}, {mb(config['budget'])} MB) | {mode} | {s['mean_response_s']:.3f} "
                f"| {mb(s['rss_median_bytes'])} | {mb(s['rss_p95_bytes'])} | {mb(s['rss_max_bytes'])} "
                f"| {mb(s['rss_idle_after_bytes'])} ({mb(s['rss_idle_before_bytes'])}) | {s['lone_median_s'] * 1e3:.1f} |"
            )
    lines += ["", f"Wall time {data['wall_s']:.0f} s."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
