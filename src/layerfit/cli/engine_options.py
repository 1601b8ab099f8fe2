"""The engine's options, declared once for every command that loads a prepared model.

Each option sets one setting of :class:`~layerfit.engine.config.EngineConfig` and takes
that field's default, through the mechanism the runtime's options use
(:mod:`.config_options`): ``run`` and ``tradeoff delay`` name the options they take
with :func:`engine_options` and build the config with :meth:`EngineOptions.config`.
Importing this module imports no PyTorch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from layerfit.cli.config_options import (
    OPTIONS_PARAMETER,
    ConfigOptions,
    Option,
    config_options,
    option_default,
)
from layerfit.engine.config import DEFAULT_COALESCE_BYTES, EngineConfig

OPTIONS: Mapping[str, Option] = {
    "pipeline": Option(
        str, ("--pipeline",),
        "auto (preload when --budget holds every weight or is not given, else async keeping what fits), "
        "preload, sequential, sync or async",
    ),
    "budget": Option(
        str | None, ("--budget",),
        "weight memory, e.g. 24MB, or a share of the model's weights, e.g. 50% (default: the pipeline's own)",
    ),
    "memory_limit": Option(
        str | None, ("--memory-limit",),
        "bound the whole process, not only its weights, e.g. 800MB: layerfit measures its own footprint "
        "(libraries, activations, KV cache) and spends the rest on weights (--budget then at most that)",
    ),
    "units": Option(
        str, ("--units",),
        "layers, blocks:N, merge:SIZE (consecutive layers up to SIZE per block) or swapnet (SwapNet "
        "partition for --budget)",
    ),
    "direct_io": Option(bool, ("--direct-io/--buffered-io",), "read weights with O_DIRECT"),
    "activations": Option(
        str, ("--activations",), "default (PyTorch allocates) or planned (one arena laid out by the planner)"
    ),
    "coalesce": Option(
        str, ("--coalesce",), "read adjacent units with one request up to this size (0: one read per unit)",
        default=f"{DEFAULT_COALESCE_BYTES // 2**20}MiB",  # EngineConfig.coalesce_bytes, as text
    ),
    "gather_rows": Option(
        bool, ("--rows/--tables-whole",),
        "read an untied embedding table by the rows its ids look up (default), or stream it whole",
    ),
    "read_ahead": Option(
        bool, ("--read-ahead/--no-read-ahead",),
        "when a pass ends, read the next one's first units while the caller works (default), or not",
    ),
    "expert_cache": Option(
        bool, ("--expert-cache/--no-expert-cache",),
        "under auto, hold single experts in what the budget leaves (default), or give it to the read buffer",
    ),
    "expert_prefetch": Option(
        bool, ("--expert-prefetch/--no-expert-prefetch",),
        "read the next MoE layer's experts, guessed by its router a layer early, ahead (default), or not",
    ),
    "dequantize": Option(
        bool, ("--dequantize/--packed",),
        "a GGUF model: dequantize each weight to the values transformers' GGUF loader gives (outputs bit-equal "
        "to it), or run linear layers packed on int4/bf16 kernels (default, faster)",
    ),
    "device": Option(str, ("--device",), "cpu, cuda or cuda:N"),
    "stages": Option(
        int | None, ("--stages",), "2: kernels use the read buffer (cpu default); 3: read, copy, kernel (cuda)"
    ),
}

ENGINE_OPTIONS: Any = OPTIONS_PARAMETER  # the default of a command's ``options`` parameter


class EngineOptions(ConfigOptions):
    """The engine's options as one command line gave them (see :class:`ConfigOptions`)."""

    def config(self, **settings: Any) -> EngineConfig:
        """The :class:`EngineConfig` of these options, with ``settings`` (what the command
        sets itself) over them: text is read here, once (:meth:`EngineConfig.parse`)."""
        return EngineConfig.parse(**{**self.overrides, **self.values, **settings})


def engine_default(name: str) -> Any:
    """Setting ``name``'s default, as :class:`EngineConfig` states it."""
    return option_default(EngineConfig, OPTIONS, name)


def engine_options(*names: str) -> Callable[[Any], Any]:
    """Give a typer command the engine's options ``names`` in place of its ``options``
    parameter, which receives them as one :class:`EngineOptions`."""
    return config_options(EngineConfig, OPTIONS, names, parameter="options", group=EngineOptions)


__all__ = ["ENGINE_OPTIONS", "OPTIONS", "EngineOptions", "engine_default", "engine_options"]
