"""Timeline of one inference: per-unit read / copy / kernel intervals and buffer use.

Written as Chrome trace format (opens in Perfetto or chrome://tracing): one track per
stage, a counter track for bytes in the weight buffer.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STAGES = ("read", "copy", "kernel")


@dataclass(frozen=True)
class Event:
    """One stage of one unit: ``[start, end)`` in seconds from the inference start."""

    unit: int
    name: str
    stage: str
    start: float
    end: float
    nbytes: int = 0


@dataclass
class Timeline:
    """Events and buffer occupancy of one inference, with its budget and policy."""

    pipeline: str
    budget_bytes: int
    events: list[Event] = field(default_factory=list)
    occupancy: list[tuple[float, int]] = field(default_factory=list)  # (seconds, bytes)
    latency_s: float = 0.0

    def stage_total(self, stage: str) -> float:
        return sum(e.end - e.start for e in self.events if e.stage == stage)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pipeline": self.pipeline,
            "budget_bytes": self.budget_bytes,
            "latency_s": self.latency_s,
            "events": [asdict(e) for e in self.events],
            "occupancy": [list(p) for p in self.occupancy],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Timeline:
        """The timeline of :meth:`to_dict`; ``ValueError`` naming the first bad field."""
        events = []
        for k, e in enumerate(d["events"]):
            if not isinstance(e, dict):
                raise ValueError(f"event {k} is not an object")
            ev = Event(
                unit=_number(e["unit"], int, f"event {k} unit"),
                name=str(e["name"]),
                stage=str(e["stage"]),
                start=_number(e["start"], float, f"event {k} start"),
                end=_number(e["end"], float, f"event {k} end"),
                nbytes=_number(e.get("nbytes", 0), int, f"event {k} nbytes"),
            )
            if ev.stage not in STAGES:
                raise ValueError(f"event {k} has stage {ev.stage!r}, not one of {', '.join(STAGES)}")
            events.append(ev)
        occupancy = []
        for k, point in enumerate(d["occupancy"]):
            if not isinstance(point, (list, tuple)) or len(point) != 2:
                raise ValueError(f"occupancy point {k} is not a [seconds, bytes] pair")
            occupancy.append((_number(point[0], float, f"occupancy point {k}"), _number(point[1], int, f"occupancy point {k}")))
        return cls(
            pipeline=str(d["pipeline"]),
            budget_bytes=_number(d["budget_bytes"], int, "budget_bytes"),
            latency_s=_number(d.get("latency_s", 0.0), float, "latency_s"),
            events=events,
            occupancy=occupancy,
        )

    def to_chrome(self) -> dict[str, Any]:
        """Chrome trace format; the layerfit timeline rides along under ``layerfit``."""
        tids = {stage: i + 1 for i, stage in enumerate(STAGES)}
        events: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": f"layerfit {self.pipeline}"}}
        ]
        for stage, tid in tids.items():
            events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": stage}})
        for e in self.events:
            events.append(
                {
                    "name": f"{e.unit}:{e.name}",
                    "cat": e.stage,
                    "ph": "X",
                    "pid": 1,
                    "tid": tids.get(e.stage, 9),
                    "ts": e.start * 1e6,
                    "dur": max(e.end - e.start, 0.0) * 1e6,
                    "args": {"unit": e.unit, "bytes": e.nbytes},
                }
            )
        for t, b in self.occupancy:
            events.append({"name": "weight buffer", "ph": "C", "pid": 1, "ts": t * 1e6, "args": {"bytes": b}})
        return {"traceEvents": events, "displayTimeUnit": "ms", "layerfit": self.to_dict()}

    def save(self, path: str | Path) -> None:
        """Write the Chrome trace to ``path`` (through a temporary file and a rename)."""
        from layerfit.store.outputs import write_atomic

        text = json.dumps(self.to_chrome())
        write_atomic(path, lambda tmp: tmp.write_text(text))


def split_read(t0: float, t1: float, sizes: list[int]) -> list[tuple[float, float]]:
    """The ``[start, end)`` of each unit of one read of ``sizes`` bytes from ``t0`` to
    ``t1``: a merged read is shown split by bytes, the last ending at ``t1``."""
    total, at, times = sum(sizes), t0, []
    for n, size in enumerate(sizes):
        end = t1 if n == len(sizes) - 1 else at + (t1 - t0) * size / total
        times.append((at, end))
        at = end
    return times


def _number(value: Any, kind: type, what: str) -> Any:
    """``value`` as an int or float; ``ValueError`` for text, booleans, NaN or infinity."""
    import math

    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} is {value!r}, not a finite number")
    if kind is int and value != int(value):
        raise ValueError(f"{what} is {value!r}, not a whole number")
    return kind(value)


def load_timeline(path: str | Path) -> Timeline:
    """Read a trace written by :meth:`Timeline.save`; an :class:`InputError` naming the
    file and the problem for anything else."""
    from layerfit.errors import InputError

    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{path} is not a layerfit trace (not a UTF-8 text file)") from None
    except OSError as exc:
        raise InputError(f"cannot read trace {path}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("layerfit"), dict):
            raise ValueError("it has no 'layerfit' timeline; write one with `layerfit run --trace`")
        return Timeline.from_dict(data["layerfit"])
    except (ValueError, KeyError, TypeError) as exc:  # json.JSONDecodeError is a ValueError
        what = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise InputError(f"{path} is not a layerfit trace ({what})") from exc
