"""Fields of the description files users write: the checks every reader of them shares.

An application file of the parts trade-off, a schedule profile, a workload and a SwapNet
profile are YAML or JSON mappings written or edited by hand. Their readers check them the
same way: a mapping of known fields only, integers and finite numbers with a least value,
and, for a YAML file, the line a field is on. Each reader raises its own error class (a
:class:`~layerfit.errors.LayerfitError`), so every check takes it as ``error``; the
message is one line that starts with ``where``, the field's path in the file
(``cnns[0].layers[1].kernel``). :func:`load_yaml` puts the file and the line of that
field before it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

from layerfit.extras import require

T = TypeVar("T")


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


def is_names(value: Any) -> bool:
    """A list of strings (names of layers, partitions, networks)."""
    return isinstance(value, list) and all(isinstance(x, str) for x in value)


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
    path: str | None = None,
) -> dict[str, Any]:
    """``data`` if it is a mapping (``what`` says of what, for the message) and, where
    ``known`` is given, of those fields only; else ``error`` naming ``where``.

    An unknown field is named by its own path, ``path`` (default ``where``; ``""`` at the
    top of a file) and its key, so that the message leads to its line."""
    expect(isinstance(data, Mapping), where, what, data, error)
    unknown = sorted(str(key) for key in data if key not in known) if known is not None else []
    if unknown:
        prefix = where if path is None else path
        more = f" (also unknown: {', '.join(unknown[1:])})" if len(unknown) > 1 else ""
        field = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise error(f"{field}: unknown field{more}; known: {', '.join(sorted(known or ()))}")
    return data


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


def load_yaml(text: str, label: str, error: type[Exception], build: Callable[[Any], T]) -> T:
    """``build`` applied to what the YAML ``text`` (of the file ``label``) holds, read by
    PyYAML's safe loader.

    Text that is not YAML, a mapping that gives a key twice (the loader would silently
    keep the last) and every ``error`` of ``build`` become one line of ``error``: the file,
    the line and the message, ``app.yaml, line 12: cnns[0].layers[1].kernel: expected ...``.
    The line of a message of ``build`` is that of the field the message starts with (the
    deepest part of its path the text has); a message that starts with no field of the
    text, such as a field that is missing, gets none.
    """
    yaml = require("yaml")
    loader = yaml.SafeLoader(text)  # one parse: the node tree (for lines) and the data built from it
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or str(exc).splitlines()[0]
        raise error(_located(label, mark.line + 1 if mark else None, f"not valid YAML: {problem}")) from None
    except yaml.YAMLError as exc:
        raise error(_located(label, None, f"not valid YAML: {str(exc).splitlines()[0]}")) from None
    finally:
        loader.dispose()
    twice = _key_given_twice(yaml, root)
    if twice is not None:
        message = f"{twice.value!r}: appears twice in the same mapping"
        raise error(_located(label, twice.start_mark.line + 1, message))
    try:
        return build(data)
    except error as exc:
        raise error(_located(label, _field_line(yaml, root, str(exc)), str(exc))) from exc


def _located(label: str, line: int | None, message: str) -> str:
    return f"{label}, line {line}: {message}" if line else f"{label}: {message}"


def _key_given_twice(yaml: Any, root: Any) -> Any:
    """The first key node that a mapping under ``root`` (a composed YAML node) gives a
    second time, or None; walked without recursion, each aliased node once."""
    stack, seen = [root], set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys = set()
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    if (key.tag, key.value) in keys:
                        return key
                    keys.add((key.tag, key.value))
                stack += [key, value]
        elif isinstance(node, yaml.SequenceNode):
            stack += node.value
    return None


_FIELD = re.compile(r"^[A-Za-z_][\w-]*(?:\[[^\]]+\]|\.[\w-]+)*(?=:)")
_TOKEN = re.compile(r"\[([^\]]+)\]|\.?([\w-]+)")


def _field_line(yaml: Any, root: Any, message: str) -> int | None:
    """Line (1-based) under the composed YAML node ``root`` of the field ``message``
    starts with, e.g. ``cnns[0].layers[1].kernel:``: that of the deepest part of the path
    found; None when the message starts with no field of the text."""
    match = _FIELD.match(message)
    if match is None:
        return None
    node, line = root, None
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


__all__ = ["expect", "integer", "is_int", "is_names", "is_number", "load_yaml", "mapping", "number"]
