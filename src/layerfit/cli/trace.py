"""``layerfit plot-trace``: the Chrome trace ``layerfit run --trace`` writes, drawn as a
read/copy/kernel Gantt chart. A module of its own so that other commands on a prepared
model (``generate``) can register between ``run`` and it: registration order is
``layerfit --help``'s."""

from __future__ import annotations

import typer

from layerfit.cli.app import app, console


@app.command("plot-trace")
def plot_trace(
    trace_file: str = typer.Argument(..., help="trace written by `layerfit run --trace`"),
    output: str = typer.Option(..., "-o", "--output", help="image to write (png, svg, pdf)"),
    force: bool = typer.Option(False, "--force", help="replace an existing image"),
) -> None:
    """Draw the read/copy/kernel Gantt chart with the weight buffer's use beneath it."""
    from layerfit.engine.plot import plot_timeline
    from layerfit.engine.trace import load_timeline
    from layerfit.store.outputs import check_output_file

    check_output_file(output, force=force, option="--output", image=True)
    plot_timeline(load_timeline(trace_file), output)
    console.print(f"wrote {output}")
