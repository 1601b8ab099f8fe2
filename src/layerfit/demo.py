"""``make demo``: stream ResNet-152 within twice its largest layer and compare.

Prepares ResNet-152 from the zoo (seeded weights), runs it with every weight resident
(``preload``) and with the asynchronous pipeline at a budget of twice its largest layer,
checks the two outputs are bit-identical, prints memory and latency of each, and writes
the Gantt chart of the streamed run. Everything lands in ``demo-out/``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from layerfit.engine import load, measure
from layerfit.engine.plot import plot_timeline
from layerfit.errors import LayerfitError
from layerfit.sizes import format_bytes
from layerfit.store import example_input, read_manifest


def main(model: str = "resnet152", out: str = "demo-out") -> int:
    console = Console()
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
    with load(prepared, pipeline="preload") as engine:
        _, reports["preload"] = measure(engine, (x,), repeats=3, warmup=1)
    with load(prepared, pipeline="async", budget=budget, trace=True) as engine:
        _, reports["async"] = measure(engine, (x,), repeats=3, warmup=1)
        trace = out_dir / "trace.json"
        engine.last_timeline.save(trace)
        gantt = out_dir / "gantt.png"
        plot_timeline(engine.last_timeline, gantt, title=f"{model}: async at {format_bytes(budget)}")

    pre, asy = reports["preload"], reports["async"]
    table = Table("pipeline", "weight memory held", "latency (median of 3)", "overhead", "peak RSS")
    for name, r in reports.items():
        overhead = r["latency_s"] / pre["latency_s"] - 1
        table.add_row(
            name, format_bytes(r["weights_peak_bytes"]), f"{r['latency_s'] * 1e3:.0f} ms",
            "-" if name == "preload" else f"{overhead:+.1%}", format_bytes(r["rss_peak_bytes"]),
        )
    console.print(table)
    same = pre["output_sha256"] == asy["output_sha256"]
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
        Console(stderr=True).print(f"[bold red]error:[/] {exc}")
        sys.exit(2)
