"""MASA against the thesis's memory-oblivious baselines with physical memory = the budget.

``bench/masa.py`` runs every policy in the real executor within the budget: nothing
there stops a process from using more RAM than the budget, so over-committing costs
nothing, and this VM has no swap. The thesis's gains come from Bulk and DeepEye
over-committing a Raspberry Pi's RAM and paging to its SD card (Ch. 6–7). This bench
gives the real executor that machine: each run is a fresh child process in its own
memory cgroup (v1) whose limit, set once the child is warm, is its own footprint plus
the budget, with a swap file behind it. Anything the scheduler puts above the budget
is then paged by the kernel, for real.

Runs, per scenario of ``bench/masa.py`` (same networks, profiles, workloads and
budgets) at each ``--fractions`` budget:

- ``masa``, ``masa-fcfs``, ``masa-fair``: memory-aware, within the budget;
- ``bulk``, ``deepeye``: our gated baselines, within the budget (progress rule);
- ``bulk-ungated``, ``deepeye-ungated``: the thesis's baselines, which ignore the budget
  (Bulk on one worker and DeepEye on two, as EdgeCaffe runs them);
- ``bulk-multi`` and ``bulk-multi-ungated``: Bulk with every worker loading, the stronger
  whole-network baseline.

The stochastic scenarios run at each ``--rho`` traffic intensity: 1 (``--stochastic-count``
images) and 1.2 (the thesis's heavy traffic, where its largest gains are;
``--heavy-count`` images, 150 as the thesis).

Each run reports the response times, what the scheduler admitted over the budget
(over-commits, progress rule), the cgroup's peak above the warm footprint, major page
faults and swap in use at the end, and the simulator's prediction for the same workload
with the thesis's paging model (physical memory = budget). A run that does not finish
within ``--child-timeout`` is reported as such (a lower bound), and one the kernel
kills for memory as a memory shortage — the thesis's "missing values".

Storage (``--storage``): ``vm`` is this VM's virtio disk as it is (about 1.5 GB/s);
``sd`` throttles the run's block I/O (cgroup v1 blkio) to the thesis's card, a SanDisk
Extreme A2 64 GB microSD in a Raspberry Pi 4, as benchmarked on that board
(pidramble.com: 43.7 MB/s buffered read, 36.3 MB/s write, 7.35 MB/s 4K random read ≈
1,800 IOPS, 3.70 MB/s 4K random write ≈ 900 IOPS). The throttle slows loading the
weights and paging alike, as the card does (a child enters it once warm); the profiles
(hence the stochastic arrival rates and the simulator) are measured again under it. The
CPU stays this VM's.

Targets (issue 6), reported, not asserted: MASA / best of (Bulk, DeepEye) at the
tightest budget ≤ 0.5. Both readings are given: against the thesis's baselines
(ungated) and against the best of all six baseline runs.

Needs root (cgroups, swap). ``--swap-file PATH`` creates and enables a swap file for the
run when none is on, and removes it afterwards. Writes
``bench/results/masa_physical.{json,md}``:

    .venv/bin/python bench/masa_physical.py --swap-file /swapfile-layerfit
    .venv/bin/python bench/masa_physical.py --swap-file /swapfile-layerfit --storage sd
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from masa import CACHE, budgets, contention_path, fmt, make_workloads, mean_of, ratio  # noqa: E402
from memory_limits import CGROUP_V1, Cgroup, own_memory_cgroup  # noqa: E402
from reporting import machine, write_results  # noqa: E402
from storage import Storage  # noqa: E402

POLICIES = (
    "masa", "masa-fcfs", "masa-fair", "bulk", "deepeye", "bulk-multi",
    "bulk-ungated", "deepeye-ungated", "bulk-multi-ungated",
)
BASELINES = ("bulk", "deepeye", "bulk-multi", "bulk-ungated", "deepeye-ungated", "bulk-multi-ungated")
THESIS_BASELINES = ("bulk-ungated", "deepeye-ungated")
MEMORY_AWARE = ("masa", "masa-fcfs", "masa-fair")
HEAVY = "long_path 1.2"  # bench/masa.py's workload file at rho = 1.2 over --heavy-count images


# --- the child: one run in its own cgroup ----------------------------------------------


def memory_stat(cgroup: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in (cgroup / "memory.stat").read_text().splitlines())}


def squeeze_cold_pages(cgroup: Path) -> int:
    """Push the process's cold pages (imported libraries' data, interpreter objects it
    never touches again) to swap, so the footprint the limit is built on is the working
    set: otherwise hundreds of MB of cold pages act as a hidden reserve that anything over
    the budget swaps out first, for free. Returns the bytes it pushed out."""
    usage = int((cgroup / "memory.usage_in_bytes").read_text())
    for fraction in (0.25, 0.5, 0.75):
        try:
            (cgroup / "memory.limit_in_bytes").write_text(str(int(usage * fraction)))
            break
        except OSError:  # could not reclaim that much: ask for less
            continue
    (cgroup / "memory.limit_in_bytes").write_text("-1")
    return usage - int((cgroup / "memory.usage_in_bytes").read_text())


def child(args: argparse.Namespace) -> None:
    """One configuration, warm, then limited to its footprint + the budget; prints JSON."""
    from layerfit.schedule.experiments.realrun import run_workload, warm_up
    from layerfit.schedule.experiments.workload import load_workload
    from layerfit.schedule.profile import load_profiles
    from layerfit.schedule.runtime.executor import Runtime

    config = json.loads(args.config)
    cgroup = own_memory_cgroup()
    if cgroup is None or cgroup == CGROUP_V1 / "memory":
        raise SystemExit("not in a memory cgroup of its own")
    profiles = load_profiles(args.profiles)
    workload = load_workload(args.workload, profiles)
    names = sorted({n for a in workload.arrivals for n in a.networks})
    policy = config["policy"]
    with Runtime(
        args.repository, config["memory"], workers=2, policy=policy.removesuffix("-ungated"),
        gated=not policy.endswith("-ungated"), profiles={n: profiles[n] for n in names},
        trace=True, load=False,
    ) as runtime:
        for name in names:
            runtime.load_model(name)
        warm_up(runtime, workload)
        gc.collect()
        cold = squeeze_cold_pages(cgroup)
        warm_up(runtime, workload)  # what the run touches comes back; the cold stays in swap
        gc.collect()
        footprint = int((cgroup / "memory.usage_in_bytes").read_text())
        if args.blkio:  # the storage throttle from here on: warming up at SD speed measures nothing
            Path(args.blkio, "cgroup.procs").write_text(str(os.getpid()))
        (cgroup / "memory.limit_in_bytes").write_text(str(footprint + config["memory"]))
        (cgroup / "memory.max_usage_in_bytes").write_text("0")
        before = memory_stat(cgroup)
        t0 = time.perf_counter()
        report = run_workload(runtime, workload)
        wall = time.perf_counter() - t0
        after = memory_stat(cgroup)
        peak = int((cgroup / "memory.max_usage_in_bytes").read_text())
        stats = runtime.stats()
    out = report.summary()
    out.update(config)
    out.update({
        "wall_s": wall,
        "warm_footprint_bytes": footprint,
        "squeezed_out_bytes": cold,
        "cgroup_limit_bytes": footprint + config["memory"],
        "cgroup_peak_above_footprint_bytes": peak - footprint,
        "major_faults": after["pgmajfault"] - before["pgmajfault"],
        "swap_at_end_bytes": after.get("swap", 0),
        "cgroup_limit_hits": int((cgroup / "memory.failcnt").read_text()),
        "unit_buffer_peak_bytes": stats["unit_buffer_peak_bytes"],
        "gated": stats["gated"],
    })
    print(json.dumps(out, default=str))


# --- the parent -------------------------------------------------------------------------

def swap_total_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("SwapTotal:"):
            return int(line.split()[1]) * 1024
    return 0


@contextlib.contextmanager
def swap_file(path: str | None, size: str):
    """Enable a swap file at ``path`` for the run where no swap is on; remove it after."""
    if not path or swap_total_bytes() > 0:
        yield None
        return
    subprocess.run(["fallocate", "-l", size, path], check=True)
    os.chmod(path, 0o600)
    subprocess.run(["mkswap", path], check=True, capture_output=True)
    subprocess.run(["swapon", path], check=True)
    try:
        yield path
    finally:
        subprocess.run(["swapoff", path], check=False)
        with contextlib.suppress(OSError):
            os.unlink(path)


def run_one(args: argparse.Namespace, storage: Storage, workload: Path, config: dict[str, Any], repository: Path, profiles: Path) -> dict[str, Any]:
    """``config`` in a fresh child in a fresh cgroup; a timeout or an OOM kill is an outcome."""
    cg = Cgroup()
    if not cg.available:
        raise SystemExit("needs a memory cgroup (v1), i.e. root")
    command = [sys.executable, __file__, "--child", "--workload", str(workload), "--config", json.dumps(config),
               "--repository", str(repository), "--profiles", str(profiles)]
    if storage.cgroup is not None:
        command += ["--blkio", str(storage.cgroup)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=cg.enter_fn())
    try:
        try:
            stdout, stderr = proc.communicate(timeout=args.child_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return {**config, "outcome": "timeout", "wall_s": time.perf_counter() - t0}
        oom = cg.oom_kills()
        if proc.returncode != 0:
            outcome = "oom-killed" if oom else "error"
            tail = (stderr or stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
            return {**config, "outcome": outcome, "error": tail[0], "wall_s": time.perf_counter() - t0}
        result = json.loads(stdout.strip().splitlines()[-1])
        result["outcome"] = "done"
        return result
    finally:
        cg.remove()


def simulated(workload: Any, policy: str, budget: int, profiles: Any) -> float | None:
    """The simulator's mean response for the same run (thesis paging, physical = budget)."""
    from layerfit.schedule.experiments.simulator import simulate

    report = simulate(workload, policy.removesuffix("-ungated"), memory=budget, workers=2,
                      profiles=profiles, trace=False, gated=not policy.endswith("-ungated"))
    return report.summary()["response_time_s"]["mean"]


def profiles_for(args: argparse.Namespace, storage: Storage, repository: Path) -> Path:
    """The statm profiles measured on ``storage`` (``bench/masa.py`` measures the VM's)."""
    from layerfit.schedule.experiments.thesis_zoo import THESIS_ZOO

    path = repository / ("profiles.json" if storage.kind == "vm" else f"profiles-{storage.kind}.json")
    if path.exists() and not args.reprofile:
        return path
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).parent / "masa.py"), "--child", "--repository", str(repository),
         "--profiles", str(path), "--contention", str(contention_path(path)), "--networks", ",".join(THESIS_ZOO)],
        capture_output=True, text=True, preexec_fn=storage.enter_fn(), timeout=3600,
    )
    if proc.returncode != 0:
        raise SystemExit(f"profiling on {storage.kind} storage failed: {proc.stderr.strip()[-500:]}")
    print(f"profiled on {storage.kind} storage in {time.perf_counter() - t0:.0f} s", flush=True)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--blkio", help=argparse.SUPPRESS)
    ap.add_argument("--repository", help=argparse.SUPPRESS)
    ap.add_argument("--profiles", help=argparse.SUPPRESS)
    ap.add_argument("--resolution", type=int, default=64)
    ap.add_argument("--storage", default="vm,sd", help="vm (this disk as it is) and/or sd (throttled to a Pi's microSD)")
    ap.add_argument("--fractions", default="0.25", help="budgets as fractions of the bulk-peak sum")
    ap.add_argument("--scenarios", default="small-3,mixed-3,random-arrivals,all-random")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--batch-count", type=int, default=8, help="images per batch scenario (as bench/masa.py)")
    ap.add_argument("--stochastic-count", type=int, default=12, help="images per stochastic scenario")
    ap.add_argument("--max-networks", type=int, default=3)
    ap.add_argument("--rho", default="1", help="traffic intensities of the stochastic scenarios: 1 and/or 1.2")
    ap.add_argument("--heavy-count", type=int, default=150, help="images per stochastic scenario at rho = 1.2")
    ap.add_argument("--sim-count", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--reprofile", action="store_true", help="measure the sd profiles again")
    ap.add_argument("--child-timeout", type=float, default=300, help="seconds per run before it counts as not finished")
    ap.add_argument("--swap-file", help="create and enable this swap file for the run if no swap is on")
    ap.add_argument("--swap-size", default="4G")
    ap.add_argument("--output", default="masa_physical")
    args = ap.parse_args()
    if args.child:
        child(args)
        return

    from layerfit.schedule.experiments.thesis_zoo import THESIS_ZOO, prepare_thesis_models
    from layerfit.schedule.experiments.workload import load_workload
    from layerfit.schedule.profile import load_profiles

    started = time.perf_counter()
    fractions = tuple(float(f) for f in args.fractions.split(","))
    wanted = args.scenarios.split(",")
    policies = args.policies.split(",")
    repository = CACHE / f"masa-{args.resolution}"
    prepare_thesis_models(repository, tuple(THESIS_ZOO), resolution=args.resolution)
    if not (repository / "profiles.json").exists():
        raise SystemExit(f"no profiles in {repository}: run bench/masa.py first (it measures them)")
    results: dict[str, Any] = {}
    storages: dict[str, Any] = {}
    with swap_file(args.swap_file, args.swap_size) as created:
        swap = swap_total_bytes()
        print(f"swap: {swap / 2**30:.1f} GiB{' (created for this run)' if created else ''}", flush=True)
        for kind in args.storage.split(","):
            storage = Storage(kind, repository)
            try:
                profiles_path = profiles_for(args, storage, repository)
                profiles = load_profiles(profiles_path)
                scenarios = {k: v for k, v in make_workloads(args, profiles, repository / f"workloads-physical-{kind}").items()
                             if k in wanted}
                storages[kind] = {**storage.describe(), "profiles": str(profiles_path), "budgets": {},
                                  "serial_time_s": {p.name: p.total_time for p in profiles.values()}}
                results[kind] = {}
                rhos = {float(r) for r in args.rho.split(",")}
                if not rhos <= {1.0, 1.2}:
                    raise SystemExit(f"--rho takes 1 and/or 1.2, got {args.rho}")
                variants = [(name, scenario, scenario["path"]) for name, scenario in scenarios.items()
                            if HEAVY not in scenario or 1.0 in rhos]
                if 1.2 in rhos:
                    variants += [(f"{name} rho=1.2", scenario, scenario[HEAVY])
                                 for name, scenario in scenarios.items() if HEAVY in scenario]
                for name, scenario, path in variants:
                    rows = budgets(profiles, scenario["networks"], fractions)
                    storages[kind]["budgets"][name] = rows
                    workload = load_workload(path, profiles)
                    results[kind][name] = {}
                    for row in rows:
                        key = f"{row['fraction']:g}"
                        results[kind][name][key] = {}
                        for policy in policies:
                            run = run_one(args, storage, path, {"policy": policy, "memory": row["bytes"]},
                                          repository, profiles_path)
                            run["simulated_mean_response_s"] = simulated(workload, policy, row["bytes"], profiles)
                            results[kind][name][key][policy] = run
                            mean = mean_of(run) if run["outcome"] == "done" else None
                            print(f"{kind} {name} {key} x = {row['bytes'] / 1e6:.0f} MB {policy}: {run['outcome']}, "
                                  f"mean {mean if mean is None else round(mean, 3)} s, wall {run['wall_s']:.0f} s, "
                                  f"major faults {run.get('major_faults', '-')}, "
                                  f"sim {run['simulated_mean_response_s']:.3f} s", flush=True)
            finally:
                storage.remove()
    tight = f"{fractions[0]:g}"
    data = {
        "machine": machine(),
        "swap_bytes": swap,
        "resolution": args.resolution,
        "child_timeout_s": args.child_timeout,
        "storage": storages,
        "runs": results,
        "targets": {kind: targets(by_scenario, tight) for kind, by_scenario in results.items()},
        "wall_s": time.perf_counter() - started,
    }
    js, md = write_results(args.output, data, markdown(data, tight))
    print(f"wrote {js} and {md} in {data['wall_s']:.0f} s")


def _mean(run: dict[str, Any] | None) -> float | None:
    """Mean response of a finished run; a run that did not finish has none."""
    if not run or run.get("outcome") != "done":
        return None
    return mean_of(run)


def targets(results: dict[str, dict[str, dict[str, Any]]], tight: str) -> dict[str, Any]:
    """Per scenario and memory-aware policy: mean / best baseline at the tightest budget."""
    out: dict[str, Any] = {}
    for name, by_budget in results.items():
        row = by_budget.get(tight, {})
        entry: dict[str, Any] = {}
        for policy in MEMORY_AWARE:
            for label, group in (("thesis_baselines", THESIS_BASELINES), ("all_baselines", BASELINES)):
                runs = [row.get(b) for b in group if b in row]
                unfinished = [b for b in group if b in row and row[b].get("outcome") != "done"]
                finished = [m for m in (_mean(r) for r in runs) if m is not None]
                best = min(finished, default=None)
                value = ratio(_mean(row.get(policy)), best)
                entry[f"{policy}_over_best_{label}"] = value
                entry[f"{policy}_{label}_target_met (<= 0.5)"] = None if value is None else value <= 0.5
                if unfinished:
                    entry[f"{label}_not_finished"] = unfinished
        out[name] = entry
    return out


def markdown(data: dict[str, Any], tight: str) -> str:
    m = data["machine"]
    lines = [
        "# MASA vs the thesis's baselines with physical memory = budget (cgroup + swap)",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, load average at start "
        f"{', '.join(f'{x:.1f}' for x in m['load_average_at_start'])}; swap {data['swap_bytes'] / 2**30:.1f} GiB "
        f"(a file on the VM's virtio disk). 2 workers, inputs at {data['resolution']} px. Each run is a fresh "
        "process in its own memory cgroup, limited (once warm, cold pages pushed to swap) to its working set "
        "+ the budget. Mean / p95 response in seconds. `-ungated`: the thesis's memory-oblivious baselines. "
        f"A run still going after {data['child_timeout_s']:.0f} s is stopped and shown as > that; "
        "`oom-killed`: the kernel killed it for memory (the thesis's missing values).",
        "",
    ]
    for kind, by_scenario in data["runs"].items():
        st = data["storage"][kind]
        what = ("this VM's virtio disk, unthrottled" if kind == "vm" else
                f"throttled to a Pi 4's SanDisk Extreme microSD: read {st['read_bps'] / 1e6:.1f} MB/s, "
                f"write {st['write_bps'] / 1e6:.1f} MB/s, {st['read_iops']} / {st['write_iops']} IOPS")
        lines += [f"## Storage: {kind} ({what})", "",
                  "Serial time per network (profiles on this storage): "
                  + ", ".join(f"{n} {t:.2f} s" for n, t in st["serial_time_s"].items()) + ".", ""]
        for name, by_budget in by_scenario.items():
            rows = {f"{r['fraction']:g}": r for r in st["budgets"][name]}
            lines += [f"### {kind}: {name}", "",
                      "| budget | policy | mean | p95 | admitted over budget (over-commit / progress) | cgroup peak above working set MB | major faults | swap at end MB | simulator mean (paging) |",
                      "|---|---|---:|---:|---|---:|---:|---:|---:|"]
            for key, runs in by_budget.items():
                row = rows[key]
                label = f"{key} × = {row['bytes'] / 1e6:.1f} MB{'*' if row['raised_to_largest_task'] else ''}"
                for policy, run in runs.items():
                    sim = fmt(run.get("simulated_mean_response_s"))
                    if run["outcome"] != "done":
                        shown = f"> {data['child_timeout_s']:.0f} (not finished)" if run["outcome"] == "timeout" else run["outcome"]
                        lines.append(f"| {label} | {policy} | {shown} | | | | | | {sim} |")
                        continue
                    stats = run["response_time_s"]
                    lines.append(
                        f"| {label} | {policy} | {fmt(stats['mean'])} | {fmt(stats['p95'])} | "
                        f"{run['overcommits']} / {run['progress_rule_fired']} | "
                        f"{run['cgroup_peak_above_footprint_bytes'] / 1e6:.1f} | {run['major_faults']} | "
                        f"{run['swap_at_end_bytes'] / 1e6:.1f} | {sim} |")
            lines.append("")
    lines += ["## Targets", "", f"At the tightest budget ({tight} ×), target ≤ 0.5:", "",
              "| storage | scenario | " + " | ".join(f"{p} / {b} baselines" for p in MEMORY_AWARE for b in ("thesis", "all"))
              + " | baselines not finished |",
              "|---|---|" + "---:|" * (2 * len(MEMORY_AWARE)) + "---|"]
    for kind, by_scenario in data["targets"].items():
        for name, t in by_scenario.items():
            unfinished = sorted(set(t.get("thesis_baselines_not_finished", [])) | set(t.get("all_baselines_not_finished", [])))
            cells = [fmt(t.get(f"{p}_over_best_{b}_baselines"), 2) for p in MEMORY_AWARE for b in ("thesis", "all")]
            lines.append(f"| {kind} | {name} | " + " | ".join(cells) + f" | {', '.join(unfinished) or '-'} |")
    lines += ["", "A baseline that did not finish (killed for memory, or stopped at the time limit) counts as "
              "slower than every one that did; where none did, there is no ratio.", "",
              f"Wall time {data['wall_s']:.0f} s.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
