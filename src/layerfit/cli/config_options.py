"""Option groups that map one to one onto a config class, each default stated once.

A table of :class:`Option` says how the command line spells settings of a config class
(``--cache-weights`` sets ``RuntimeConfig.cache_weights``); :func:`config_options` gives
a typer command the options it names from that table, in place of one parameter (say
``runtime``), which receives them as one :class:`ConfigOptions`. Each default is the
config field's (or the option's own, for a setting the config reads from text, such as
``--coalesce``), unless the command passes ``overrides``: the one place its defaults
differ. The runtime's options (:mod:`.runtime_options`) and the engine's
(:mod:`.engine_options`) are two tables of this one mechanism.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

import typer

F = TypeVar("F", bound=Callable[..., Any])

_CONTEXT = "_config_options_context"
FROM_FIELD: Any = object()  # an option's default is its config field's
OPTIONS_PARAMETER: Any = None  # the default of a command's options parameter, replaced by the options


@dataclass(frozen=True)
class Option:
    """How the command line spells one setting: its type, flags and help; ``default``
    for a setting that is no field of the config (read by its ``parse``), else the
    field's; ``extra``: typer.Option's other arguments."""

    type: Any
    flags: tuple[str, ...]
    help: str
    extra: Mapping[str, Any] = field(default_factory=dict)
    default: Any = FROM_FIELD


@dataclass(frozen=True)
class ConfigOptions:
    """A group of options as one command line gave them: ``values`` by setting name
    (given, or the default), ``given`` the ones on the command line, ``overrides`` the
    command's defaults that differ from the config's."""

    values: Mapping[str, Any]
    given: frozenset[str]
    overrides: Mapping[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.values[name]


def option_default(config: type, table: Mapping[str, Option], name: str, overrides: Mapping[str, Any] | None = None) -> Any:
    """Setting ``name``'s default: the command's override, else the option's own, else
    the field's in ``config``."""
    if overrides and name in overrides:
        return overrides[name]
    if table[name].default is not FROM_FIELD:
        return table[name].default
    default = {f.name: f.default for f in fields(config)}[name]
    if default is MISSING:
        raise KeyError(f"{config.__name__}.{name} has no default")
    return default


def config_options(
    config: type,
    table: Mapping[str, Option],
    names: tuple[str, ...],
    *,
    parameter: str,
    group: type[ConfigOptions] = ConfigOptions,
    overrides: Mapping[str, Any] | None = None,
) -> Callable[[F], F]:
    """Give a typer command the options ``names`` of ``table`` in place of its
    ``parameter`` (default :data:`OPTIONS_PARAMETER`), which receives them as one
    ``group``. Each default is :func:`option_default`'s."""
    unknown = sorted(set(names) - set(table))
    if unknown:
        raise ValueError(f"no {config.__name__} option for {', '.join(unknown)}")
    overrides = dict(overrides or {})

    def decorate(command: F) -> F:
        signature = inspect.signature(command, eval_str=True)
        params = list(signature.parameters.values())
        at = [p.name for p in params].index(parameter)
        params[at : at + 1] = [
            inspect.Parameter(
                name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=typer.Option(
                    option_default(config, table, name, overrides), *table[name].flags,
                    help=table[name].help, **table[name].extra,
                ),
                annotation=table[name].type,
            )
            for name in names
        ]
        # typer passes the click context to a parameter of this type (to tell given from default)
        params.insert(0, inspect.Parameter(_CONTEXT, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context))

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            ctx = kwargs.pop(_CONTEXT)
            values = {name: kwargs.pop(name) for name in names}
            given = frozenset(
                name for name in names if getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"
            )
            return command(**kwargs, **{parameter: group(values, given, overrides)})

        run.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run  # type: ignore[return-value]

    return decorate


__all__ = ["OPTIONS_PARAMETER", "ConfigOptions", "Option", "config_options", "option_default"]
