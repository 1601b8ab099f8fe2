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


if __name__ == "__main__":
    sys.exit(main())
