"""``make demo``: stream ResNet-152 within twice its largest layer and compare.

Prepares ResNet-152 from the zoo (seeded weights), runs it with every weight resident
(``preload``), with the asynchronous pipeline at a budget of twice its largest layer, and
with ``auto`` (``layerfit run``'s default) within a memory limit for the whole process of
preload's peak less half the weights: it measures its own footprint (interpreter,
libraries, activations) and keeps what the rest holds resident, streaming the others.
Checks the outputs are bit-identical, prints memory and latency of each, and writes the
Gantt chart of the streamed run. Everything lands in ``demo-out/``.

Memory is measured with one engine loaded at a time. Time is measured once, with the
three loaded together, running them in turn round by round: on a shared or throttling
machine the speed drifts, and runs taken minutes apart would compare the drift instead
of the pipelines. Each claim is printed once, saying how it was measured: a pipeline's
latency is the median of its runs in the rounds, its delay the ratio of that median to
preload's from the same rounds, so the two figures of a row never disagree (a table of
latencies taken apart once read +59 % beside a line's +6.9 %).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from layerfit.console import make_console, progress_bar, table
from layerfit.engine import load, measure
from layerfit.engine.plot import plot_timeline
from layerfit.errors import LayerfitError
from layerfit.memory_limit import MIN_HEADROOM
from layerfit.sizes import format_bytes
from layerfit.store import example_input, read_manifest

SLACK = 2 * MIN_HEADROOM
"""What the demo's memory limit adds to the memory preload used less half the weights: the
headroom the engine keeps beyond its measured footprint, and as much for its growth."""


def in_turn(runs: Mapping[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """The median seconds of each of ``runs`` over ``rounds`` rounds, each round calling
    every one once, in order: each median samples the same stretch of the machine's
    drifting speed."""
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            t0 = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - t0)
    return {name: statistics.median(times) for name, times in seconds.items()}


def main(model: str = "resnet152", out: str = "demo-out", rounds: int = 5) -> int:
    console = make_console()
    out_dir = Path(out)
    prepared = out_dir / model
    # Prepare in a child process (with the CLI's progress bar) so that building and
    # capturing the model leave nothing behind in the process whose peak RSS we report.
    done = subprocess.run(
        [sys.executable, "-m", "layerfit.cli", "prepare", model, "-o", str(prepared), "--force"],
        check=False,
    )
    if done.returncode != 0:
        return done.returncode
    manifest = read_manifest(prepared)
    budget = manifest.resident_bytes + 2 * manifest.largest_unit_bytes
    x = example_input(manifest.input_shape, manifest.input_dtype, manifest.seed)
    console.print(
        f"{model}: {len(manifest.units)} layers, {format_bytes(manifest.total_bytes)} of weights, "
        f"largest layer {format_bytes(manifest.largest_unit_bytes)}, input {tuple(manifest.input_shape)}"
    )
    settings = {
        "preload": {"pipeline": "preload"},
        "async": {"pipeline": "async", "budget": budget},
    }
    reports = {}
    # The steps' bar (on a terminal only), as prepare's in the child before it.
    with progress_bar(f"{model}: preload", total=4) as bar:
        with load(prepared, **settings["preload"]) as engine:
            _, reports["preload"] = measure(engine, (x,), repeats=3, warmup=1)
        # auto within the memory preload's process took, less half the weights, plus the
        # headroom a limit keeps for the allocator's slack: the engine measures its own
        # footprint and spends what the limit leaves on weights
        limit = reports["preload"]["rss_peak_bytes"] - manifest.total_bytes // 2 + SLACK
        settings["auto"] = {"pipeline": "auto", "memory_limit": limit}
        bar.update(advance=1, description=f"{model}: auto within {format_bytes(limit)}")
        with load(prepared, **settings["auto"]) as engine:
            _, reports["auto"] = measure(engine, (x,), repeats=3, warmup=1)
            kept, footprint = len(engine.kept_units), engine.footprint
            kept = len(manifest.units) if engine.policy.resident else kept
        # Loaded beside the others, a limit would count their weights as its footprint: the
        # rounds run auto at the budget its own limit left it.
        settings["auto"] = {"pipeline": "auto", "budget": footprint.weight_budget_bytes}
        bar.update(advance=1, description=f"{model}: async at {format_bytes(budget)}")
        with load(prepared, **settings["async"], trace=True) as engine:
            _, reports["async"] = measure(engine, (x,), repeats=3, warmup=1)
            trace = out_dir / "trace.json"
            engine.last_timeline.save(trace)
            gantt = out_dir / "gantt.png"
            plot_timeline(engine.last_timeline, gantt, title=f"{model}: async at {format_bytes(budget)}")
        bar.update(advance=1, description=f"{model}: {rounds} rounds of the three in turn")
        with load(prepared, **settings["preload"]) as pre, load(prepared, **settings["async"]) as asy, \
                load(prepared, **settings["auto"]) as auto:
            pre(x), asy(x), auto(x)  # warm-up: each engine's first pass reads and checks its units
            latency = in_turn({"preload": lambda: pre(x), "async": lambda: asy(x), "auto": lambda: auto(x)}, rounds)
        bar.update(advance=1)

    results = table(
        "pipeline", "weight memory held", "peak RSS", f"latency (median of {rounds} rounds)", "delay vs preload",
    )
    for name in ("preload", "async", "auto"):
        r = reports[name]
        delay = "-" if name == "preload" else f"{latency[name] / latency['preload'] - 1:+.1%}"
        results.add_row(
            name, format_bytes(r["weights_peak_bytes"]), format_bytes(r["rss_peak_bytes"]),
            f"{latency[name] * 1e3:.0f} ms", delay,
        )
    console.print(results)
    console.print(
        "memory: each pipeline loaded alone (weight memory held: the most its buffers held in a pass).\n"
        f"time: the three loaded together and run in turn, {rounds} rounds after one to warm up; the delay is a "
        "pipeline's latency over preload's, both from those rounds.\n"
        f"async at {format_bytes(budget)} streams every layer; auto within a memory limit of {format_bytes(limit)} "
        f"(preload's peak RSS less half the weights, plus {format_bytes(SLACK)}) measured its {footprint.describe()} "
        f"and gave the weights {format_bytes(footprint.weight_budget_bytes)}: it keeps {kept} of {len(manifest.units)} layers resident "
        "and streams the rest."
    )
    pre_r, asy_r, auto_r = reports["preload"], reports["async"], reports["auto"]
    same = pre_r["output_sha256"] == asy_r["output_sha256"] == auto_r["output_sha256"]
    console.print(
        f"weight memory reduced by {1 - asy_r['weights_peak_bytes'] / pre_r['weights_peak_bytes']:.1%} (async "
        f"against preload); outputs bit-identical: {'yes' if same else 'NO'} (sha256 {asy_r['output_sha256'][:16]})"
    )
    console.print(f"Gantt chart: {gantt}   Chrome trace (Perfetto): {trace}")
    return 0 if same else 1


if __name__ == "__main__":
    try:
        sys.exit(main(*sys.argv[1:3], *map(int, sys.argv[3:4])))  # MODEL OUT ROUNDS
    except LayerfitError as exc:
        make_console(stderr=True).print(f"[bold red]error:[/] {exc}")
        sys.exit(2)
