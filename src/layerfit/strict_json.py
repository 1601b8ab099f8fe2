"""Strict JSON for the ``--json`` outputs of the command line.

Python's ``json`` writes NaN and infinities as bare ``NaN`` / ``Infinity``, which no
strict JSON parser (``jq``, JavaScript, Go) accepts. A figure that is not finite is one
that does not exist here (a mean of no jobs, a ratio to zero), so it becomes ``null``.
"""

from __future__ import annotations

import json
import math
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


def dumps(obj: Any, indent: int | None = 2) -> str:
    """Strict JSON text of ``obj``: non-finite floats as null, other objects as ``str``."""
    return json.dumps(finite(obj), indent=indent, default=str, allow_nan=False)


__all__ = ["dumps", "finite"]
