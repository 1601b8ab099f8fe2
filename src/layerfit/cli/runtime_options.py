"""The runtime's options, declared once for every command that builds a runtime.

Each option sets one field of :class:`~layerfit.schedule.runtime.config.RuntimeConfig`
(``--cache-weights`` sets ``cache_weights``) and its default is that field's, so a
default is stated once, in the config. A command takes the options it needs with
:func:`runtime_options` (the shared mechanism of :mod:`.config_options`) and gets them as
one :class:`RuntimeOptions`; a command whose defaults must differ passes them as
``overrides`` (``layerfit serve``:
:data:`~layerfit.schedule.runtime.config.SERVER_OVERRIDES`), in that one place::

    @app.command("serve")
    @runtime_options("workers", "policy", "units", overrides=SERVER_OVERRIDES)
    def serve_command(repository: str = ..., runtime: RuntimeOptions = RUNTIME_OPTIONS, ...):
        config = runtime.config(repository, budget)

The options take the place of the ``runtime`` parameter, so ``--help`` lists them there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from layerfit.cli.config_options import (
    OPTIONS_PARAMETER,
    ConfigOptions,
    Option,
    config_options,
    option_default,
)
from layerfit.schedule.runtime.config import RuntimeConfig, size_setting

OPTIONS: Mapping[str, Option] = {
    "workers": Option(int, ("--workers",), "worker threads: tasks that run at once", {"min": 1}),
    "policy": Option(
        str, ("--policy",),
        "scheduling policy: masa-fair (never over a budget each network fits alone), masa (the thesis's "
        "Algorithm 1), masa-fcfs, bulk, bulk-multi, deepeye, fcfs, linear-fcfs, sjf, snf, round-robin "
        "(bulk and linear-fcfs use one worker, deepeye two, as in EdgeCaffe)",
    ),
    "units": Option(
        str, ("--units",),
        "what one load/execute task covers: layers (one stored layer each, as the thesis), merge:auto "
        "(consecutive layers joined while each model's minimum budget stays the same: fewer reads, lower "
        "latency) or merge:SIZE (up to SIZE per task)",
    ),
    "cache_weights": Option(
        bool, ("--cache-weights/--no-cache-weights",),
        "keep units loaded by earlier jobs in the budget's spare memory and reuse them instead of reading "
        "them again (evicted whenever a task needs the memory; the thesis reads every job's weights)",
    ),
    "return_freed_memory": Option(
        str, ("--return-freed-memory",),
        "when the scratch a forward pass frees leaves the process: after-pass (when each pass ends), "
        "eagerly (as soon as it is freed: a few MB less RSS, but models that free and allocate megabytes per "
        "layer compute up to twice as slowly) or never (glibc keeps freed blocks of up to 32 MiB)",
    ),
    "queue_limit": Option(
        int, ("--queue-limit",), "most inference requests held at once; more get 429", {"min": 1}
    ),
    "verify": Option(
        str, ("--verify",),
        "when a unit's SHA-256 is checked: first (its first read), always (every read from storage) or "
        "never; a unit that fails takes its model out of service (503) until it is loaded again",
    ),
    "dequantize": Option(
        bool, ("--dequantize/--packed",),
        "a GGUF model: compute with its weights dequantized to transformers' values (outputs bit-equal to its "
        "GGUF model), or packed on int4/bf16 kernels (default, faster)",
    ),
    "estimates": Option(
        str, ("--estimates",), "memory/time estimates of each model: capture or profile (statm)"
    ),
    "estimate_factor": Option(float, ("--estimate-factor",), "scale memory estimates (0.5 … 1.5)"),
    "gated": Option(
        bool, ("--gated/--ungated",),
        "--ungated: memory-oblivious policies ignore the budget (the thesis's baselines)",
    ),
}

RUNTIME_OPTIONS: Any = OPTIONS_PARAMETER  # the default of a command's ``runtime`` parameter


class RuntimeOptions(ConfigOptions):
    """The runtime's options as one command line gave them (see :class:`ConfigOptions`)."""

    def config(self, repository: str | Path, memory_budget: int | str, **settings: Any) -> RuntimeConfig:
        """The :class:`RuntimeConfig` of these options, with ``settings`` (other fields
        the command sets itself) over them and the command's overrides under them.
        ``memory_budget`` is ``--budget``'s text (or bytes), read here, once, so that a
        size that is no size is refused naming the flag."""
        merged = {**self.overrides, **self.values, **settings}
        budget = size_setting(memory_budget, "--budget")
        return RuntimeConfig(**{**merged, "repository": repository, "memory_budget": budget})


def runtime_default(name: str, overrides: Mapping[str, Any] | None = None) -> Any:
    """Field ``name``'s default: the override if any, else :class:`RuntimeConfig`'s."""
    return option_default(RuntimeConfig, OPTIONS, name, overrides)


def runtime_options(*names: str, overrides: Mapping[str, Any] | None = None) -> Callable[[Any], Any]:
    """Give a typer command the runtime's options ``names`` (fields of :class:`RuntimeConfig`)
    in place of its ``runtime`` parameter, which receives them as one :class:`RuntimeOptions`."""
    return config_options(RuntimeConfig, OPTIONS, names, parameter="runtime", group=RuntimeOptions, overrides=overrides)


__all__ = ["OPTIONS", "RUNTIME_OPTIONS", "RuntimeOptions", "runtime_default", "runtime_options"]
