"""Workload files: when inputs arrive and which networks analyse each (thesis §7.1).

A workload is YAML::

    name: small-3
    mode: open            # open: each job arrives at its `at`; closed: each job arrives
                          #       when the previous one has finished (the thesis's batch mode)
    deadline: 20          # optional: seconds after arrival, for every job
    profiles: thesis      # optional: "thesis" (built-in) or a profile file, relative to this file
    arrivals:
      - at: 0.0           # seconds from the start of the run
        networks: [agenet, gendernet, tinyyolo]
        input: images/0001.jpg   # optional, handed to the real executor
        deadline: 20             # optional, overrides the workload's

A malformed file raises :class:`~layerfit.errors.WorkloadError` whose message names the
file, the line and the field (``arrivals[3].networks[1]``); the checks are
:mod:`layerfit.fields`'.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from layerfit.errors import ScheduleError, WorkloadError
from layerfit.extras import require
from layerfit.fields import expect, load_yaml, mapping, number
from layerfit.schedule.experiments.profile_sets import resolve_profiles
from layerfit.schedule.files import read_text, write_text
from layerfit.schedule.profile import ProfileSet
from layerfit.schedule.tasks import Job

yaml = require("yaml")

MODES = ("open", "closed")
TOP_FIELDS = ("name", "mode", "deadline", "profiles", "arrivals")
ARRIVAL_FIELDS = ("at", "networks", "input", "deadline")


@dataclass(frozen=True)
class Arrival:
    """One input arriving ``at`` seconds after the start, for ``networks``."""

    at: float
    networks: tuple[str, ...]
    input: str | None = None
    deadline: float | None = None


@dataclass(frozen=True)
class Workload:
    """A named list of arrivals and how they are released (open or closed)."""

    arrivals: tuple[Arrival, ...]
    name: str = "workload"
    mode: str = "open"
    deadline: float | None = None
    profiles: str | None = None  # "thesis" or a path
    source: Path | None = field(default=None, compare=False)

    def profile_set(self) -> ProfileSet:
        """The profiles this workload names (relative paths are relative to its file)."""
        spec = self.profiles
        if (
            spec not in (None, "thesis")
            and self.source is not None
            and not Path(spec).is_absolute()
        ):
            spec = str(self.source.parent / spec)
        return resolve_profiles(spec)

    def jobs(self, profiles: ProfileSet | None = None) -> list[Job]:
        """The arrivals as :class:`Job` objects (ids ``j0``, ``j1``, … in arrival order)."""
        profiles = profiles if profiles is not None else self.profile_set()
        ordered = sorted(enumerate(self.arrivals), key=lambda pair: (pair[1].at, pair[0]))
        jobs = []
        for seq, (_, arrival) in enumerate(ordered):
            deadline = arrival.deadline if arrival.deadline is not None else self.deadline
            jobs.append(
                Job(
                    id=f"j{seq}",
                    networks=tuple(profiles[name] for name in arrival.networks),
                    arrival=arrival.at if self.mode == "open" else 0.0,
                    deadline=deadline,
                    input=arrival.input,
                    seq=seq,
                )
            )
        return jobs

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "mode": self.mode}
        if self.deadline is not None:
            data["deadline"] = self.deadline
        if self.profiles is not None:
            data["profiles"] = self.profiles
        arrivals = []
        for arrival in self.arrivals:
            item: dict[str, Any] = {"at": round(arrival.at, 6), "networks": list(arrival.networks)}
            if arrival.input is not None:
                item["input"] = arrival.input
            if arrival.deadline is not None:
                item["deadline"] = arrival.deadline
            arrivals.append(item)
        data["arrivals"] = arrivals
        return data

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None)

    def save(self, path: str | Path) -> Path:
        """Write the YAML via a temp file and rename (never half-written)."""
        return write_text(path, self.to_yaml())


def parse_workload(
    text: str, source: str | Path = "<workload>", profiles: ProfileSet | None = None
) -> Workload:
    """Parse workload YAML; with ``profiles``, every network name is checked against it.
    Errors name the file, the line of the field and the field."""
    label = str(source)
    path = Path(source) if source != "<workload>" else None
    return load_yaml(text, label, WorkloadError, lambda data: _build(data, label, path, profiles))


def _seconds(value: Any, where: str, *, positive: bool = False) -> float:
    return number(value, where, WorkloadError, 0, "a number of seconds", above=positive)


def _build(data: Any, label: str, source: Path | None, profiles: ProfileSet | None) -> Workload:
    data = mapping(data, "the workload", WorkloadError, TOP_FIELDS, "a mapping with an 'arrivals' list", path="")
    name = data.get("name", Path(label).stem)
    expect(isinstance(name, str), "name", "text", name, WorkloadError)
    mode = data.get("mode", "open")
    expect(mode in MODES, "mode", f"one of {', '.join(MODES)}", mode, WorkloadError)
    deadline = data.get("deadline")
    if deadline is not None:
        deadline = _seconds(deadline, "deadline", positive=True)
    spec = data.get("profiles")
    expect(spec is None or isinstance(spec, str), "profiles", "'thesis' or a file path", spec, WorkloadError)
    if "arrivals" not in data:
        raise WorkloadError("arrivals: missing; a workload needs a list of arrivals")
    arrivals_raw = data["arrivals"]
    ok = isinstance(arrivals_raw, list) and arrivals_raw
    expect(ok, "arrivals", "a non-empty list of arrivals", arrivals_raw, WorkloadError)
    if profiles is None:
        try:
            profiles = Workload((), profiles=spec, source=source).profile_set()
        except ScheduleError as exc:
            raise WorkloadError(f"profiles: {exc}") from None
    arrivals = [_arrival(item, f"arrivals[{i}]", profiles) for i, item in enumerate(arrivals_raw)]
    return Workload(
        tuple(arrivals), name=name, mode=mode, deadline=deadline, profiles=spec, source=source
    )


def _arrival(item: Any, where: str, profiles: ProfileSet) -> Arrival:
    item = mapping(item, where, WorkloadError, ARRIVAL_FIELDS, "a mapping with 'at' and 'networks'")
    at = _seconds(item.get("at", 0.0), f"{where}.at")
    if "networks" not in item:
        raise WorkloadError(f"{where}.networks: missing; name the networks that analyse this input")
    networks = item["networks"]
    networks = [networks] if isinstance(networks, str) else networks
    ok = isinstance(networks, list) and networks
    expect(ok, f"{where}.networks", "a non-empty list of network names", networks, WorkloadError)
    for index, name in enumerate(networks):
        expect(isinstance(name, str), f"{where}.networks[{index}]", "a network name", name, WorkloadError)
        if name not in profiles:
            raise WorkloadError(
                f"{where}.networks[{index}]: unknown network {name!r}; known: {', '.join(profiles.names())}"
            )
    input_ = item.get("input")
    expect(input_ is None or isinstance(input_, str), f"{where}.input", "a path or tag", input_, WorkloadError)
    deadline = item.get("deadline")
    if deadline is not None:
        deadline = _seconds(deadline, f"{where}.deadline", positive=True)
    return Arrival(at=at, networks=tuple(networks), input=input_, deadline=deadline)


def load_workload(path: str | Path, profiles: ProfileSet | None = None) -> Workload:
    """Read and validate a workload file."""
    path = Path(path)
    return parse_workload(read_text(path, "workload", WorkloadError), path, profiles)


def workload_from_jobs(
    arrivals: Sequence[tuple[float, Sequence[str]]],
    *,
    name: str = "workload",
    mode: str = "open",
    deadline: float | None = None,
    profiles: str | None = None,
) -> Workload:
    """Build a workload in code: ``[(at, [network, ...]), ...]``."""
    return Workload(
        tuple(Arrival(float(at), tuple(nets)) for at, nets in arrivals),
        name=name,
        mode=mode,
        deadline=deadline,
        profiles=profiles,
    )
