"""How concurrent tasks slow each other down: loads share the storage, executions the CPU.

A profile gives each task's duration *alone*. When two workers load at once from one
disk, execute at once on cores that PyTorch's intra-op threads already fill, or one
loads while the other executes (a load faults in its buffer and copies on the same
cores), each goes slower. The thesis's simulator (and ours until this model) ignores
that, which makes policies that run tasks in parallel look faster than they run.

:class:`ContentionModel` holds four measured slowdowns, "a task of class *A* takes
*s* times longer while one task of class *B* runs beside it", for *A*, *B* ∈ {load,
execute}. With ``n_load`` other loads and ``n_exec`` other executions in flight, a
task progresses at

    rate = 1 / (1 + (s_A,load − 1) · n_load + (s_A,exec − 1) · n_exec)

of its alone speed; the simulator re-evaluates the rates whenever a task starts or
ends. With one other task this is exactly the measured slowdown; ``s = 2`` for loads
on loads is a disk that serves one reader at a time (processor sharing). Init and
unload tasks are short: they neither slow nor are slowed. All slowdowns 1 (the
default) is the thesis's model: every task at its profiled speed.

:func:`~layerfit.schedule.runtime.profiler.measure_contention` measures the four numbers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from layerfit.errors import ScheduleError
from layerfit.schedule.files import read_text, write_text
from layerfit.schedule.tasks import TaskKind

FORMAT = "layerfit-contention"
SHARED_KINDS = (TaskKind.LOAD, TaskKind.EXEC)
_FIELDS = ("load_by_load", "load_by_exec", "exec_by_load", "exec_by_exec")


@dataclass(frozen=True)
class ContentionModel:
    """Slowdown of a task of one class while one task of another runs beside it (≥ 1)."""

    load_by_load: float = 1.0  # a load while another load runs (the storage is shared)
    load_by_exec: float = 1.0  # a load while an execution runs
    exec_by_load: float = 1.0  # an execution while a load runs
    exec_by_exec: float = 1.0  # an execution while another execution runs (the cores)
    source: str = "user"
    notes: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name in _FIELDS:
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 1.0
            ):
                raise ScheduleError(
                    f"{name} must be a finite slowdown ≥ 1 (1 = no interference), got {value!r}"
                )

    @property
    def free(self) -> bool:
        """True when nothing interferes: every task runs at its profiled speed."""
        return all(getattr(self, name) == 1.0 for name in _FIELDS)

    def rate(self, kind: TaskKind, other_loads: int, other_execs: int) -> float:
        """Speed of a ``kind`` task, relative to alone, beside the given other tasks."""
        if kind is TaskKind.LOAD:
            by_load, by_exec = self.load_by_load, self.load_by_exec
        elif kind is TaskKind.EXEC:
            by_load, by_exec = self.exec_by_load, self.exec_by_exec
        else:
            return 1.0
        return 1.0 / (1.0 + (by_load - 1.0) * other_loads + (by_exec - 1.0) * other_execs)

    def rate_in(self, kind: TaskKind, loads: int, execs: int) -> float:
        """:meth:`rate` of a ``kind`` task among ``loads`` loads and ``execs`` executions
        in flight, itself included."""
        return self.rate(kind, loads - (kind is TaskKind.LOAD), execs - (kind is TaskKind.EXEC))

    def describe(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            **{name: getattr(self, name) for name in _FIELDS},
            "source": self.source,
            "notes": dict(self.notes),
        }

    def save(self, path: str | Path) -> None:
        """Write the model as JSON via a temp file and rename (never half-written)."""
        write_text(path, json.dumps(self.describe(), indent=2) + "\n")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "contention") -> ContentionModel:
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise ScheduleError(f"{where}: not a {FORMAT} file (no 'format: {FORMAT}')")
        values = {}
        for name in _FIELDS:
            value = data.get(name, 1.0)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ScheduleError(f"{where}: {name} must be a number, got {value!r}")
            values[name] = float(value)
        notes = data.get("notes") or {}
        if not isinstance(notes, Mapping):
            raise ScheduleError(f"{where}: notes must be a mapping, got {type(notes).__name__}")
        try:
            return cls(**values, source=str(data.get("source", "user")), notes=dict(notes))
        except ScheduleError as exc:
            raise ScheduleError(f"{where}: {exc}") from None


def load_contention(path: str | Path) -> ContentionModel:
    """Read a contention file written by :meth:`ContentionModel.save`."""
    path = Path(path)
    try:
        data = json.loads(read_text(path, "contention file"))
    except json.JSONDecodeError as exc:
        raise ScheduleError(f"{path}: not valid JSON ({exc})") from None
    return ContentionModel.from_dict(data, str(path))


NO_CONTENTION = ContentionModel(source="none")

__all__ = ["NO_CONTENTION", "SHARED_KINDS", "ContentionModel", "load_contention"]
