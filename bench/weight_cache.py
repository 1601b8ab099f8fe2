"""The runtime's weight cache: what spare budget buys a server of several models.

``Runtime(cache_weights=True)`` (``layerfit serve``'s default) keeps the units that earlier
requests loaded in the part of the budget no task needs, and a later request of the same
model takes them instead of reading them again. This bench serves several zoo models from
one runtime (``units="merge:auto"``, the server's default) at budgets from the tightest one
every model runs in up to one that holds every weight beside the working set, with the
cache on and off, and measures per budget and setting:

- the median latency of a lone request (submit to result), the models requested in turn,
  next to the same model preloaded (every weight resident: the plain-PyTorch speed);
- requests per second with ``--concurrent`` requests of mixed models in flight;
- the share of unit loads served from the cache, and the ledger's peak (never above the
  budget: the cache gives memory back to any task that needs it).

With ``--storage sd`` every timed request and wave starts with the throttle settled
(``Storage.settle``), so none is credited with the disk's idle time before it.

Settings are measured in alternating rounds in one process, so slow drift of a shared
machine affects them alike. Every output is checked against the preloaded model's, bit for
bit. Nothing asserts a timing.

The bench's own tensor work (inputs, the preloaded references, the output checks) runs on
short-lived threads, never on the main thread: with more than one intra-op thread every
thread that runs PyTorch kernels keeps an OpenMP team of its own, and two teams slow each
other down (see the README), which would slow the runtime's forward threads for reasons
that have nothing to do with it. The preloaded model is timed on a fresh thread per call
too, as the runtime runs each network. Writes ``bench/results/weight_cache.{json,md}``::

    .venv/bin/python bench/weight_cache.py
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_setup import prepared_zoo_model  # noqa: E402
from processes import off_main  # noqa: E402
from reporting import machine, mb, write_results  # noqa: E402
from storage import Storage  # noqa: E402

CACHE = Path(__file__).parent / ".cache" / "weight_cache"
DEFAULT_MODELS = "mobilenet_v1_025,blazeface,deeplab_v3,mobilenet_v2"
# budgets: the tightest (every model runs) plus these fractions of all weights beyond it
DEFAULT_EXTRA = "0,0.25,0.5,1.0"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=DEFAULT_MODELS)
    p.add_argument("--extra", default=DEFAULT_EXTRA,
                   help="budgets: the tightest plus each of these fractions of the models' weights")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=2, help="lone requests per model, setting and round")
    p.add_argument("--concurrent", type=int, default=8, help="requests per wave for the throughput column")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--policy", default="masa-fair")
    p.add_argument("--units", default="merge:auto")
    p.add_argument("--storage", default="vm", help="vm: this machine's disk as it is; sd: reads throttled "
                   "(cgroup v1 blkio, root) to a Raspberry Pi 4's microSD card, where reading is what costs")
    p.add_argument("--output", default="weight_cache")
    args = p.parse_args(argv)
    t0 = time.perf_counter()

    import layerfit
    from layerfit import zoo
    from layerfit.schedule.runtime.executor import Runtime
    from layerfit.store import example_input, read_manifest

    names = args.models.split(",")
    directories = {n: prepared_zoo_model(n, zoo.get(n).input_shape[-1], CACHE) for n in names}
    for stale in set(CACHE.iterdir()) - set(directories.values()):
        raise SystemExit(f"{CACHE} holds {stale.name} too: remove it (the runtime serves every folder)")
    models = {n: d.name for n, d in directories.items()}  # zoo name -> the runtime's model name
    manifests = {n: read_manifest(d) for n, d in directories.items()}
    inputs = off_main(lambda: {n: example_input(m.input_shape, m.input_dtype, seed=1) for n, m in manifests.items()})
    weights = sum(m.total_bytes for m in manifests.values())

    preloaded = off_main(lambda: {n: layerfit.load(d, pipeline="preload") for n, d in directories.items()})
    reference = off_main(lambda: {n: preloaded[n](inputs[n]) for n in names})
    with Runtime(CACHE, "64GB", workers=args.workers, policy=args.policy, units=args.units) as probe:
        tightest = max(probe.models[models[n]].profile.min_budget for n in names)
    budgets = [int(tightest + float(f) * weights) for f in args.extra.split(",")]
    settings = [(b, c) for b in budgets for c in (False, True)]
    runtimes = {
        s: Runtime(CACHE, s[0], workers=args.workers, policy=args.policy, units=args.units, cache_weights=s[1])
        for s in settings
    }
    lone: dict[Any, dict[str, list[float]]] = {s: {n: [] for n in names} for s in [*settings, "preload"]}
    waves: dict[Any, list[float]] = {s: [] for s in settings}
    mixed = list(itertools.islice(itertools.cycle(names), args.concurrent))
    storage = Storage(args.storage, CACHE)

    def check(outputs: list[tuple[str, Any]], where: str) -> None:
        bad = off_main(lambda: [n for n, y in outputs if not bool((y == reference[n]).all())])
        if bad:
            raise SystemExit(f"{', '.join(bad)} {where}: the output differs from the preloaded model's")

    try:
        for s, rt in runtimes.items():  # warm up: every model once, outputs checked
            check([(n, rt.infer(models[n], inputs[n]).result(300)) for n in names], f"budget {s[0]} cache {s[1]}")
            rt.clear_trace()
        storage.enter_here()  # from here on every unit read goes through the throttle, if any
        for _ in range(args.rounds):
            for _ in range(args.requests):
                for n in names:
                    t = time.perf_counter()
                    off_main(lambda n=n: preloaded[n](inputs[n]))
                    lone["preload"][n].append(time.perf_counter() - t)
            for s, rt in runtimes.items():
                outputs = []
                for _ in range(args.requests):
                    for n in names:
                        storage.settle()  # the throttle must not credit this request with idle time
                        t = time.perf_counter()
                        outputs.append((n, rt.infer(models[n], inputs[n]).result(300)))
                        lone[s][n].append(time.perf_counter() - t)
                storage.settle()
                t = time.perf_counter()
                futures = [(n, rt.infer(models[n], inputs[n])) for n in mixed]
                outputs += [(n, f.result(300)) for n, f in futures]
                waves[s].append(len(mixed) / (time.perf_counter() - t))
                check(outputs, f"budget {s[0]} cache {s[1]}")
        stats = {s: rt.stats() for s, rt in runtimes.items()}
    finally:
        storage.leave_here()
        storage.remove()
        for rt in runtimes.values():
            rt.shutdown()
        for engine in preloaded.values():
            engine.close()

    median = {s: {n: statistics.median(v) for n, v in per.items()} for s, per in lone.items()}
    rows = []
    for s in settings:
        cache = stats[s]["weight_cache"] or {}
        loads = (cache.get("hits") or 0) + (cache.get("misses") or 0)
        requests = stats[s]["jobs"]["done"]
        rows.append({
            "budget_bytes": s[0],
            "cache_weights": s[1],
            "lone_median_s": median[s],
            "lone_samples_s": lone[s],
            "lone_over_preload": {n: median[s][n] / median["preload"][n] for n in names},
            "lone_over_no_cache": {n: median[s][n] / median[(s[0], False)][n] for n in names},
            "concurrent_per_s": statistics.median(waves[s]),
            "hit_share": cache.get("hits", 0) / loads if loads else None,
            "read_bytes_per_request": stats[s]["unit_bytes_read"] / requests,
            "evictions": cache.get("evictions"),
            "ledger_peak_bytes": stats[s]["peak_bytes"],
            "progress_rule_fired": stats[s]["progress_rule_fired"],
            "cached_bytes_at_end": cache.get("bytes"),
        })
    data = {
        "machine": machine(), "policy": args.policy, "workers": args.workers, "units": args.units,
        "rounds": args.rounds, "requests": args.requests, "concurrent": args.concurrent,
        "torch_threads_env": os.environ.get("OMP_NUM_THREADS"), "storage": storage.describe(),
        "settle_s": storage.SETTLE_S if storage.throttle else 0.0,
        "models": {n: {"weights_bytes": manifests[n].total_bytes, "preload_median_s": median["preload"][n]}
                   for n in names},
        "weights_bytes": weights, "tightest_budget_bytes": tightest, "rows": rows,
        "wall_s": time.perf_counter() - t0,
    }
    js, md = write_results(args.output, data, markdown(data))
    print(markdown(data))
    print(f"wrote {js} and {md}")
    return 0


def storage_text(storage: dict[str, Any]) -> str:
    if storage["kind"] != "sd":
        return "this VM's disk as it is"
    return (f"throttled to a Raspberry Pi 4's microSD card ({storage['read_bps'] / 1e6:.1f} MB/s, "
            f"{storage['read_iops']} reads/s)")


def markdown(data: dict[str, Any]) -> str:
    m = data["machine"]
    names = list(data["models"])
    lines = [
        "# The runtime's weight cache: what spare budget buys",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, OMP_NUM_THREADS "
        f"{data['torch_threads_env'] or 'unset'}, storage {storage_text(data['storage'])}, load average at start "
        f"{', '.join(f'{v:.1f}' for v in m['load_average_at_start'])}. One runtime per row serving "
        f"{', '.join(names)} ({mb(data['weights_bytes'])} MB of weights in all), policy {data['policy']}, "
        f"{data['workers']} workers, units {data['units']}. The tightest budget is the largest of the models' "
        f"minimum budgets ({mb(data['tightest_budget_bytes'])} MB). Lone requests: the models in turn, "
        f"median of {data['rounds']} alternating rounds x {data['requests']} per model, submit to result, ms "
        "(the ratio to the same model preloaded, run on a fresh thread as the runtime runs each network, in brackets). Throughput: waves of "
        f"{data['concurrent']} requests of mixed models, median over the rounds. Hits: the share of unit "
        "loads the cache served (warm-up excluded). Every output was checked against the preloaded model's, "
        "bit for bit."
        + (f" Each timed request and wave starts after {data['settle_s']:g} s idle: the throttle would credit "
           "reads that start sooner with the idle part of its time slice (up to twice the card's speed, "
           "bench/sd_throttle.py), which a card never does." if data.get("settle_s") else ""),
        "",
        "| budget MB | cache | " + " | ".join(f"{n} ms" for n in names)
        + f" | {data['concurrent']} at once, per s | MB read per request | hits | evictions | ledger peak MB |",
        "|---:|---|" + "---:|" * (len(names) + 5),
        "| preload | - | " + " | ".join(f"{data['models'][n]['preload_median_s'] * 1e3:.1f}" for n in names)
        + " | - | - | - | - | - |",
    ]
    for r in data["rows"]:
        cells = [f"{r['lone_median_s'][n] * 1e3:.1f} ({r['lone_over_preload'][n]:.1f}x)" for n in names]
        hits = "-" if r["hit_share"] is None else f"{r['hit_share']:.0%}"
        lines.append(
            f"| {mb(r['budget_bytes'])} | {'on' if r['cache_weights'] else 'off'} | " + " | ".join(cells)
            + f" | {r['concurrent_per_s']:.1f} | {mb(r['read_bytes_per_request'])} | {hits} | {r['evictions'] if r['evictions'] is not None else '-'} "
            f"| {mb(r['ledger_peak_bytes'])} |"
        )
    lines += ["", f"Wall time {data['wall_s']:.0f} s."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
