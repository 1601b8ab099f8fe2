"""The ``layerfit`` command: parses arguments, calls the library, prints results.

Thin by design: every command is a few lines over a library function. Errors caused by
the user (:class:`~layerfit.errors.LayerfitError`) are printed as one line without a
traceback and exit with status 2.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from rich.console import Console

from layerfit.errors import LayerfitError

app = typer.Typer(
    name="layerfit",
    help="Run deep neural networks within a memory budget smaller than the networks.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()


def print_json(obj: Any) -> None:
    """Print ``obj`` as JSON on stdout (machine-readable output of ``--json``)."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``layerfit`` script; returns the exit status."""
    try:
        app(args=argv, standalone_mode=False)
    except LayerfitError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return 2
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        return 130
    except Exception as exc:  # click usage errors arrive here in non-standalone mode
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            return exc.exit_code
        raise
    return 0


# --- commands -------------------------------------------------------------------------
# Each command block below belongs to one layer of the package; keep them thin.

# --- schedule (MASA / EdgeCaffe: task graphs, policies, simulator, exact optimum) -------
from layerfit.schedule.cli import app as schedule_app  # noqa: E402

app.add_typer(schedule_app, name="schedule")

# --- tradeoff (Minakova & Stefanov: buffer reuse, processing by parts, genetic search) ---
tradeoff_app = typer.Typer(
    help="Memory-throughput trade-offs: buffer reuse, processing by parts, pipelines.",
    no_args_is_help=True,
)
app.add_typer(tradeoff_app, name="tradeoff")


@tradeoff_app.command("parts")
def tradeoff_parts(
    app_file: str = typer.Argument(..., help="Application YAML file (CNNs, partitions, constraints)."),
    memory: str | None = typer.Option(None, "--memory", help="Memory constraint M^c, e.g. 15MB."),
    throughput: list[str] | None = typer.Option(  # noqa: B008 (typer reads defaults)
        None, "--throughput", help="Throughput constraint: fps for every CNN (40) or CNN=fps; repeatable."
    ),
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    plot: bool = typer.Option(False, "--plot", help="Write the Pareto front to <APP>-pareto.png."),
    model_throughput: bool = typer.Option(
        False, "--model-throughput", help="Use the analytic delay model instead of measuring."
    ),
    generations: int = typer.Option(30, "--generations", min=1, help="GA generations."),
    population: int = typer.Option(40, "--population", min=4, help="GA population size."),
    seed: int = typer.Option(0, "--seed", help="GA seed."),
    select: str = typer.Option("throughput", "--select", help="Among feasible points: throughput or memory."),
) -> None:
    """Choose which layers process by parts so the application fits (Algorithm 2)."""
    from pathlib import Path

    from layerfit.tradeoff.cli_support import run_parts_command

    result, lines, rows = run_parts_command(
        app_file, memory, throughput or [], model_throughput, generations, population, seed, select
    )
    if plot:
        from layerfit.tradeoff.report import plot_pareto

        lines.append(f"plot written to {plot_pareto(result, Path(Path(app_file).stem + '-pareto.png'))}")
    if json_output:
        print_json(result.to_dict())
    else:
        from rich.table import Table

        table = Table(title=f"{result.derived.app.name}: memory-throughput trade-off")
        for column in ("configuration", "memory", "buffers", "throughput", "by_parts"):
            table.add_column(column)
        for row in rows:
            table.add_row(*(str(row[c]) for c in ("configuration", "memory", "buffers", "throughput", "by_parts")))
        console.print(table)
        for line in lines:
            console.print(line, highlight=False)
    if not result.feasible:
        raise typer.Exit(1)


# --- store and engine (prepare, inspect, verify, run, plot-trace) ----------------------


def _parse_shape(text: str | None) -> tuple[int, ...] | None:
    from layerfit.errors import InputError

    if text is None:
        return None
    try:
        shape = tuple(int(p) for p in text.replace("x", ",").split(",") if p.strip())
    except ValueError:
        shape = ()
    if not shape or any(d <= 0 for d in shape):
        raise InputError(f"cannot read input shape {text!r}: write dimensions like 1,3,224,224")
    return shape


@app.command()
def prepare(
    model: str = typer.Argument(..., help="zoo name (see `layerfit zoo`) or package.module:factory"),
    output: str = typer.Option(..., "-o", "--output", help="directory to create"),
    input_shape: str = typer.Option(None, "--input-shape", help="e.g. 1,3,224,224 (default: the model's)"),
    input_dtype: str = typer.Option("float32", "--input-dtype"),
    checkpoint: str = typer.Option(None, "--checkpoint", help="weights from a .safetensors file"),
    seed: int = typer.Option(0, "--seed", help="seed of the zoo's initialisation and the example input"),
    force: bool = typer.Option(False, "--force", help="replace an existing directory"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Capture MODEL and pack its weights in execution order into a prepared directory."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    from layerfit.sizes import format_bytes
    from layerfit.store import prepare as do_prepare

    with Progress(
        TextColumn("[bold]preparing[/] " + model), BarColumn(), DownloadColumn(),
        console=Console(stderr=True), transient=True, disable=as_json,
    ) as bar:
        task = bar.add_task("write", total=None)
        manifest = do_prepare(
            model, output, input_shape=_parse_shape(input_shape), input_dtype=input_dtype,
            checkpoint=checkpoint, force=force, seed=seed,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    summary = {
        "directory": output,
        "model": manifest.model,
        "input_shape": list(manifest.input_shape),
        "units": len(manifest.units),
        "weights_bytes": manifest.total_bytes,
        "largest_unit_bytes": manifest.largest_unit_bytes,
        "resident_bytes": manifest.resident_bytes,
        "capture": manifest.graph.method,
    }
    if as_json:
        print_json(summary)
    else:
        console.print(
            f"prepared {model} -> {output}: {len(manifest.units)} units, "
            f"{format_bytes(manifest.total_bytes)} of weights, largest unit "
            f"{format_bytes(manifest.largest_unit_bytes)} (capture: {manifest.graph.method})"
        )


@app.command()
def inspect(
    directory: str = typer.Argument(..., help="prepared model directory"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Show a prepared model: units with sizes and offsets, resident tensors, totals."""
    from rich.table import Table

    from layerfit.sizes import format_bytes
    from layerfit.store import read_manifest

    m = read_manifest(directory)
    units = [
        {"index": u.index, "name": u.name, "type": u.module_type, "nbytes": u.nbytes,
         "payload_bytes": u.payload_bytes, "offset": u.offset, "d": u.d, "f": u.f, "sha256": u.sha256}
        for u in m.units
    ]
    info = {
        "model": m.model,
        "input_shape": list(m.input_shape),
        "input_dtype": m.input_dtype,
        "weights_file": m.weights_file,
        "weights_bytes": m.total_bytes,
        "largest_unit_bytes": m.largest_unit_bytes,
        "minimum_budget_bytes": m.largest_unit_bytes + m.resident_bytes,
        "resident_bytes": m.resident_bytes,
        "resident_tensors": [
            {"name": t.name, "nbytes": t.nbytes, "places": list(t.places)} for t in (m.resident.tensors if m.resident else ())
        ],
        "unused_tensors": m.graph.unused,
        "capture": m.graph.method,
        "macs": m.graph.total_macs,
        "ops": len(m.graph.ops),
        "activation_tensors": len(m.graph.tensors),
        "units": units,
    }
    if as_json:
        print_json(info)
        return
    console.print(
        f"[bold]{m.model['name']}[/] input {tuple(m.input_shape)} {m.input_dtype}: "
        f"{len(m.units)} units, {format_bytes(m.total_bytes)} weights, largest unit "
        f"{format_bytes(m.largest_unit_bytes)}, resident {format_bytes(m.resident_bytes)}, "
        f"{m.graph.total_macs / 1e9:.2f} GMACs, minimum budget "
        f"{format_bytes(info['minimum_budget_bytes'])}"
    )
    table = Table("#", "unit", "type", "bytes", "offset", "d", "MMACs")
    for u in m.units:
        table.add_row(str(u.index), u.name, u.module_type, format_bytes(u.nbytes), str(u.offset), str(u.d), f"{u.f / 1e6:.1f}")
    console.print(table)


@app.command()
def verify(directory: str = typer.Argument(..., help="prepared model directory")) -> None:
    """Read every unit and check its SHA-256 against the manifest."""
    from layerfit.store import SegmentReader, aligned_buffer, read_manifest, verify_segment

    m = read_manifest(directory)
    largest = max((s.nbytes for s in m.segments), default=0)
    buf = aligned_buffer(largest)
    view = memoryview(buf)
    with SegmentReader(f"{directory}/{m.weights_file}", m.weights_size) as reader:
        for seg in m.segments:
            reader.read(seg, view)
            verify_segment(seg, view)
    view.release()
    console.print(f"{directory}: {len(m.segments)} segments verified ({reader.mode} I/O)")


def _load_input(path: str | None, manifest):
    from layerfit.errors import InputError
    from layerfit.store import example_input

    if path is None:
        return example_input(manifest.input_shape, manifest.input_dtype, manifest.seed)
    import numpy as np
    import torch

    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read input {path}: {exc}") from exc
    if tuple(arr.shape) != tuple(manifest.input_shape) or str(arr.dtype) != manifest.input_dtype:
        raise InputError(
            f"input {path} is {arr.dtype} {tuple(arr.shape)}; the model expects "
            f"{manifest.input_dtype} {tuple(manifest.input_shape)}"
        )
    return torch.from_numpy(arr)


def _save_output(path: str, out) -> None:
    import numpy as np

    from layerfit.engine import flat_outputs

    outs = [t.numpy() for t in flat_outputs(out)]
    if path.endswith(".npz"):
        np.savez(path, *outs)
    elif len(outs) == 1:
        np.save(path, outs[0])
    else:
        from layerfit.errors import InputError

        raise InputError(f"the model has {len(outs)} outputs: save them to a .npz file")


@app.command()
def run(
    directory: str = typer.Argument(..., help="prepared model directory"),
    pipeline: str = typer.Option("preload", "--pipeline", help="preload, sequential, sync or async"),
    budget: str = typer.Option(None, "--budget", help="weight memory, e.g. 24MB (default: the pipeline's own)"),
    units: str = typer.Option("layers", "--units", help="layers or blocks:N"),
    input_path: str = typer.Option(None, "--input", help="input .npy (default: seeded random)"),
    output_path: str = typer.Option(None, "--output", help="save the output to .npy/.npz"),
    repeats: int = typer.Option(3, "--repeats", min=1),
    warmup: int = typer.Option(1, "--warmup", min=0),
    trace: str = typer.Option(None, "--trace", help="write a Chrome trace of the median run"),
    direct_io: bool = typer.Option(True, "--direct-io/--buffered-io"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Execute a prepared model under a weight budget and report latency and memory."""
    from layerfit.engine import load, measure
    from layerfit.sizes import format_bytes

    with load(directory, budget=budget, pipeline=pipeline, units=units, direct_io=direct_io, trace=trace is not None) as engine:
        x = _load_input(input_path, engine.manifest)
        out, report = measure(engine, (x,), repeats=repeats, warmup=warmup)
        if trace:
            engine.last_timeline.save(trace)
            report["trace"] = trace
    if output_path:
        _save_output(output_path, out)
    if as_json:
        report.pop("latencies_s", None)
        print_json(report)
        return
    console.print(
        f"{report['model']} [{report['pipeline']}, {report['units']} units, {report['io_mode']} I/O]: "
        f"latency {report['latency_s'] * 1e3:.1f} ms (median of {repeats}), weights peak "
        f"{format_bytes(report['weights_peak_bytes'])} of {format_bytes(report['weights_total_bytes'])}, "
        f"peak RSS {format_bytes(report['rss_peak_bytes'])}\n"
        f"output {report['output_shape']} sha256 {report['output_sha256'][:16]}"
    )


@app.command("plot-trace")
def plot_trace(
    trace_file: str = typer.Argument(..., help="trace written by `layerfit run --trace`"),
    output: str = typer.Option(..., "-o", "--output", help="image to write (png, svg, pdf)"),
) -> None:
    """Draw the read/copy/kernel Gantt chart with the weight buffer's use beneath it."""
    from layerfit.engine.plot import plot_timeline
    from layerfit.engine.trace import load_timeline

    plot_timeline(load_timeline(trace_file), output)
    console.print(f"wrote {output}")


if __name__ == "__main__":
    sys.exit(main())
