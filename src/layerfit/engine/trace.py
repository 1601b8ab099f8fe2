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
        return cls(
            pipeline=d["pipeline"],
            budget_bytes=int(d["budget_bytes"]),
            latency_s=float(d.get("latency_s", 0.0)),
            events=[Event(**e) for e in d["events"]],
            occupancy=[(float(t), int(b)) for t, b in d["occupancy"]],
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
        Path(path).write_text(json.dumps(self.to_chrome()))


def load_timeline(path: str | Path) -> Timeline:
    """Read a trace written by :meth:`Timeline.save`."""
    from layerfit.errors import InputError

    try:
        data = json.loads(Path(path).read_text())
        return Timeline.from_dict(data["layerfit"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise InputError(f"{path} is not a layerfit trace ({exc})") from exc
