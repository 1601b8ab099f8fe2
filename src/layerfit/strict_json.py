"""Strict JSON: the ``--json`` outputs of the command line, and JSON files read from users.

Python's ``json`` writes NaN and infinities as bare ``NaN`` / ``Infinity``, which no
strict JSON parser (``jq``, JavaScript, Go) accepts. A figure that is not finite is one
that does not exist here (a mean of no jobs, a ratio to zero), so it becomes ``null``.

:func:`parse` reads a JSON file someone else wrote (a Hugging Face folder's
``config.json``, its index, its generation settings): every way such text can break the
parser — not UTF-8, not JSON, an integer of thousands of digits, nesting deep enough to
exhaust the interpreter's recursion, more bytes than any such file has — is one
:class:`JSONTextError` line, never a traceback.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any


def finite(obj: Any) -> Any:
    """``obj`` with every float that is not finite replaced by None (dicts, lists, tuples)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {key: finite(value) for key, value in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite(value) for value in obj]
    return obj


MAX_DEPTH = 200
"""The deepest nesting :func:`parse` accepts: configs nest a few levels, tokenizers a
dozen; 100 000 nested ``{`` is an attack on the parser, refused before it runs."""


class JSONTextError(ValueError):
    """Text that is not a JSON document :func:`parse` accepts; the message is one line."""


def parse(raw: bytes | str, what: str, max_bytes: int = 64 * 2**20) -> Any:
    """The JSON document ``raw`` (read from the file ``what`` names); a one-line
    :class:`JSONTextError` for anything else: more than ``max_bytes``, not UTF-8, not
    JSON, nested deeper than :data:`MAX_DEPTH`, an integer past Python's digit limit."""
    if len(raw) > max_bytes:
        raise JSONTextError(f"{what} is {len(raw):,} bytes, more than the {max_bytes:,} such a file may have")
    try:
        text = raw.decode() if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise JSONTextError(f"{what} is not UTF-8 text") from None
    depth = nesting_depth(text)
    if depth > MAX_DEPTH:
        raise JSONTextError(f"{what} is not valid JSON: it nests {depth:,} levels deep (at most {MAX_DEPTH})")
    try:
        return json.loads(text)
    except RecursionError:  # a guard behind the depth check
        raise JSONTextError(f"{what} is not valid JSON: it is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, or an integer of 5,000 digits
        raise JSONTextError(f"{what} is not valid JSON: {str(exc).splitlines()[0][:200]}") from None


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")


def nesting_depth(text: str) -> int:
    """The deepest nesting of ``[`` and ``{`` in JSON ``text``, strings left out, counted
    without recursion (an upper bound where the text is not JSON: the parser says why)."""
    depth = deepest = 0
    for match in _BRACKETS.finditer(_STRING.sub("", text)):
        if match.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest



def dumps(obj: Any, indent: int | None = 2) -> str:
    """Strict JSON text of ``obj``: non-finite floats as null, other objects as ``str``."""
    return json.dumps(finite(obj), indent=indent, default=str, allow_nan=False)


__all__ = ["MAX_DEPTH", "JSONTextError", "dumps", "finite", "nesting_depth", "parse"]
