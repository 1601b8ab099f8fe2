"""What the newest supported Python has and the oldest (3.10, a Jetson's) lacks.

Each name here is the standard library's own where it exists, and a small equivalent
where it does not, so the rest of the package reads as if written for the newest
release. Remove an entry when the oldest supported version gains it.
"""

from __future__ import annotations

import enum
import sys

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:

    class StrEnum(str, enum.Enum):
        """Python 3.11's ``enum.StrEnum``: members are strings, ``str()`` and formatting
        give the value, and ``auto()`` gives the lower-cased member name."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return format(str(self.value), spec)

        @staticmethod
        def _generate_next_value_(name: str, start: int, count: int, last_values: list) -> str:
            return name.lower()


__all__ = ["StrEnum"]
