"""Output for people: the consoles, tables and progress bars of the command line, the
demo and the benchmarks, in one place so that each prints the same way.

* **Piped output is not cut.** rich lays out for 80 columns where stdout is not a
  terminal, and shortens table cells to fit ("transformer.h.0.attn…"). Here a console
  that is not a terminal is :data:`PIPED_WIDTH` columns wide, so a table keeps its
  natural width and a line its length (a ``COLUMNS`` in the environment still wins),
  and :func:`table`'s cells wrap (fold) instead of ending in an ellipsis where a
  terminal is narrower than they are.
* **Progress shows only where someone watches.** :func:`progress_bar` and :func:`track`
  draw a transient bar on stderr when stderr is a terminal, and nothing otherwise (piped,
  in a log, with ``--json``); stdout stays the command's output alone.

Imports nothing from layerfit's packages: the command line (:mod:`layerfit.cli`), the
demo and the benchmarks all use it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console, ConsoleDimensions
from rich.markup import escape

if TYPE_CHECKING:
    from rich.progress import Progress
    from rich.table import Table

T = TypeVar("T")

PIPED_WIDTH = 1000
"""Columns of a console that is not a terminal: wider than any table or line printed."""


class _Console(Console):
    """A rich console as wide as its output where it is not a terminal."""

    @property
    def size(self) -> ConsoleDimensions:
        dims = super().size
        if self._width is None and not self.is_terminal:  # no width asked for (COLUMNS), piped
            return ConsoleDimensions(PIPED_WIDTH, dims.height)
        return dims

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size


def make_console(*, stderr: bool = False, **options: Any) -> Console:
    """A console on stdout (or stderr) that does not cut piped output."""
    return _Console(stderr=stderr, **options)


def table(*columns: str | tuple[str, str], **options: Any) -> Table:
    """A rich table of ``columns`` (a header, or ``(header, justify)``) whose cells wrap
    (fold) rather than end in an ellipsis where the terminal is too narrow for them."""
    from rich.table import Table

    out = Table(**options)
    for column in columns:
        header, justify = (column, "left") if isinstance(column, str) else column
        out.add_column(header, justify=justify, overflow="fold")  # type: ignore[arg-type]
    return out


class Bar:
    """The task of a :func:`progress_bar`: where no bar shows, moving it does nothing."""

    def __init__(self, progress: Progress, task: Any, shown: bool, output: Console, above: bool) -> None:
        self._progress, self._task, self.shown = progress, task, shown
        self._output, self._above = output, above

    def print(self, *objects: Any, **options: Any) -> None:
        """Print on the command's output: above the bar where the bar and the output share
        the terminal (printed beside it, a line would tear the bar), else as usual."""
        (self._progress.console if self._above else self._output).print(*objects, **options)

    def update(self, *, completed: float | None = None, total: float | None = None,
               advance: float | None = None, description: str | None = None) -> None:
        """Move the bar; ``description`` replaces its label (plain text, not markup)."""
        fields: dict[str, Any] = {}
        if total is not None:
            fields["total"] = total
        if description is not None:
            fields["description"] = escape(description)
        self._progress.update(self._task, completed=completed, advance=advance, **fields)

    def advance(self, steps: float = 1) -> None:
        self._progress.advance(self._task, steps)


@contextmanager
def progress_bar(description: str, *, total: float | None = None, transfer: bool = False,
                 disable: bool = False, output: Console | None = None) -> Iterator[Bar]:
    """A transient bar labelled ``description`` (plain text) on stderr while the block
    runs: only where stderr is a terminal, and never with ``disable`` (``--json``).
    ``total`` None: a bar without an end, counting steps; ``transfer``: bytes (prepare's
    weights written). Lines for ``output`` (stdout) meanwhile go through
    :meth:`Bar.print`: above the bar where stdout is the terminal too, else to stdout."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    err, out = make_console(stderr=True), output or make_console()
    shown = not disable and err.is_terminal
    above = shown and out.is_terminal  # one screen: stdout's lines go above the bar
    with Progress(
        TextColumn("[bold]{task.description}"), BarColumn(),
        DownloadColumn() if transfer else MofNCompleteColumn(), TimeElapsedColumn(),
        console=err, transient=True, disable=not shown,
        # stdout through the bar's console only where it is the same screen: piped, it
        # must stay the command's output, never move to stderr
        redirect_stdout=above,
    ) as progress:
        task = progress.add_task(escape(description), total=total)
        yield Bar(progress, task, shown, out, above)


def track(items: Iterable[T], description: str, *, total: float | None = None,
          disable: bool = False) -> Iterator[T]:
    """``items``, one by one, with a :func:`progress_bar` counting them (``total``
    defaults to ``len(items)`` where it has one)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with progress_bar(description, total=total, disable=disable) as bar:
        for item in items:
            yield item
            bar.advance()


__all__ = ["PIPED_WIDTH", "Bar", "make_console", "progress_bar", "table", "track"]
