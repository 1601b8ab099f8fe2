"""``layerfit zoo``: the built-in architectures of the papers."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from layerfit.cli.app import app, console, print_json

if TYPE_CHECKING:
    pass


# --- zoo (the papers' networks) -------------------------------------------------------


@app.command("zoo")
def zoo_command(
    as_json: bool = typer.Option(False, "--json", help="print the table as JSON"),
) -> None:
    """List the built-in models: name, parameters, parameter MB, default input shape."""
    from layerfit.console import table as new_table
    from layerfit.zoo import table

    rows = table()
    if as_json:
        print_json(rows)
        return
    out = new_table(("name", "left"), ("params", "right"), ("param MB", "right"), ("input shape", "left"),
                    ("published", "right"), title="layerfit model zoo", title_justify="left")
    for r in rows:
        pub = r["published_params_m"]
        out.add_row(r["name"], f"{r['params']:,}", f"{r['param_mb']:.1f}",
                    "x".join(str(d) for d in r["input_shape"]), f"{pub} M" if pub else "-")
    console.print(out)
