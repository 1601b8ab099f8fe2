"""Fields of the description files users write: the checks every reader of them shares.

An application file of the parts trade-off, a schedule profile, a workload and a SwapNet
profile are YAML or JSON mappings written or edited by hand. Their readers check them the
same way: a mapping of known fields only, integers and finite numbers with a least value,
and, for a YAML file, the line a field is on. Each reader raises its own error class (a
:class:`~layerfit.errors.LayerfitError`), so every check takes it as ``error``; the
message is one line that starts with ``where``, the field's path in the file
(``cnns[0].layers[1].kernel``), or whatever the reader puts before it (a line number).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from typing import Any

from layerfit.extras import require


def is_int(value: Any, least: int | None = None) -> bool:
    """An integer that is not a bool (YAML's ``true`` is no count), at least ``least``."""
    return isinstance(value, int) and not isinstance(value, bool) and (least is None or value >= least)


def is_number(value: Any, least: float | None = None) -> bool:
    """A finite int or float that is not a bool, at least ``least`` (NaN, infinity and
    integers too large for a float are not numbers here)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value) and (least is None or value >= least)
    except OverflowError:
        return False


def expect(ok: object, where: str, expected: str, value: Any, error: type[Exception]) -> None:
    """Raise ``error("{where}: expected {expected}, got {value!r}")`` unless ``ok`` is true."""
    if not ok:
        raise error(f"{where}: expected {expected}, got {value!r:.200}")


def mapping(
    data: Any,
    where: str,
    error: type[Exception],
    known: Collection[str] | None = None,
    what: str = "a mapping",
) -> dict[str, Any]:
    """``data`` if it is a mapping (``what`` says of what, for the message) and, where
    ``known`` is given, of those fields only; else ``error`` naming ``where``."""
    expect(isinstance(data, Mapping), where, what, data, error)
    unknown = unknown_fields(data, known) if known is not None else []
    if unknown:
        raise error(f"{where}: unknown field(s) {unknown} (known: {sorted(known or ())})")
    return data


def unknown_fields(data: Mapping[Any, Any], known: Collection[str]) -> list[str]:
    """The fields of ``data`` not in ``known``, sorted (as text: YAML keys may be numbers)."""
    return sorted(str(key) for key in data if key not in known)


def integer(value: Any, where: str, error: type[Exception], least: int | None = None, what: str = "an integer") -> int:
    """``value`` if it is an integer (not a bool) of at least ``least``; ``what`` names it
    in the message (``"a whole number of bytes"``)."""
    bound = "" if least is None else f" >= {least}"
    expect(is_int(value, least), where, f"{what}{bound}", value, error)
    return value


def number(
    value: Any,
    where: str,
    error: type[Exception],
    least: float | None = None,
    what: str = "a finite number",
    above: bool = False,
) -> float:
    """``value`` as a float if it is a finite number of at least ``least`` (more than
    ``least`` if ``above``); ``what`` names it in the message (``"a finite number of seconds"``)."""
    ok = is_number(value, least) and not (above and value == least)
    bound = "" if least is None else f" {'>' if above else '>='} {least}"
    expect(ok, where, f"{what}{bound}", value, error)
    return float(value)


_FIELD = re.compile(r"^[A-Za-z_][\w-]*(?:\[[^\]]+\]|\.[\w-]+)*")
_TOKEN = re.compile(r"\[([^\]]+)\]|\.?([\w-]+)")


def field_line(text: str, message: str) -> int | None:
    """Line (1-based) in the YAML ``text`` of the field an error message starts with,
    e.g. ``cnns[0].layers[1].kernel``.

    The deepest part of the path found in the text counts; None when the message names
    no field of the file or the text is not YAML.
    """
    match = _FIELD.match(message)
    if match is None:
        return None
    yaml = require("yaml")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    line = None
    for token in _TOKEN.finditer(match.group(0)):
        key = token.group(1) if token.group(1) is not None else token.group(2)
        child = None
        if isinstance(node, yaml.SequenceNode) and key.isdigit() and int(key) < len(node.value):
            child = node.value[int(key)]
        elif isinstance(node, yaml.MappingNode):
            child = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == key), None)
        if child is None:
            break
        node, line = child, child.start_mark.line + 1
    return line


__all__ = ["expect", "field_line", "integer", "is_int", "is_number", "mapping", "number", "unknown_fields"]
