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
file, the line and the field (``arrivals[3].networks[1]``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from layerfit.errors import ScheduleError, WorkloadError
from layerfit.extras import require
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


# --- reading with line numbers --------------------------------------------------------


class _Map(dict):
    line: int = 0
    key_lines: dict[Any, int]


class _Seq(list):
    line: int = 0
    item_lines: list[int]


class _LineLoader(yaml.SafeLoader):
    """A safe loader whose mappings and sequences remember their source lines."""


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> _Map:
    loader.flatten_mapping(node)
    result = _Map()
    result.line = node.start_mark.line + 1
    result.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if key in result:
            raise WorkloadError(f"line {line}: {key!r}: appears twice in the same mapping")
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = line
    return result


def _construct_sequence(loader: _LineLoader, node: yaml.SequenceNode) -> _Seq:
    result = _Seq(loader.construct_object(child, deep=True) for child in node.value)
    result.line = node.start_mark.line + 1
    result.item_lines = [child.start_mark.line + 1 for child in node.value]
    return result


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def _number(value: Any, where: str, line: int, *, positive: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):
        need = "a number > 0" if positive else "a number >= 0"
        raise WorkloadError(f"line {line}: {where}: expected {need} (seconds), got {value!r}")
    return float(value)


def parse_workload(
    text: str, source: str | Path = "<workload>", profiles: ProfileSet | None = None
) -> Workload:
    """Parse workload YAML; with ``profiles``, every network name is checked against it."""
    label = str(source)
    try:
        data = yaml.load(text, Loader=_LineLoader)  # noqa: S506 - a SafeLoader subclass
    except WorkloadError as exc:
        raise WorkloadError(f"{label}, {exc}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else "?"
        raise WorkloadError(f"{label}, line {line}: not valid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise WorkloadError(f"{label}: not valid YAML: {exc}") from None
    try:
        return _build(data, label, Path(source) if source != "<workload>" else None, profiles)
    except WorkloadError as exc:
        raise WorkloadError(f"{label}, {exc}") from None


def _build(data: Any, label: str, source: Path | None, profiles: ProfileSet | None) -> Workload:
    if not isinstance(data, _Map):
        raise WorkloadError("line 1: the workload must be a mapping with an 'arrivals' list")
    for key, line in data.key_lines.items():
        if key not in TOP_FIELDS:
            raise WorkloadError(
                f"line {line}: {key}: unknown field; known fields: {', '.join(TOP_FIELDS)}"
            )
    name = data.get("name", Path(label).stem)
    if not isinstance(name, str):
        raise WorkloadError(f"line {data.key_lines['name']}: name: expected text, got {name!r}")
    mode = data.get("mode", "open")
    if mode not in MODES:
        raise WorkloadError(
            f"line {data.key_lines['mode']}: mode: expected one of {', '.join(MODES)}, got {mode!r}"
        )
    deadline = data.get("deadline")
    if deadline is not None:
        deadline = _number(deadline, "deadline", data.key_lines["deadline"], positive=True)
    spec = data.get("profiles")
    if spec is not None and not isinstance(spec, str):
        raise WorkloadError(
            f"line {data.key_lines['profiles']}: profiles: expected 'thesis' or a file path"
        )
    if "arrivals" not in data:
        raise WorkloadError(
            f"line {data.line}: arrivals: missing; a workload needs a list of arrivals"
        )
    arrivals_raw = data["arrivals"]
    arrivals_line = data.key_lines["arrivals"]
    if not isinstance(arrivals_raw, _Seq) or not arrivals_raw:
        raise WorkloadError(
            f"line {arrivals_line}: arrivals: expected a non-empty list of arrivals"
        )
    if profiles is None:
        try:
            profiles = Workload((), profiles=spec, source=source).profile_set()
        except ScheduleError as exc:
            raise WorkloadError(
                f"line {data.key_lines.get('profiles', 1)}: profiles: {exc}"
            ) from None
    arrivals = [
        _arrival(item, f"arrivals[{i}]", arrivals_raw.item_lines[i], profiles)
        for i, item in enumerate(arrivals_raw)
    ]
    return Workload(
        tuple(arrivals), name=name, mode=mode, deadline=deadline, profiles=spec, source=source
    )


def _arrival(item: Any, where: str, line: int, profiles: ProfileSet) -> Arrival:
    if not isinstance(item, _Map):
        raise WorkloadError(
            f"line {line}: {where}: expected a mapping with 'at' and 'networks', got {item!r}"
        )
    for key, key_line in item.key_lines.items():
        if key not in ARRIVAL_FIELDS:
            raise WorkloadError(
                f"line {key_line}: {where}.{key}: unknown field; known fields: {', '.join(ARRIVAL_FIELDS)}"
            )
    at = _number(item.get("at", 0.0), f"{where}.at", item.key_lines.get("at", line))
    if "networks" not in item:
        raise WorkloadError(
            f"line {line}: {where}.networks: missing; name the networks that analyse this input"
        )
    networks = item["networks"]
    networks_line = item.key_lines["networks"]
    if isinstance(networks, str):
        networks = _Seq([networks])
        networks.item_lines = [networks_line]
    if not isinstance(networks, _Seq) or not networks:
        raise WorkloadError(
            f"line {networks_line}: {where}.networks: expected a non-empty list of network names"
        )
    for index, name in enumerate(networks):
        name_line = networks.item_lines[index]
        if not isinstance(name, str):
            raise WorkloadError(
                f"line {name_line}: {where}.networks[{index}]: expected a network name, got {name!r}"
            )
        if name not in profiles:
            raise WorkloadError(
                f"line {name_line}: {where}.networks[{index}]: unknown network {name!r}; "
                f"known: {', '.join(profiles.names())}"
            )
    input_ = item.get("input")
    if input_ is not None and not isinstance(input_, str):
        raise WorkloadError(
            f"line {item.key_lines['input']}: {where}.input: expected a path or tag, got {input_!r}"
        )
    deadline = item.get("deadline")
    if deadline is not None:
        deadline = _number(deadline, f"{where}.deadline", item.key_lines["deadline"], positive=True)
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
