"""Files the commands write beside a prepared model: outputs, traces, images.

Every output path is checked by :func:`check_output_file` *before* the work whose result
goes there (finding out afterwards loses that work): its folder exists and is writable,
it is not a directory, its extension is one the writer keeps (numpy and matplotlib
would otherwise append their own and write somewhere else), and it exists only with
``force``. Every command checks its outputs here, so the messages are the same
everywhere and name the option. :func:`write_atomic` then writes through a temporary
file in the same folder and a rename, so an existing file is never left half-overwritten.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from layerfit.errors import LayerfitError, OutputExistsError, OutputPathError
from layerfit.extras import require


def current_umask() -> int:
    """The process's umask, read without changing it (Linux), else the usual 022."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def check_output_file(
    path: str | Path, *, force: bool, option: str, suffixes: Iterable[str] | None = None, image: bool = False
) -> Path:
    """Raise unless ``path`` can be written as asked; see the module docstring. ``image``:
    the extensions matplotlib writes (:func:`image_suffixes`) are the ``suffixes``."""
    path = Path(path)
    writer = "layerfit"
    if image:
        suffixes, writer = image_suffixes(), "matplotlib"
    if path.is_dir():
        raise OutputPathError(f"{option} {path} is a directory: name a file to write")
    parent = path.parent
    if not parent.is_dir():
        raise OutputPathError(f"{option} {path}: folder {parent} does not exist (create it first)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputPathError(f"{option} {path}: folder {parent} is not writable")
    if suffixes is not None:
        allowed = sorted({s.lower() for s in suffixes})
        if path.suffix.lower() not in allowed:
            found = f"'{path.suffix}', which {writer} does not write" if path.suffix else "no extension"
            raise OutputPathError(
                f"{option} {path} has {found}: end the name with one of {', '.join(allowed)}"
            )
    if (path.exists() or path.is_symlink()) and not force:
        raise OutputExistsError(f"{path} already exists (pass --force to replace it)")
    return path


def write_atomic(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` for a temporary file beside ``path`` (same extension), then
    rename it over ``path``; on any failure the temporary file is removed and ``path``
    is untouched. An :class:`OSError` becomes an :class:`OutputPathError`."""
    path = Path(path)
    try:
        fd, name = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix, dir=path.parent)
    except OSError as exc:
        raise OutputPathError(f"cannot write {path}: {exc.strerror or exc}") from exc
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes it private
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise OutputPathError(f"cannot write {path}: {exc.strerror or exc}") from exc
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


def image_suffixes() -> list[str]:
    """The extensions matplotlib writes images in (``.png``, ``.svg``, ``.pdf`` …)."""
    require("matplotlib")  # the plot extra
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    return sorted(f".{s}" for s in FigureCanvasAgg.get_supported_filetypes())


def save_figure(
    fig: Any,
    path: str | Path,
    *,
    error: type[LayerfitError] = OutputPathError,
    close: bool = False,
    **savefig: Any,
) -> Path:
    """Write a matplotlib figure to ``path`` in the format of its extension, atomically
    (:func:`write_atomic`), with ``savefig``'s keywords (``dpi``, ``bbox_inches``).

    The one figure writer of every layer: an extension matplotlib does not write, or a
    path that cannot be written, is an OutputPathError, or ``error`` with its message
    (``ScheduleError``, ``TradeoffError``: the error of the caller's commands). With
    ``close`` the figure is closed afterwards, written or not (pyplot keeps every figure
    it made until then).
    """
    try:
        path = Path(path)
        suffix = path.suffix.lower()
        if suffix not in image_suffixes():
            raise OutputPathError(
                f"cannot write an image to {path}: end the name with one of {', '.join(image_suffixes())}"
            )
        return write_atomic(path, lambda tmp: fig.savefig(tmp, format=suffix[1:], **savefig))
    except OutputPathError as exc:
        if error is OutputPathError:
            raise
        raise error(str(exc)) from None
    finally:
        if close:
            import matplotlib.pyplot as plt

            plt.close(fig)


__all__ = ["check_output_file", "current_umask", "image_suffixes", "save_figure", "write_atomic"]
