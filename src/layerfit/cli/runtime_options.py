"""The runtime's options, declared once for every command that builds a runtime.

Each option sets one field of :class:`~layerfit.schedule.runtime_config.RuntimeConfig`
(``--cache-weights`` sets ``cache_weights``) and its default is that field's, so a
default is stated once, in the config. A command takes the options it needs with
:func:`runtime_options` and gets them as one :class:`RuntimeOptions`; a command whose
defaults must differ passes them as ``overrides`` (``layerfit serve``:
:data:`~layerfit.schedule.runtime_config.SERVER_OVERRIDES`), in that one place::

    @app.command("serve")
    @runtime_options("workers", "policy", "units", overrides=SERVER_OVERRIDES)
    def serve_command(repository: str = ..., runtime: RuntimeOptions = RUNTIME_OPTIONS, ...):
        config = runtime.config(repository, budget)

The options take the place of the ``runtime`` parameter, so ``--help`` lists them there.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import typer

from layerfit.schedule.runtime_config import RuntimeConfig

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class _Option:
    """How the command line spells one field of :class:`RuntimeConfig`."""

    type: type
    flags: tuple[str, ...]
    help: str
    extra: Mapping[str, Any] = field(default_factory=dict)  # typer.Option's other arguments


OPTIONS: Mapping[str, _Option] = {
    "workers": _Option(int, ("--workers",), "worker threads: tasks that run at once", {"min": 1}),
    "policy": _Option(
        str, ("--policy",),
        "scheduling policy: masa-fair (never over a budget each network fits alone), masa (the thesis's "
        "Algorithm 1), masa-fcfs, bulk, bulk-multi, deepeye, fcfs, linear-fcfs, sjf, snf, round-robin "
        "(bulk and linear-fcfs use one worker, deepeye two, as in EdgeCaffe)",
    ),
    "units": _Option(
        str, ("--units",),
        "what one load/execute task covers: layers (one stored layer each, as the thesis), merge:auto "
        "(consecutive layers joined while each model's minimum budget stays the same: fewer reads, lower "
        "latency) or merge:SIZE (up to SIZE per task)",
    ),
    "cache_weights": _Option(
        bool, ("--cache-weights/--no-cache-weights",),
        "keep units loaded by earlier jobs in the budget's spare memory and reuse them instead of reading "
        "them again (evicted whenever a task needs the memory; the thesis reads every job's weights)",
    ),
    "return_freed_memory": _Option(
        str, ("--return-freed-memory",),
        "when the scratch a forward pass frees leaves the process: after-pass (when each pass ends), "
        "eagerly (as soon as it is freed: a few MB less RSS, but models that free and allocate megabytes per "
        "layer compute up to twice as slowly) or never (glibc keeps freed blocks of up to 32 MiB)",
    ),
    "queue_limit": _Option(
        int, ("--queue-limit",), "most inference requests held at once; more get 429", {"min": 1}
    ),
    "verify": _Option(
        str, ("--verify",),
        "when a unit's SHA-256 is checked: first (its first read), always (every read from storage) or "
        "never; a unit that fails takes its model out of service (503) until it is loaded again",
    ),
    "estimates": _Option(
        str, ("--estimates",), "memory/time estimates of each model: capture or profile (statm)"
    ),
    "estimate_factor": _Option(float, ("--estimate-factor",), "scale memory estimates (0.5 … 1.5)"),
    "gated": _Option(
        bool, ("--gated/--ungated",),
        "--ungated: memory-oblivious policies ignore the budget (the thesis's baselines)",
    ),
}

_CONTEXT = "_runtime_options_context"
RUNTIME_OPTIONS: Any = None  # the default of a command's ``runtime`` parameter, replaced by the options


@dataclass(frozen=True)
class RuntimeOptions:
    """The runtime's options as one command line gave them.

    ``values`` holds every option the command takes, by field name (given, or its
    default); ``given`` the ones given on the command line; ``overrides`` the command's
    defaults that differ from :class:`RuntimeConfig`'s.
    """

    values: Mapping[str, Any]
    given: frozenset[str]
    overrides: Mapping[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def config(self, repository: str | Path, memory_budget: int | str, **settings: Any) -> RuntimeConfig:
        """The :class:`RuntimeConfig` of these options, with ``settings`` (other fields
        the command sets itself) over them and the command's overrides under them."""
        merged = {**self.overrides, **self.values, **settings}
        return RuntimeConfig(**{**merged, "repository": repository, "memory_budget": memory_budget})


def runtime_default(name: str, overrides: Mapping[str, Any] | None = None) -> Any:
    """Field ``name``'s default: the override if any, else :class:`RuntimeConfig`'s."""
    if overrides and name in overrides:
        return overrides[name]
    default = {f.name: f.default for f in fields(RuntimeConfig)}[name]
    if default is MISSING:
        raise KeyError(f"RuntimeConfig.{name} has no default")
    return default


def runtime_options(*names: str, overrides: Mapping[str, Any] | None = None) -> Callable[[F], F]:
    """Give a typer command the runtime's options ``names`` (fields of :class:`RuntimeConfig`).

    They replace the command's ``runtime`` parameter (default :data:`RUNTIME_OPTIONS`),
    which receives them as one :class:`RuntimeOptions`. Each default is the field's in
    :class:`RuntimeConfig`, or in ``overrides``.
    """
    unknown = sorted(set(names) - set(OPTIONS))
    if unknown:
        raise ValueError(f"no runtime option for {', '.join(unknown)}")
    overrides = dict(overrides or {})

    def decorate(command: F) -> F:
        signature = inspect.signature(command, eval_str=True)
        params = list(signature.parameters.values())
        at = [p.name for p in params].index("runtime")
        params[at:at + 1] = [
            inspect.Parameter(
                name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=typer.Option(
                    runtime_default(name, overrides), *OPTIONS[name].flags, help=OPTIONS[name].help,
                    **OPTIONS[name].extra,
                ),
                annotation=OPTIONS[name].type,
            )
            for name in names
        ]

        # typer passes the click context to a parameter of this type (to tell given from default)
        context = inspect.Parameter(_CONTEXT, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
        params.insert(0, context)

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            ctx = kwargs.pop(_CONTEXT)
            values = {name: kwargs.pop(name) for name in names}
            given = frozenset(
                name for name in names
                if getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"
            )
            return command(**kwargs, runtime=RuntimeOptions(values, given, overrides))

        run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run  # type: ignore[return-value]

    return decorate


__all__ = ["OPTIONS", "RUNTIME_OPTIONS", "RuntimeOptions", "runtime_default", "runtime_options"]
