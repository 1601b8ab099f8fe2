"""MASA against Bulk, DeepEye and the other policies: real executor and simulator (thesis Ch. 7).

The thesis's networks are mapped to zoo architectures (AgeNet/GenderNet, AlexNet-style
FaceNet/SoS/MemNet/SceneNet, VGG-S EmotionNet, GoogLeNet, Tiny-YOLOv2; see
``layerfit.schedule.experiments.thesis_zoo``) and prepared at a small input resolution where the
architecture allows it. Each prepared model is profiled once on this machine with the
``/proc/self/statm`` profiler (thesis §5.3): those profiles are what the real executor's
scheduler is told, what the stochastic workloads' arrival rates are derived from, and
what the simulator simulates. The contention model is measured with them (both are
cached next to the models; ``--reprofile`` measures again).

Scenarios: batch ``small-3`` (AgeNet, GenderNet, TinyYOLO) and ``mixed-3`` (AgeNet,
EmotionNet, FaceNet), closed (each image arrives when the previous one is analysed);
stochastic I ``random-arrivals`` (one of the nine networks per image) and III
``all-random`` (1..``--max-networks`` networks per image), normal inter-arrival times at
traffic intensity ρ. Budgets are the sum of the scenario's networks' bulk peaks × 0.25,
0.5 and 1.0, raised to the largest single task where that is more (else every job
would be rejected; the table says so).

Bulk is the thesis's: EdgeCaffe's ``BulkOrchestrator`` gives it one worker (DeepEye gets
two, one per pool). ``bulk-multi`` (every worker loads) runs beside it as the stronger
whole-network baseline, and the targets are also reported against it.

1. **Real executor** (``layerfit.Runtime``, 2 workers), every (scenario, budget, policy)
   in its own child process: MASA, masa-fcfs (MASA's rules in arrival order, as EdgeCaffe's
   code orders them: ``layerfit.schedule.policies.masa_fcfs``), masa-fair (masa-fcfs with the
   Banker's safety check of ``layerfit.schedule.policies.masa_fair``), Bulk, bulk-multi and
   DeepEye everywhere, the
   other policies on small-3 at the tightest budget; the stochastic scenarios also at
   ρ = 1.0 and 1.2 (the thesis's heavy traffic) at the tightest budget, over
   ``--heavy-count`` images (150, as the thesis averages over; the same workloads as the
   simulator's): at and above ρ = 1 a queue builds with the run's length, so the short
   runs at three budgets (``--stochastic-count`` images) hide it. Each child also simulates its own workload with the
   same profiles and no paging (the real executor keeps the budget) and reports the
   difference.
2. **Simulator** on longer workloads (``--sim-count`` images, ρ = 0.8 / 1.0 / 1.2), every
   policy, with the thesis's paging model (physical memory = budget); at the tightest budget
   also with this machine's contention model (how much a load or an execution slows down
   beside another, measured with the profiles: ``layerfit.schedule.contention``). Each real
   run is simulated four ways and the differences reported (thesis model; the run's own
   task durations; profiled + contention; the run's durations de-contended by the model + contention).
3. **Sensitivity** (thesis §7.6): the scheduler's memory estimates × 0.5 … 1.5, in the
   simulator (paging model) for MASA/Bulk/DeepEye, and for MASA in the real executor on
   small-3 at the tightest budget (where an under-estimate shows as unit buffers above
   the budget, this machine having the RAM to absorb it).

4. **Headroom**: a lower bound on the mean response time of each workload that no policy
   can beat on 2 workers (``layerfit.schedule.experiments.bounds``: critical paths, and shortest
   remaining work first at the machine's best throughput, with and without the
   contention model), beside the best baseline: where bound / best baseline is above
   0.5, the ≤ 0.5 target is out of reach for every scheduler.

Targets (issue 6), reported, not asserted: MASA's mean response time at the tightest
budget ≤ 0.5 × the best of Bulk and DeepEye (simulator and real), and never more than
10 % above Bulk's at the loosest budget.

Writes ``bench/results/masa.{json,md}``. Run from the repository root on a quiet machine:

    .venv/bin/python bench/masa.py            # full run (about 50 min on 2 quiet cores)
    .venv/bin/python bench/masa.py --quick    # smoke: small-3, 3 images, 2 budgets
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from processes import run_child  # noqa: E402
from reporting import machine, write_results  # noqa: E402

CACHE = Path(__file__).parent / ".cache"
MAIN = ("masa", "bulk", "deepeye")
# MASA's variants (not in the thesis), run beside it everywhere: arrival order, safety check
VARIANTS = ("masa-fcfs", "masa-fair")
FRACTIONS = (0.25, 0.5, 1.0)
FACTORS = (0.5, 0.75, 1.0, 1.25, 1.5)
BATCH = {
    "small-3": ("agenet", "gendernet", "tinyyolo"),
    "mixed-3": ("agenet", "emotionnet", "facenet"),
}
STOCHASTIC = ("random-arrivals", "all-random")
LONG_RHOS = (1.0, 1.2)  # real runs over --heavy-count images at the tightest budget
UNGATED = ("bulk-ungated", "deepeye-ungated", "bulk-multi-ungated")  # the thesis's baselines: no memory management
# The thesis's Bulk is EdgeCaffe's one-worker BulkOrchestrator; bulk-multi lets every worker
# load and is reported beside it as the stronger whole-network baseline.
BASELINES = ("bulk", "deepeye")
ALL_BASELINES = ("bulk", "bulk-multi", "deepeye")
# simulated again with this machine's contention model (tightest budget)
CONTENDED = ("masa", *VARIANTS, "bulk", "bulk-multi", "deepeye")
CONTENTION_FIELDS = ("load_by_load", "load_by_exec", "exec_by_load", "exec_by_exec")
# the simulator's views of a real run (realrun.compare_with_simulator), as reported
FIDELITY = (
    ("simulated_profiled_durations", "thesis model"),
    ("simulated_measured_durations", "run's durations"),
    ("simulated_profiled_durations_contention", "profiled + contention"),
    ("simulated_decontended_durations_contention", "run's durations de-contended + contention"),
)


# --- child processes ----------------------------------------------------------------


def child_real(args: argparse.Namespace) -> None:
    """Real runs of one workload, one per configuration (policy, budget, estimate factor),
    each on a fresh runtime after a warm-up job; prints a JSON list, one summary each."""
    from layerfit.engine.osmem import peak_rss_bytes, reset_peak_rss
    from layerfit.schedule.contention import load_contention
    from layerfit.schedule.experiments.realrun import compare_with_simulator, run_workload
    from layerfit.schedule.experiments.workload import load_workload
    from layerfit.schedule.profile import load_profiles
    from layerfit.schedule.runtime.executor import Runtime

    profiles = load_profiles(args.profiles)
    contention = load_contention(args.contention)
    workload = load_workload(args.workload, profiles)
    names = sorted({n for a in workload.arrivals for n in a.networks})
    results = []
    for config in json.loads(args.configs):
        reset_peak_rss()
        t0 = time.perf_counter()
        with Runtime(
            args.repository,
            config["memory"],
            workers=args.workers,
            policy=config["policy"],
            profiles={n: profiles[n] for n in names},
            estimate_factor=config["factor"],
            trace=True,
            load=False,
        ) as runtime:
            for name in names:
                runtime.load_model(name)
            report = run_workload(runtime, workload, warmup=True)
            stats = runtime.stats()
        out = report.summary()
        out.update(config)
        out["wall_s"] = time.perf_counter() - t0
        out["unit_buffer_peak_bytes"] = stats["unit_buffer_peak_bytes"]
        out["tasks_started"] = stats["tasks_started"]
        out["rss_peak_bytes"] = peak_rss_bytes()
        out["simulator"] = compare_with_simulator(
            report, workload, profiles, memory=config["memory"], workers=args.workers,
            estimate_factor=config["factor"], contention=contention,
        )
        results.append(out)
    print(json.dumps({"runs": results}, default=_json_number))


def child_profile(args: argparse.Namespace) -> None:
    """Profile the prepared models with the statm profiler and measure how their loads and
    executions slow each other; writes a profile set and a contention model."""
    from layerfit.schedule.profile import ProfileSet
    from layerfit.schedule.runtime.profiler import measure_contention, measure_profile

    names = args.networks.split(",")
    profiles = [measure_profile(Path(args.repository) / n, n, repeats=3) for n in names]
    ProfileSet(profiles, label="measured").save(args.profiles)
    measure_contention([Path(args.repository) / n for n in names], repeats=3).save(args.contention)
    print(json.dumps({"profiled": names}))


def _json_number(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


# --- the parent -----------------------------------------------------------------------


def budgets(profiles: Any, networks: tuple[str, ...], fractions: tuple[float, ...]) -> list[dict[str, Any]]:
    """Sum of bulk peaks × fraction, raised to the largest task where needed."""
    total = sum(profiles[n].bulk_peak for n in networks)
    largest = max(profiles[n].largest_task_memory for n in networks)
    out = []
    for fraction in fractions:
        wanted = int(total * fraction)
        out.append(
            {
                "fraction": fraction,
                "bulk_peak_sum_bytes": total,
                "bytes": max(wanted, largest),
                "raised_to_largest_task": wanted < largest,
            }
        )
    return out


def make_workloads(args: argparse.Namespace, profiles: Any, directory: Path) -> dict[str, dict[str, Any]]:
    """The scenarios' workload files (real runs and longer simulator runs)."""
    from layerfit.schedule.experiments.workload_generators import (
        batch_workload,
        stochastic_workload,
    )

    directory.mkdir(parents=True, exist_ok=True)
    scenarios: dict[str, dict[str, Any]] = {}
    for name, networks in BATCH.items():
        if args.quick and name != "small-3":
            continue
        real = batch_workload(networks, args.batch_count if name == "small-3" else max(2, args.batch_count // 2), None, name=name)
        sim = batch_workload(networks, args.sim_count, None, name=name)
        scenarios[name] = {"networks": networks, "real": real, "sim": {1.0: sim}}
    if not args.quick:
        candidates = tuple(profiles.names())
        for name in STOCHASTIC:
            top = 1 if name == "random-arrivals" else args.max_networks

            def make(count: int, rho: float, name: str = name, top: int = top) -> Any:
                return stochastic_workload(
                    name, profiles, count=count, intensity=rho, seed=0, candidates=candidates,
                    max_networks=top, profiles_spec=None,
                )

            scenarios[name] = {
                "networks": candidates,
                "real": make(args.stochastic_count, 1.0),
                "real_long": {rho: make(args.heavy_count, rho) for rho in LONG_RHOS},
                "sim": {rho: make(args.sim_count, rho) for rho in (0.8, 1.0, 1.2)},
            }
    for name, scenario in scenarios.items():
        path = directory / f"{name}.yaml"
        scenario["real"].save(path)
        scenario["path"] = path
        for rho, workload in scenario.get("real_long", {}).items():
            scenario[f"long_path {rho:g}"] = workload.save(directory / f"{name}-rho{rho:g}-x{args.heavy_count}.yaml")
    return scenarios


def sensitivity_budget(profiles: Any, networks: tuple[str, ...]) -> int:
    total = sum(profiles[n].bulk_peak for n in networks)
    largest = max(profiles[n].largest_task_memory for n in networks)
    return max(int(0.5 * total), int(1.5 * largest) + 1)


def simulate_one(
    workload: Any, policy: str, budget: int, profiles: Any, factor: float = 1.0, paging: bool = True,
    contention: Any = None,
) -> dict[str, Any]:
    """One simulated run; ``policy-ungated`` runs a memory-oblivious policy without the budget gate;
    ``contention`` (default none, the thesis's model) makes concurrent tasks slow each other."""
    from layerfit.schedule.contention import NO_CONTENTION
    from layerfit.schedule.experiments.penalty import PagingModel
    from layerfit.schedule.experiments.simulator import simulate

    gated = not policy.endswith("-ungated")
    report = simulate(
        workload, policy.removesuffix("-ungated"), memory=budget, workers=2,
        paging=PagingModel() if paging else None, estimate_factor=factor, profiles=profiles,
        trace=False, gated=gated, contention=contention or NO_CONTENTION,
    )
    summary = report.summary()
    return {
        "mean_response_s": summary["response_time_s"]["mean"],
        "p95_response_s": summary["response_time_s"]["p95"],
        "makespan_s": summary["makespan_s"],
        "jobs_by_status": summary["jobs_by_status"],
        "progress_rule_fired": summary["progress_rule_fired"],
        "slowed_tasks": summary["slowed_tasks"],
        "peak_resident_bytes": summary["peak_resident_bytes"],
    }


def real_many(
    args: argparse.Namespace, scenario: dict[str, Any], configs: list[dict[str, Any]], repository: Path,
    profiles_path: Path, path_key: str = "path", timeout: float | None = None,
) -> list[dict[str, Any]]:
    """Run ``configs`` on the scenario's workload (``scenario[path_key]``) in one child process;
    past ``timeout`` (default ``--child-timeout``) the runs count as not finished."""
    t0 = time.perf_counter()
    timeout = timeout or args.child_timeout
    label = Path(scenario[path_key]).stem
    try:
        result = run_child(
            __file__,
            ["--real", "--workload", str(scenario[path_key]), "--configs", json.dumps(configs),
             "--repository", str(repository), "--profiles", str(profiles_path), "--workers", "2",
             "--contention", str(contention_path(profiles_path))],
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        print(f"  real {label} {[c['policy'] for c in configs]}: not finished within {timeout:.0f} s", flush=True)
        return [{"error": f"not finished within {timeout:.0f} s", "timeout_s": timeout, **config} for config in configs]
    if "error" in result:
        print(f"  real {label}: ERROR {result['error']}", flush=True)
        return [{"error": result["error"], **config} for config in configs]
    runs = result["runs"]
    for run in runs:
        mean = run["response_time_s"]["mean"]
        print(f"  real {label} {run['policy']} {run['memory'] / 1e6:.0f} MB x{run['factor']:g}: "
              f"{run['wall_s']:.0f} s, mean response {mean if mean is None else round(mean, 3)} s", flush=True)
    print(f"  ({time.perf_counter() - t0:.0f} s with the child's start)", flush=True)
    return runs


def long_label(name: str, rho: float) -> str:
    """The key of a long real run: ``random-arrivals rho=1.2``, ``all-random rho=1``."""
    return f"{name} rho={rho:g}"


def contention_path(profiles_path: Path) -> Path:
    """The contention model measured with a profile set, next to it."""
    return profiles_path.with_name(profiles_path.stem.replace("profiles", "contention") + ".json")


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def mean_of(result: dict[str, Any]) -> float | None:
    if "response_time_s" in result:
        value = result["response_time_s"].get("mean")
    else:
        value = result.get("mean_response_s")
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def targets(
    table: dict[str, dict[str, dict[str, Any]]], tight: str, loose: str, policy: str = "masa"
) -> dict[str, Any]:
    """Per scenario: ``policy`` / best(Bulk, DeepEye) at the tightest budget (and / the best
    of those and bulk-multi), ``policy`` / Bulk at the loosest (and / the better of the two
    Bulks)."""

    def best(row: dict[str, Any], names: tuple[str, ...]) -> float | None:
        return min((m for m in (mean_of(row.get(n, {})) for n in names) if m), default=None)

    out = {}
    for scenario, by_budget in table.items():
        t, loose_row = by_budget.get(tight, {}), by_budget.get(loose, {})
        tight_ratio = ratio(mean_of(t.get(policy, {})), best(t, BASELINES))
        loose_ratio = ratio(mean_of(loose_row.get(policy, {})), mean_of(loose_row.get("bulk", {})))
        out[scenario] = {
            "masa_over_best_baseline_at_tightest": tight_ratio,
            "tight_target_met (<= 0.5)": None if tight_ratio is None else tight_ratio <= 0.5,
            "masa_over_best_incl_bulk_multi_at_tightest": ratio(mean_of(t.get(policy, {})), best(t, ALL_BASELINES)),
            "masa_over_bulk_at_loosest": loose_ratio,
            "loose_target_met (<= 1.1)": None if loose_ratio is None else loose_ratio <= 1.1,
            "masa_over_better_bulk_at_loosest": ratio(
                mean_of(loose_row.get(policy, {})), best(loose_row, ("bulk", "bulk-multi"))
            ),
        }
    return out


def lower_bounds(scenarios: dict[str, dict[str, Any]], profiles: Any, contention: Any) -> dict[str, Any]:
    """The least mean response any policy could give each workload on 2 workers
    (``layerfit.schedule.experiments.bounds``), without and with the contention model; keyed like
    ``real`` (scenario, ``<scenario> rho=1.2``) and ``simulator`` (scenario, label)."""
    from layerfit.schedule.contention import NO_CONTENTION
    from layerfit.schedule.experiments.bounds import response_time_bound

    def both(workload: Any) -> dict[str, Any]:
        return {
            model: response_time_bound(workload, workers=2, contention=used, profiles=profiles).to_dict()
            for model, used in (("thesis", NO_CONTENTION), ("contention", contention))
        }

    out: dict[str, Any] = {"real": {}, "simulator": {}}
    for name, scenario in scenarios.items():
        out["real"][name] = both(scenario["real"])
        for rho, workload in scenario.get("real_long", {}).items():
            out["real"][long_label(name, rho)] = both(workload)
        out["simulator"][name] = {
            (f"rho={rho:g}" if name in STOCHASTIC else "closed"): both(workload)
            for rho, workload in scenario["sim"].items()
        }
    return out


def headroom(
    real: dict[str, Any], sim: dict[str, Any], sim_contention: dict[str, Any], bounds: dict[str, Any],
    tight: str,
) -> list[dict[str, Any]]:
    """Per executor and workload at the tightest budget: the lower bound, the best of Bulk and
    DeepEye, and bound / best, the smallest ratio to them that any policy could reach (the
    ≤ 0.5 target is out of reach where it is above 0.5), beside MASA's and its variants'."""
    rows: list[dict[str, Any]] = []

    def add(executor: str, workload: str, results: dict[str, Any], bound: dict[str, Any]) -> None:
        best = min((m for m in (mean_of(results.get(p, {})) for p in BASELINES) if m), default=None)
        least = bound["mean_response_s"]
        row = {
            "executor": executor, "workload": workload, "lower_bound_s": least,
            "binding": bound["binding"], "best_baseline_s": best,
            "best_reachable_ratio": ratio(least, best),
        }
        for policy in ("masa", *VARIANTS):
            row[f"{policy}_over_best_baseline"] = ratio(mean_of(results.get(policy, {})), best)
            row[f"{policy}_over_bound"] = ratio(mean_of(results.get(policy, {})), least)
        own = ((results.get("masa-fair", {}).get("simulator") or {}).get("lower_bound") or {}).get("run_work")
        if own:  # the bound from masa-fair's own run: its task durations, de-contended
            row["own_work_bound_s"] = own["mean_response_s"]
            row["best_reachable_ratio_own_work"] = ratio(own["mean_response_s"], best)
            row["masa-fair_over_own_work_bound"] = own["real_over_bound"]
        rows.append(row)

    for name, by_budget in real.items():
        if name in bounds["real"]:
            add("real (bound: profiles + contention)", name, by_budget.get(tight, {}), bounds["real"][name]["contention"])
    for name, by_label in sim.items():
        for label, by_budget in by_label.items():
            add("simulator, thesis model", f"{name} ({label})", by_budget[tight], bounds["simulator"][name][label]["thesis"])
    for name, by_label in sim_contention.items():
        for label, by_budget in by_label.items():
            add("simulator + contention", f"{name} ({label})", by_budget[tight],
                bounds["simulator"][name][label]["contention"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--real", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    ap.add_argument("--policy", help=argparse.SUPPRESS)
    ap.add_argument("--memory", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--repository", help=argparse.SUPPRESS)
    ap.add_argument("--profiles", help=argparse.SUPPRESS)
    ap.add_argument("--contention", help=argparse.SUPPRESS)
    ap.add_argument("--networks", help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=2, help=argparse.SUPPRESS)
    ap.add_argument("--configs", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="smoke run: small-3, 3 images, 2 budgets")
    ap.add_argument("--resolution", type=int, default=64, help="input size where the network allows it")
    ap.add_argument("--batch-count", type=int, default=8, help="images per batch scenario (real)")
    ap.add_argument("--stochastic-count", type=int, default=12, help="images per stochastic scenario (real)")
    ap.add_argument("--heavy-count", type=int, default=150,
                    help="images per stochastic scenario at rho = 1.0 and 1.2 (real; the thesis averages over 150)")
    ap.add_argument("--heavy-timeout", type=float, default=240, help="seconds per long (rho = 1.0 / 1.2) real run before it counts as not finished")
    ap.add_argument("--sim-count", type=int, default=150,
                    help="images per simulated scenario (the thesis averages over 150)")
    ap.add_argument("--max-networks", type=int, default=3, help="most networks per image in all-random")
    ap.add_argument("--reprofile", action="store_true", help="measure the profiles and the contention model again")
    ap.add_argument("--child-timeout", type=float, default=600)
    ap.add_argument("--output", default="masa")
    args = ap.parse_args()
    if args.child:
        if args.real:
            child_real(args)
        else:
            child_profile(args)
        return

    from layerfit.schedule.contention import load_contention
    from layerfit.schedule.experiments.thesis_zoo import THESIS_ZOO, prepare_thesis_models
    from layerfit.schedule.experiments.workload import load_workload
    from layerfit.schedule.policies import policy_names
    from layerfit.schedule.profile import load_profiles

    if args.quick:
        args.batch_count, args.sim_count = 3, min(args.sim_count, 20)
    fractions = (0.25, 1.0) if args.quick else FRACTIONS
    tight, loose = f"{fractions[0]:g}", f"{fractions[-1]:g}"
    started = time.perf_counter()
    networks = BATCH["small-3"] if args.quick else tuple(THESIS_ZOO)
    repository = CACHE / f"masa-{args.resolution}"
    t0 = time.perf_counter()
    prepare_thesis_models(repository, networks, resolution=args.resolution)
    print(f"prepared {len(networks)} networks in {repository} ({time.perf_counter() - t0:.0f} s)", flush=True)
    profiles_path = repository / ("profiles-quick.json" if args.quick else "profiles.json")
    if args.reprofile or not profiles_path.exists() or not contention_path(profiles_path).exists():
        t0 = time.perf_counter()
        result = run_child(__file__, ["--repository", str(repository), "--profiles", str(profiles_path),
                                      "--contention", str(contention_path(profiles_path)),
                                      "--networks", ",".join(networks)], timeout=args.child_timeout)
        if "error" in result:
            raise SystemExit(f"profiling failed: {result['error']}")
        print(f"profiled in {time.perf_counter() - t0:.0f} s", flush=True)
    profiles = load_profiles(profiles_path)
    contention = load_contention(contention_path(profiles_path))
    print("contention: " + ", ".join(f"{k} {v:.2f}x" for k, v in contention.describe().items()
                                     if k in CONTENTION_FIELDS), flush=True)
    scenarios = make_workloads(args, profiles, repository / "workloads")

    real: dict[str, dict[str, dict[str, Any]]] = {}
    sim: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    sim_contention: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    budget_rows: dict[str, list[dict[str, Any]]] = {}
    sim_policies = [*policy_names(), *UNGATED]
    for name, scenario in scenarios.items():
        rows = budgets(profiles, scenario["networks"], fractions)
        budget_rows[name] = rows
        real[name] = {}
        print(f"{name}: budgets {[round(r['bytes'] / 1e6, 1) for r in rows]} MB", flush=True)
        scenario["real"] = load_workload(scenario["path"], profiles)
        for row in rows:
            key = f"{row['fraction']:g}"
            policies = [*MAIN, "bulk-multi", *VARIANTS]
            if name == "small-3" and key == tight:
                policies += [p for p in policy_names() if p not in policies]
            configs = [{"policy": p, "memory": row["bytes"], "factor": 1.0} for p in policies]
            runs = real_many(args, scenario, configs, repository, profiles_path)
            real[name][key] = {run["policy"]: run for run in runs}
        for rho in scenario.get("real_long", {}):  # the thesis's regime: 150 images, tightest budget
            heavy = long_label(name, rho)
            row = rows[0]
            real[heavy] = {tight: {}}
            for policy in (*MAIN, "bulk-multi", *VARIANTS):  # one child each: a run may not finish
                config = {"policy": policy, "memory": row["bytes"], "factor": 1.0}
                (run,) = real_many(args, scenario, [config], repository, profiles_path, f"long_path {rho:g}",
                                   args.heavy_timeout)
                real[heavy][tight][policy] = run
            budget_rows[heavy] = [row]
        sim[name] = {}
        for rho, workload in scenario["sim"].items():
            label = f"rho={rho:g}" if name in STOCHASTIC else "closed"
            sim[name][label] = {
                f"{row['fraction']:g}": {
                    p: simulate_one(workload, p, row["bytes"], profiles) for p in sim_policies
                }
                for row in rows
            }
            # the same at the tightest budget with this machine's contention model
            sim_contention.setdefault(name, {})[label] = {
                tight: {p: simulate_one(workload, p, rows[0]["bytes"], profiles, contention=contention)
                        for p in CONTENDED}
            }
        print(f"{name}: simulated ({time.perf_counter() - started:.0f} s so far)", flush=True)

    bounds = lower_bounds(scenarios, profiles, contention)

    # Sensitivity at a budget where even over-estimated tasks fit: max(0.5 x bulk peaks, 1.5 x largest task)
    sensitivity: dict[str, Any] = {"budgets": {}, "simulator": {}, "real": {}}
    for name, scenario in scenarios.items():
        budget = sensitivity_budget(profiles, scenario["networks"])
        sensitivity["budgets"][name] = budget
        workload = scenario["sim"][1.0]
        sensitivity["simulator"][name] = {
            f"{factor:g}": {p: simulate_one(workload, p, budget, profiles, factor) for p in MAIN}
            for factor in FACTORS
        }
    budget = sensitivity["budgets"]["small-3"]
    configs = [{"policy": "masa", "memory": budget, "factor": f} for f in (0.5, 1.0, 1.5)]
    for run in real_many(args, scenarios["small-3"], configs, repository, profiles_path):
        sensitivity["real"][f"{run['factor']:g}"] = run

    sim_closed_or_rho1 = {
        name: by_label.get("closed") or by_label.get("rho=1") for name, by_label in sim.items()
    }
    sim_rho12 = {name: by_label["rho=1.2"] for name, by_label in sim.items() if "rho=1.2" in by_label}
    contended_closed_or_rho1 = {
        name: by_label.get("closed") or by_label.get("rho=1") for name, by_label in sim_contention.items()
    }
    contended_rho12 = {name: by_label["rho=1.2"] for name, by_label in sim_contention.items() if "rho=1.2" in by_label}
    data = {
        "machine": machine(),
        "quick": args.quick,
        "resolution": args.resolution,
        "repository": str(repository),
        "profiles": {p.name: {"bulk_peak_bytes": p.bulk_peak, "largest_task_bytes": p.largest_task_memory,
                              "serial_time_s": p.total_time, "layers": len(p.layers),
                              "architecture": p.architecture} for p in profiles.values()},
        "budgets": budget_rows,
        "contention": contention.describe(),
        "real": real,
        "simulator": sim,
        "simulator_contention": sim_contention,
        "sensitivity": sensitivity,
        "lower_bounds": bounds,
        "headroom": headroom(real, sim, sim_contention, bounds, tight),
        "targets": {
            "real": targets(real, tight, loose),
            "simulator (closed / rho=1, paging)": targets(sim_closed_or_rho1, tight, loose),
            "simulator, memory-oblivious baselines (thesis setting)": targets(
                {
                    name: {
                        key: {"masa": row["masa"], "bulk": row["bulk-ungated"], "deepeye": row["deepeye-ungated"],
                              "bulk-multi": row["bulk-multi-ungated"]}
                        for key, row in by_budget.items()
                    }
                    for name, by_budget in sim_closed_or_rho1.items()
                },
                tight,
                loose,
            ),
            **{f"real, {v}": targets(real, tight, loose, v) for v in VARIANTS},
            **{f"simulator (closed / rho=1, paging), {v}": targets(sim_closed_or_rho1, tight, loose, v)
               for v in VARIANTS},
            "simulator (rho=1.2, paging), masa": targets(sim_rho12, tight, loose),
            **{f"simulator (rho=1.2, paging), {v}": targets(sim_rho12, tight, loose, v) for v in VARIANTS},
            "simulator + contention (closed / rho=1)": targets(contended_closed_or_rho1, tight, loose),
            **{f"simulator + contention (closed / rho=1), {v}": targets(contended_closed_or_rho1, tight, loose, v)
               for v in VARIANTS},
            "simulator + contention (rho=1.2)": targets(contended_rho12, tight, loose),
            **{f"simulator + contention (rho=1.2), {v}": targets(contended_rho12, tight, loose, v) for v in VARIANTS},
        },
        "wall_s": time.perf_counter() - started,
    }
    js, md = write_results(args.output, data, markdown(data, tight, loose))
    print(f"wrote {js} and {md} in {data['wall_s']:.0f} s")


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(data: dict[str, Any], tight: str, loose: str) -> str:
    m = data["machine"]
    lines = [
        "# MASA vs Bulk vs DeepEye — real executor and simulator",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['torch_threads']} threads), "
        f"load average at start {', '.join(f'{x:.1f}' for x in m['load_average_at_start'])}. "
        f"{'Quick smoke run. ' if data['quick'] else ''}2 workers. Inputs at {data['resolution']} px where the "
        "architecture allows. Mean response time per job in seconds (lower is better); budgets are the sum of "
        "the scenario's networks' bulk peaks × fraction (raised to the largest task where marked *).",
        "",
        "## Networks (statm profiles on this machine)",
        "",
        "| network | architecture | units | bulk peak MB | largest task MB | serial time s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, p in data["profiles"].items():
        lines.append(f"| {name} | {p['architecture']} | {p['layers']} | {p['bulk_peak_bytes'] / 1e6:.1f} | "
                     f"{p['largest_task_bytes'] / 1e6:.1f} | {p['serial_time_s']:.3f} |")
    c = data["contention"]
    lines += ["", "## Contention (measured here; `layerfit schedule contention`)", "",
              "How many times longer a task takes while one other task runs beside it: "
              f"load beside a load {c['load_by_load']:.2f}×, load beside an execution {c['load_by_exec']:.2f}×, "
              f"execution beside a load {c['exec_by_load']:.2f}×, execution beside an execution "
              f"{c['exec_by_exec']:.2f}× (torch {c['notes'].get('torch_threads')} threads). The thesis's "
              "simulator assumes 1× for all four.", ""]
    lines += ["## Real executor", ""]
    for name, by_budget in data["real"].items():
        rows = {f"{r['fraction']:g}": r for r in data["budgets"][name]}
        policies = sorted({p for results in by_budget.values() for p in results},
                          key=lambda p: (p not in MAIN, MAIN.index(p) if p in MAIN else 0, p))
        lines += [f"### {name}", "", "| budget | " + " | ".join(policies) + " | progress rule (masa/bulk/deepeye) | sim vs real (masa, profiled durations) |",
                  "|---|" + "---:|" * len(policies) + "---|---|"]
        for key, results in by_budget.items():
            row = rows[key]
            label = f"{key} × = {row['bytes'] / 1e6:.1f} MB{'*' if row['raised_to_largest_task'] else ''}"
            cells = [
                (f"> {results[p]['timeout_s']:.0f} (not finished)" if "timeout_s" in results[p] else fmt(mean_of(results[p])))
                if p in results else "" for p in policies
            ]
            progress = "/".join(str(results.get(p, {}).get("progress_rule_fired", "-")) for p in MAIN)
            simdiff = (((results.get("masa") or {}).get("simulator") or {}).get("simulated_profiled_durations") or {})
            diff = (simdiff.get("difference") or {}).get("mean_response_s")
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {progress} | "
                         f"{'-' if diff is None else f'{diff:+.0%}'} |")
        lines.append("")
    lines += ["## Simulator vs real executor (same workload, tightest budget)", "",
              "Simulated mean response relative to the real run's, (sim − real) / real. *Thesis model*: "
              "profiled durations, every task at its alone speed. *Run's durations*: each task's mean "
              "duration in the real run (contention included on average). *Profiled + contention*: the "
              "contention model above. *Run's durations de-contended + contention*: each task's run turned back "
              "into work alone by the model (the integral of the model's rate over its span, beside what the "
              "trace shows in flight), then simulated with the model: whether the model reproduces the run's "
              "dynamics, free of drift between profiling and the run. The one-worker Bulk never runs two tasks "
              "at once, so its thesis-model error is that drift (and the runtime's gaps between tasks), no "
              "contention.", "",
              "| scenario | policy | real s | " + " | ".join(label for _, label in FIDELITY) + " |",
              "|---|---|---:|" + "---:|" * len(FIDELITY)]
    for name, by_budget in data["real"].items():
        for policy, result in by_budget.get(tight, {}).items():
            views = result.get("simulator") or {}
            if policy not in CONTENDED or not views:
                continue
            cells = [(views.get(key) or {}).get("difference", {}).get("mean_response_s") for key, _ in FIDELITY]
            lines.append(f"| {name} | {policy} | {fmt(mean_of(result))} | "
                         + " | ".join("-" if v is None else f"{v:+.0%}" for v in cells) + " |")
    lines += ["", "## Simulator (thesis paging model, physical memory = budget)", "",
              "`*-ungated`: the memory-oblivious baselines of the thesis (no budget gate: they over-commit "
              "and page); the others keep the budget like the real executor.", ""]
    for name, by_label in data["simulator"].items():
        for label, by_budget in by_label.items():
            policies = list(next(iter(by_budget.values())))
            lines += [f"### {name} ({label})", "", "| budget | " + " | ".join(policies) + " |",
                      "|---|" + "---:|" * len(policies)]
            for key, results in by_budget.items():
                lines.append(f"| {key} × | " + " | ".join(fmt(mean_of(results[p])) for p in policies) + " |")
            lines.append("")
    lines += [f"## Simulator with this machine's contention (paging model, tightest budget {tight} ×)", ""]
    for name, by_label in data["simulator_contention"].items():
        lines += [f"### {name}", "", "| workload | " + " | ".join(CONTENDED) + " |", "|---|" + "---:|" * len(CONTENDED)]
        for label in by_label:
            results = by_label[label][tight]
            lines.append(f"| {label} | " + " | ".join(fmt(mean_of(results[p])) for p in CONTENDED) + " |")
        lines.append("")
    lines += ["## Sensitivity to memory estimates", "",
              "Budget per scenario: max(0.5 × bulk peaks, 1.5 × largest task) so over-estimated tasks "
              "still fit: " + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in data["sensitivity"]["budgets"].items()) + ".", "",
              "Simulator, mean response s (MASA / Bulk / DeepEye):", "",
              "| scenario | " + " | ".join(f"× {f:g}" for f in FACTORS) + " |",
              "|---|" + "---:|" * len(FACTORS)]
    for name, by_factor in data["sensitivity"]["simulator"].items():
        cells = ["/".join(fmt(mean_of(by_factor[f"{f:g}"][p]), 2) for p in MAIN) for f in FACTORS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Real executor, MASA on small-3: mean response s, peak unit buffers MB (budget "
              f"{data['sensitivity']['budgets']['small-3'] / 1e6:.1f} MB):", ""]
    for key, result in sorted(data["sensitivity"]["real"].items(), key=lambda kv: float(kv[0])):
        peak = result.get("unit_buffer_peak_bytes")
        lines.append(f"- × {key}: {fmt(mean_of(result))} s, {'-' if peak is None else f'{peak / 1e6:.1f}'} MB")
    lines += ["", f"## Headroom: the least mean response any policy could reach (tightest budget {tight} ×)", "",
              "`layerfit.schedule.experiments.bounds`: no schedule on 2 workers can have a lower mean response than the "
              "bound, whatever the policy and the budget (it counts no memory): each job's critical path, and "
              "the work served by shortest remaining work first at the machine's best throughput (2 tasks at "
              "a time; under the contention model, the best mix of loads and executions). *Best reachable* = "
              "bound / best of (Bulk, DeepEye): where it is above 0.5 no policy can meet the ≤ 0.5 target. "
              "The real rows' bound comes from the profiles; the runs did more or less work than profiled "
              "(on this machine mostly more: see the one-worker Bulk above). *Own work*: the bound from "
              "masa-fair's own run, its task durations de-contended by the model, and masa-fair's real mean "
              "over it.", "",
              "| executor | workload | bound s | binding | best baseline s | best reachable | best reachable, "
              "own work | masa | masa-fcfs | masa-fair | masa-fcfs / bound | masa-fair / bound | masa-fair / own work |",
              "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in data.get("headroom", []):
        lines.append(
            f"| {row['executor']} | {row['workload']} | {fmt(row['lower_bound_s'])} | {row['binding']} | "
            f"{fmt(row['best_baseline_s'])} | {fmt(row['best_reachable_ratio'], 2)} | "
            f"{fmt(row.get('best_reachable_ratio_own_work'), 2)} | {fmt(row['masa_over_best_baseline'], 2)} | "
            f"{fmt(row['masa-fcfs_over_best_baseline'], 2)} | {fmt(row['masa-fair_over_best_baseline'], 2)} | "
            f"{fmt(row['masa-fcfs_over_bound'], 2)} | {fmt(row['masa-fair_over_bound'], 2)} | "
            f"{fmt(row.get('masa-fair_over_own_work_bound'), 2)} |"
        )
    lines += ["", "## Targets", "",
              f"MASA / best of (Bulk, DeepEye) at the tightest budget ({tight} ×, target ≤ 0.5) and "
              f"MASA / Bulk at the loosest ({loose} ×, target ≤ 1.1). Bulk is the thesis's (EdgeCaffe's "
              "one-worker BulkOrchestrator); the `+multi` columns also count bulk-multi (every worker loads) "
              "as a baseline:", "",
              "| executor | scenario | tightest ratio | met | tightest +multi | loosest ratio | met | loosest +multi |",
              "|---|---|---:|---|---:|---:|---|---:|"]
    for executor, by_scenario in data["targets"].items():
        for name, t in by_scenario.items():
            met_tight, met_loose = (("-" if m is None else m) for m in
                                    (t["tight_target_met (<= 0.5)"], t["loose_target_met (<= 1.1)"]))
            lines.append(f"| {executor} | {name} | {fmt(t['masa_over_best_baseline_at_tightest'], 2)} | "
                         f"{met_tight} | {fmt(t['masa_over_best_incl_bulk_multi_at_tightest'], 2)} | "
                         f"{fmt(t['masa_over_bulk_at_loosest'], 2)} | "
                         f"{met_loose} | {fmt(t['masa_over_better_bulk_at_loosest'], 2)} |")
    lines += ["", "A real run that did not finish in time has no mean: as MASA it gives no ratio, as a baseline "
              "it is left out of the best baseline (so the ratio is against a faster one).", "",
              f"Wall time {data['wall_s']:.0f} s.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
