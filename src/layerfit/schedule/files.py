"""Reading inputs and writing outputs of the ``layerfit schedule`` commands.

Every file the commands read goes through :func:`read_text`, so a missing, binary or
directory path is a :class:`~layerfit.errors.ScheduleError` naming the file, never a
traceback. Every output is checked by :func:`~layerfit.store.outputs.check_output_file`
*before* any long work (a measurement, a run), because finding out afterwards loses
that work; it is then written by :func:`write_text` (a figure by
:func:`~layerfit.store.outputs.save_figure` with ``error=ScheduleError``) through a
temporary file and a rename, so nothing is half-written, and an existing file is
replaced only with ``--force`` (a directory never).
"""

from __future__ import annotations

from pathlib import Path

from layerfit.errors import OutputPathError, ScheduleError
from layerfit.store import outputs


def read_text(path: str | Path, what: str, error: type[ScheduleError] = ScheduleError) -> str:
    """The UTF-8 text of ``path``; ``error("cannot read {what} {path}: …")`` when it
    is missing, a directory, unreadable or not text."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        reason = "file not found"
    except IsADirectoryError:
        reason = "it is a directory, not a file"
    except OSError as exc:
        reason = exc.strerror or str(exc)
    except UnicodeDecodeError as exc:
        reason = f"not a UTF-8 text file (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"
    raise error(f"cannot read {what} {path}: {reason}")


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` via a temporary file and a rename (never half-written)."""
    try:
        return outputs.write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    except OutputPathError as exc:
        raise ScheduleError(str(exc)) from None


__all__ = ["read_text", "write_text"]
