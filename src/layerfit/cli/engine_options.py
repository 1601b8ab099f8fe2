"""The engine's options, declared once for every command that loads a prepared model.

Each option maps onto one field of :class:`~layerfit.engine.config.EngineConfig` and
takes its default from that field, so a default is stated in one place; ``run`` and
``tradeoff delay`` declare their engine options with these and build the config with
:func:`engine_config`. Importing this module imports no PyTorch.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import typer

from layerfit.engine.config import DEFAULT_COALESCE_BYTES, EngineConfig

_FIELDS = {f.name: f.default for f in dataclasses.fields(EngineConfig)}


# Each option's default: the field's (read once, so the signatures name a constant).
PIPELINE: str = _FIELDS["pipeline"]
DIRECT_IO: bool = _FIELDS["direct_io"]
ACTIVATIONS: str = _FIELDS["activations"]
GATHER_ROWS: bool = _FIELDS["gather_rows"]
DEVICE: str = _FIELDS["device"]
STAGES: int | None = _FIELDS["stages"]


Pipeline = Annotated[
    str,
    typer.Option(
        "--pipeline",
        help="auto (preload when --budget holds every weight or is not given, else async keeping what fits), "
        "preload, sequential, sync or async",
    ),
]
Budget = Annotated[
    str | None,
    typer.Option(
        "--budget",
        help="weight memory, e.g. 24MB, or a share of the model's weights, e.g. 50% (default: the pipeline's own)",
    ),
]
DirectIO = Annotated[bool, typer.Option("--direct-io/--buffered-io", help="read weights with O_DIRECT")]
Activations = Annotated[
    str, typer.Option("--activations", help="default (PyTorch allocates) or planned (one arena laid out by the planner)")
]
Coalesce = Annotated[
    str, typer.Option("--coalesce", help="read adjacent units with one request up to this size (0: one read per unit)")
]
GatherRows = Annotated[
    bool,
    typer.Option(
        "--rows/--tables-whole",
        help="read an untied embedding table by the rows its ids look up (default), or stream it whole",
    ),
]
Device = Annotated[str, typer.Option("--device", help="cpu, cuda or cuda:N")]
Stages = Annotated[
    int | None,
    typer.Option("--stages", help="2: kernels use the read buffer (cpu default); 3: read, copy, kernel (cuda)"),
]

COALESCE_DEFAULT = f"{DEFAULT_COALESCE_BYTES // 2**20}MiB"
"""``--coalesce``'s default as the help shows it (``EngineConfig.coalesce_bytes``)."""


def engine_config(**options: Any) -> EngineConfig:
    """The config the command line's engine options denote (text read once, here)."""
    return EngineConfig.parse(**options)


__all__ = [
    "COALESCE_DEFAULT",
    "Activations",
    "Budget",
    "Coalesce",
    "Device",
    "DirectIO",
    "GatherRows",
    "Pipeline",
    "Stages",
    "ACTIVATIONS",
    "DEVICE",
    "DIRECT_IO",
    "GATHER_ROWS",
    "PIPELINE",
    "STAGES",
    "engine_config",
]
