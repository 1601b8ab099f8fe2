"""``make demo``: stream ResNet-152 within twice its largest layer and compare.

Prepares ResNet-152 from the zoo (seeded weights), runs it with every weight resident
(``preload``), with the asynchronous pipeline at a budget of twice its largest layer, and
with ``auto`` (``layerfit run``'s default) at half its weights, which keeps what it can
resident and streams the rest; checks the outputs are bit-identical, prints memory and
latency of each, and writes the Gantt chart of the streamed run. Everything lands in
``demo-out/``.

Memory is measured with one engine loaded at a time. The overhead is then measured with
both loaded, alternating preload and async run by run, as the median of the per-pair
ratios: on a shared or throttling machine the speed drifts, and runs taken minutes apart
would compare the drift instead of the pipelines.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from layerfit.console import make_console, progress_bar, table
from layerfit.engine import load, measure
from layerfit.engine.plot import plot_timeline
from layerfit.errors import LayerfitError
from layerfit.sizes import format_bytes
from layerfit.store import example_input, read_manifest


def alternating_overhead(first: Callable[[], object], second: Callable[[], object], pairs: int) -> float:
    """Median over ``pairs`` alternating runs of ``time(second) / time(first) - 1``."""
    ratios = []
    for _ in range(pairs):
        t0 = time.perf_counter()
        first()
        t1 = time.perf_counter()
        second()
        ratios.append((time.perf_counter() - t1) / (t1 - t0))
    return statistics.median(ratios) - 1


def main(model: str = "resnet152", out: str = "demo-out", pairs: int = 5) -> int:
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
    reports = {}
    half = max(manifest.resident_bytes + manifest.total_bytes // 2, budget)  # at least async's budget
    # The steps' bar (on a terminal only), as prepare's in the child before it.
    with progress_bar(f"{model}: preload", total=5) as bar:
        with load(prepared, pipeline="preload") as engine:
            _, reports["preload"] = measure(engine, (x,), repeats=3, warmup=1)
        bar.update(advance=1, description=f"{model}: async at {format_bytes(budget)}")
        with load(prepared, pipeline="async", budget=budget, trace=True) as engine:
            _, reports["async"] = measure(engine, (x,), repeats=3, warmup=1)
            trace = out_dir / "trace.json"
            engine.last_timeline.save(trace)
            gantt = out_dir / "gantt.png"
            plot_timeline(engine.last_timeline, gantt, title=f"{model}: async at {format_bytes(budget)}")
            engine.trace = False
            bar.update(advance=1, description=f"{model}: {pairs} alternating preload/async pairs")
            with load(prepared, pipeline="preload") as resident:
                overhead = alternating_overhead(lambda: resident(x), lambda: engine(x), pairs)
        bar.update(advance=1, description=f"{model}: auto at {format_bytes(half)}")
        with load(prepared, pipeline="auto", budget=half) as engine:
            _, reports["auto"] = measure(engine, (x,), repeats=3, warmup=1)
            kept = len(engine.kept_units)
            bar.update(advance=1, description=f"{model}: {pairs} alternating preload/auto pairs")
            with load(prepared, pipeline="preload") as resident:
                auto_overhead = alternating_overhead(lambda: resident(x), lambda: engine(x), pairs)

    pre, asy, auto = reports["preload"], reports["async"], reports["auto"]
    results = table("pipeline", "weight memory held", "latency (median of 3)", "peak RSS")
    for name, r in reports.items():
        results.add_row(
            name, format_bytes(r["weights_peak_bytes"]), f"{r['latency_s'] * 1e3:.0f} ms",
            format_bytes(r["rss_peak_bytes"]),
        )
    console.print(results)
    console.print(
        f"async delay overhead: {overhead:+.1%} (median of {pairs} alternating preload/async pairs)\n"
        f"auto at {format_bytes(half)}: keeps {kept} of {len(manifest.units)} layers resident and streams the "
        f"rest, delay overhead {auto_overhead:+.1%} (median of {pairs} alternating pairs)"
    )
    same = pre["output_sha256"] == asy["output_sha256"] == auto["output_sha256"]
    console.print(
        f"weight memory reduced by {1 - asy['weights_peak_bytes'] / pre['weights_peak_bytes']:.1%}; "
        f"outputs bit-identical: {'yes' if same else 'NO'} (sha256 {asy['output_sha256'][:16]})"
    )
    console.print(f"Gantt chart: {gantt}   Chrome trace (Perfetto): {trace}")
    return 0 if same else 1


if __name__ == "__main__":
    try:
        sys.exit(main(*sys.argv[1:]))
    except LayerfitError as exc:
        make_console(stderr=True).print(f"[bold red]error:[/] {exc}")
        sys.exit(2)
