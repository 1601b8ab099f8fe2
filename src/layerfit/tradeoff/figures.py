"""Figures of the trade-off commands, written the way every output of layerfit is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from layerfit.errors import OutputPathError, TradeoffError
from layerfit.store import outputs


def save_figure(fig: Any, path: str | Path, dpi: int = 110) -> Path:
    """Write a matplotlib figure atomically (temporary file in the same directory, then
    rename), in the format of ``path``'s extension (the CLI checks the path first, with
    :func:`~layerfit.store.outputs.check_output_file`); a path that cannot be written is
    a :class:`~layerfit.errors.TradeoffError`."""
    try:
        return outputs.save_figure(fig, path, dpi=dpi)
    except OutputPathError as exc:
        raise TradeoffError(str(exc)) from exc
