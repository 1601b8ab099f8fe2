"""The ``layerfit`` command itself: the typer app, ``main`` (errors as one line, exit
status 2), ``--version`` and ``--trust-factory``. The commands live in the modules beside
this one, one per command group, and register on :data:`app` when imported."""

from __future__ import annotations

import sys
from typing import Any

import typer
from rich.markup import escape

from layerfit import strict_json
from layerfit.console import make_console
from layerfit.errors import LayerfitError
from layerfit.extras import MissingExtraError, extra_for

app = typer.Typer(
    name="layerfit",
    help="Run deep neural networks within a memory budget smaller than the networks.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = make_console()  # piped: as wide as the output, nothing cut (layerfit.console)


def _print_version(value: bool) -> None:
    if value:
        from layerfit import __version__

        typer.echo(f"layerfit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="print the version and exit"
    ),
    trust_factory: list[str] | None = typer.Option(  # noqa: B008 (typer reads defaults)
        None, "--trust-factory", metavar="MODULE",
        help="run prepared folders whose factory is in MODULE (or under it), e.g. mypkg; repeatable. "
        "Zoo models need none; a folder's own manifest can never add one (also: LAYERFIT_TRUST_FACTORY=a,b)",
    ),
) -> None:
    """Run deep neural networks within a memory budget smaller than the networks."""
    if trust_factory:
        from layerfit.store.trust import trust_factories

        trust_factories(trust_factory)


_WARNED: set[str] = set()


def renamed_option(value: Any, flag: str, old_value: Any, old_flag: str, default: Any = None) -> Any:
    """The value of ``flag``, else of ``old_flag`` (its old name, a hidden alias that
    warns once per process), else ``default``: one name for each setting everywhere."""
    if old_value is None:
        return default if value is None else value
    if value is not None:
        raise LayerfitError(f"{old_flag} is the old name of {flag}: give {flag} only")
    if old_flag not in _WARNED:
        _WARNED.add(old_flag)
        import warnings

        warnings.warn(f"{old_flag} is now {flag}; the old name will be removed", FutureWarning, stacklevel=2)
    return old_value


def print_json(obj: Any) -> None:
    """Print ``obj`` as strict JSON on stdout (machine-readable output of ``--json``):
    a figure that is not finite is null, never a bare NaN that parsers refuse."""
    sys.stdout.write(strict_json.dumps(obj) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``layerfit`` script; returns the exit status."""
    import warnings

    warnings.showwarning = _show_warning  # one line each, as the errors are
    _widen_piped_help(sys.argv[1:] if argv is None else argv)
    try:
        app(args=argv, standalone_mode=False)
    except LayerfitError as exc:
        _print_error(str(exc))
        return 2
    except ModuleNotFoundError as exc:
        extra = extra_for(exc)
        if extra is None:  # not an optional dependency: a broken install, show it
            raise
        _print_error(str(MissingExtraError(exc.name or "", extra)))
        return 2
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        return 130
    except _usage_errors() as exc:  # a missing argument, an unknown option, a bad value
        exc.show()  # type: ignore[attr-defined]
        return exc.exit_code  # type: ignore[attr-defined]
    return 0


HELP_WIDTH = 120
"""Columns of help that is not printed on a terminal: at typer's 80, the options table
cuts long option names (``--cache-weig…``)."""


def _widen_piped_help(args: list[str]) -> None:
    """Lay piped help out for :data:`HELP_WIDTH` columns (``TERMINAL_WIDTH`` and
    ``COLUMNS`` still win). Only where help is asked for (``--help``, or a group named
    alone, which prints its help): typer's help module takes a moment to import."""
    import os

    words = [a for a in args if not a.startswith("-")]
    groups = {group.name for group in app.registered_groups}
    if not ("--help" in args or not words or words[-1] in groups):
        return
    if console.is_terminal or "TERMINAL_WIDTH" in os.environ or "COLUMNS" in os.environ:
        return
    import typer.rich_utils

    if typer.rich_utils.MAX_WIDTH is None:
        typer.rich_utils.MAX_WIDTH = HELP_WIDTH


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    _print_warning(str(message))


def _print_warning(message: str) -> None:
    make_console(stderr=True).print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


def _print_error(message: str) -> None:
    # escaped: "[...]" in a message (a path, a shape the user wrote) is text, not style
    make_console(stderr=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)


def _usage_errors() -> tuple[type[Exception], ...]:
    """Click's usage errors, as raised in non-standalone mode: recent typer releases
    vendor their own copy of click, whose ``ClickException`` is not click's."""
    import click

    vendored = [c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"]
    return (click.ClickException, *vendored)


def print_warnings(caught: list) -> None:
    """Print warnings recorded by ``warnings.catch_warnings(record=True)``, one line each."""
    for w in caught:
        _print_warning(str(w.message))


def limit_label(memory: dict[str, int]) -> str:
    """A ``memory_limit`` report (:meth:`~layerfit.memory_limit.Footprint.to_dict`) as
    one line: the limit, the footprint measured beside the weights, what weights got."""
    from layerfit.memory_limit import describe_footprint
    from layerfit.sizes import format_bytes

    return (
        f"memory limit {format_bytes(memory['memory_limit_bytes'])}: {describe_footprint(memory)} beside the "
        f"weights, weights {format_bytes(memory['weight_budget_bytes'])}"
    )


def parse_shape(text: str | None) -> tuple[int, ...] | None:
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
