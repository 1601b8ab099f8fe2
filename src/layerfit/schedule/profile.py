"""Network profiles: per-layer load time, execute time and memory, in execution order.

A :class:`NetworkProfile` is everything the scheduler knows about a network; it is what
the thesis's *network description* holds (§5.4.2) and what the profiler measures
(§5.3). Profiles are plain data: they serialise to JSON or YAML and back, so a profile
measured on a device can be stored next to the prepared model and reused.

Memory of a layer, in bytes:

- ``memory`` — resident from the start of its load until its unload (the weights);
- ``load_memory`` — peak while loading (file buffer plus tensor); at least ``memory``;
- ``exec_memory`` — extra while executing (activations, workspace), freed at its end.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layerfit.errors import ScheduleError
from layerfit.extras import require
from layerfit.fields import integer, mapping, number
from layerfit.schedule.files import read_text, write_text

if TYPE_CHECKING:
    from layerfit.capture.graph import ModelGraph


def _yaml() -> tuple[Any, Any, Any]:
    """PyYAML with its safe loader and dumper, libyaml's where it has them (a profile set
    is thousands of lines); imported only for a YAML file, JSON needs none."""
    yaml = require("yaml")
    return yaml, getattr(yaml, "CSafeLoader", yaml.SafeLoader), getattr(yaml, "CSafeDumper", yaml.SafeDumper)

FORMAT = "layerfit-profiles"
VERSION = 1
LAYER_KINDS = ("conv", "fc", "other")
# The one layer of a model with no unit: its whole forward pass, nothing to load.
WHOLE_MODEL = "forward"


@dataclass(frozen=True)
class LayerProfile:
    """One layer: how long it takes to load and execute and what memory it needs."""

    name: str
    kind: str = "other"  # conv | fc | other (DeepEye splits conv part and FC part)
    load_time: float = 0.0  # seconds
    exec_time: float = 0.0  # seconds
    memory: int = 0  # bytes resident from load to unload
    load_memory: int | None = None  # peak bytes while loading; None means ``memory``
    exec_memory: int = 0  # extra bytes while executing

    @property
    def load_peak(self) -> int:
        """Bytes the load task reserves while it runs."""
        return self.memory if self.load_memory is None else max(self.load_memory, self.memory)

    @property
    def footprint(self) -> int:
        """The most memory this layer needs at once, run alone: its load peak, or its
        weights beside its execute scratch."""
        return max(self.load_peak, self.memory + self.exec_memory)


def _block(group: Sequence[LayerProfile]) -> LayerProfile:
    """Consecutive layers run as one unit: one read of all their bytes into one buffer
    (plus the largest load transient), then their executions in turn (the largest
    scratch), so times and weights add up."""
    memory = sum(layer.memory for layer in group)
    transient = max(layer.load_peak - layer.memory for layer in group)
    kinds = {layer.kind for layer in group}
    return LayerProfile(
        name=group[0].name if len(group) == 1 else f"{group[0].name} .. {group[-1].name}",
        kind=kinds.pop() if len(kinds) == 1 else "conv" if "conv" in kinds else "other",
        load_time=sum(layer.load_time for layer in group),
        exec_time=sum(layer.exec_time for layer in group),
        memory=memory,
        load_memory=memory + transient if any(layer.load_memory is not None for layer in group) else None,
        exec_memory=max(layer.exec_memory for layer in group),
    )


@dataclass(frozen=True)
class NetworkProfile:
    """A network as the scheduler sees it: layers in execution order plus its init task.

    ``source`` says where the figures come from (``profiled``, ``thesis-derived``, a
    user's file) so derived figures are never mistaken for measurements.
    ``architecture`` names the zoo architecture the profile describes, when known.
    """

    name: str
    layers: tuple[LayerProfile, ...]
    init_time: float = 0.0
    init_memory: int = 0
    unload_time: float = 0.0
    architecture: str | None = None
    source: str = "user"
    notes: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        _validate(self)

    # --- derived quantities ---------------------------------------------------------

    @property
    def total_time(self) -> float:
        """Serial duration: init + every load + every execute + every unload."""
        return self.init_time + sum(
            layer.load_time + layer.exec_time + self.unload_time for layer in self.layers
        )

    @property
    def weight_bytes(self) -> int:
        return sum(layer.memory for layer in self.layers)

    @property
    def largest_task_memory(self) -> int:
        """The most memory one task of this network reserves (the rejection threshold)."""
        peaks = [layer.load_peak for layer in self.layers] + [
            layer.exec_memory for layer in self.layers
        ]
        return max([self.init_memory, *peaks])

    @property
    def min_budget(self) -> int:
        """Memory to run this network alone without exceeding: linear order, one layer at a time."""
        return self.init_memory + max(layer.footprint for layer in self.layers)

    @property
    def bulk_peak(self) -> int:
        """Peak memory when loaded whole and then executed, one task at a time."""
        peak = 0
        held = self.init_memory
        for layer in self.layers:
            peak = max(peak, held + layer.load_peak)
            held += layer.memory
        for layer in self.layers:
            peak = max(peak, held + layer.exec_memory)
        return max(peak, held)

    @property
    def fc_start(self) -> int:
        """Index of the first fully connected layer (DeepEye's split); ``len(layers)`` if none."""
        for index, layer in enumerate(self.layers):
            if layer.kind == "fc":
                return index
        return len(self.layers)

    def scaled(self, memory_factor: float = 1.0, time_factor: float = 1.0) -> NetworkProfile:
        """A copy with every memory figure times ``memory_factor`` and every time times ``time_factor``."""

        def m(value: int | None) -> int | None:
            return None if value is None else int(round(value * memory_factor))

        layers = tuple(
            LayerProfile(
                name=layer.name,
                kind=layer.kind,
                load_time=layer.load_time * time_factor,
                exec_time=layer.exec_time * time_factor,
                memory=m(layer.memory) or 0,
                load_memory=m(layer.load_memory),
                exec_memory=m(layer.exec_memory) or 0,
            )
            for layer in self.layers
        )
        return NetworkProfile(
            name=self.name,
            layers=layers,
            init_time=self.init_time * time_factor,
            init_memory=m(self.init_memory) or 0,
            unload_time=self.unload_time * time_factor,
            architecture=self.architecture,
            source=self.source,
            notes=dict(self.notes),
        )

    def blocks_within_min_budget(self) -> list[int]:
        """The fewest groups of consecutive layers (their sizes, in order) that leave
        :attr:`min_budget` unchanged: each group's footprint, as :meth:`grouped` counts it,
        stays within the largest single layer's. Layers are packed greedily, the fewest
        for a footprint that only grows as a group does."""
        cap = max(layer.footprint for layer in self.layers)
        sizes: list[int] = []
        group: list[LayerProfile] = []
        for layer in self.layers:
            if group and _block([*group, layer]).footprint > cap:
                sizes.append(len(group))
                group = []
            group.append(layer)
        sizes.append(len(group))
        return sizes

    def grouped(self, sizes: Sequence[int]) -> NetworkProfile:
        """The same network executed in blocks of ``sizes[i]`` consecutive layers each (an
        engine's ``blocks:N`` or ``merge:...`` units), each block as :func:`_block` counts it."""
        if sum(sizes) != len(self.layers) or any(n < 1 for n in sizes):
            raise ScheduleError(
                f"cannot group the {len(self.layers)} layers of {self.name!r} into blocks of {list(sizes)}"
            )
        if all(n == 1 for n in sizes):
            return self
        starts = [0, *itertools.accumulate(sizes)]
        blocks = tuple(_block(self.layers[a:b]) for a, b in itertools.pairwise(starts))
        return replace(self, layers=blocks, notes={**self.notes, "layers_per_block": list(sizes)})

    # --- serialisation --------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["layers"] = [asdict(layer) for layer in self.layers]
        data["notes"] = dict(self.notes)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "profile") -> NetworkProfile:
        """Build a profile from plain data; errors name ``where`` (the file) and the field."""
        known = {f.name for f in fields(cls)}
        data = mapping(data, where, ScheduleError, known, "a mapping with 'name' and 'layers'")
        if "name" not in data or "layers" not in data:
            raise ScheduleError(f"{where}: a profile needs 'name' and 'layers'")
        raw_layers = data["layers"]
        if not isinstance(raw_layers, list):
            raise ScheduleError(f"{where}.layers: expected a list of layers")
        layer_fields = {f.name for f in fields(LayerProfile)}
        layers = []
        for index, raw in enumerate(raw_layers):
            at = f"{where}.layers[{index}]"
            mapping(raw, at, ScheduleError, layer_fields)
            try:
                layers.append(LayerProfile(**raw))
            except TypeError as exc:
                raise ScheduleError(f"{at}: {exc}") from None
        kwargs = {k: v for k, v in data.items() if k != "layers"}
        try:
            return cls(layers=tuple(layers), **kwargs)
        except (TypeError, ScheduleError) as exc:  # a wrong field type or a bad value
            raise ScheduleError(f"{where}: {exc}") from None


def _validate(profile: NetworkProfile) -> None:
    where = f"profile {profile.name!r}"
    if not isinstance(profile.name, str) or not profile.name:
        raise ScheduleError("a profile needs a non-empty string 'name'")
    if not profile.layers:
        raise ScheduleError(f"{where}: needs at least one layer")
    for key in ("init_time", "unload_time"):
        number(getattr(profile, key), f"{where}.{key}", ScheduleError, 0, "a finite number of seconds")
    integer(profile.init_memory, f"{where}.init_memory", ScheduleError, 0, "a whole number of bytes")
    for index, layer in enumerate(profile.layers):
        at = f"{where}.layers[{index}]"
        if not isinstance(layer.name, str) or not layer.name:
            raise ScheduleError(f"{at}.name: expected a non-empty string")
        if layer.kind not in LAYER_KINDS:
            raise ScheduleError(f"{at}.kind: {layer.kind!r} is not one of {LAYER_KINDS}")
        for key in ("load_time", "exec_time"):
            number(getattr(layer, key), f"{at}.{key}", ScheduleError, 0, "a finite number of seconds")
        integer(layer.memory, f"{at}.memory", ScheduleError, 0, "a whole number of bytes")
        integer(layer.exec_memory, f"{at}.exec_memory", ScheduleError, 0, "a whole number of bytes")
        if layer.load_memory is not None:
            integer(layer.load_memory, f"{at}.load_memory", ScheduleError, 0, "a whole number of bytes")


class ProfileSet(Mapping[str, NetworkProfile]):
    """Profiles by network name (case-insensitive look-up), e.g. the thesis's nine networks."""

    def __init__(self, profiles: Iterable[NetworkProfile], label: str = "profiles") -> None:
        self._by_name: dict[str, NetworkProfile] = {}
        for profile in profiles:
            key = profile.name.lower()
            if key in self._by_name:
                raise ScheduleError(f"{label}: network {profile.name!r} appears twice")
            self._by_name[key] = profile
        self.label = label

    def __getitem__(self, name: str) -> NetworkProfile:
        try:
            return self._by_name[name.lower()]
        except KeyError:
            raise ScheduleError(
                f"unknown network {name!r} in {self.label}; known: {', '.join(self.names())}"
            ) from None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._by_name

    def __iter__(self) -> Iterator[str]:
        return iter(p.name for p in self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def names(self) -> list[str]:
        return [p.name for p in self._by_name.values()]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "networks": [p.to_dict() for p in self._by_name.values()],
        }

    def save(self, path: str | Path) -> None:
        """Write as JSON (``.json``) or YAML (anything else), via a temp file and rename."""
        path = Path(path)
        data = self.to_dict()
        if path.suffix == ".json":
            text = json.dumps(data, indent=2)
        else:
            yaml, _, dumper = _yaml()
            text = yaml.dump(data, Dumper=dumper, sort_keys=False)
        write_text(path, text)


def profiles_from_data(data: Any, label: str) -> ProfileSet:
    """A :class:`ProfileSet` from parsed JSON/YAML: a set file or one profile."""
    if isinstance(data, Mapping) and "networks" in data:
        if data.get("format", FORMAT) != FORMAT or data.get("version", VERSION) != VERSION:
            raise ScheduleError(
                f"{label}: is {data.get('format')!r} version {data.get('version')!r}; "
                f"this layerfit reads {FORMAT!r} version {VERSION}"
            )
        networks = data["networks"]
        if not isinstance(networks, list):
            raise ScheduleError(f"{label}: 'networks' must be a list of profiles")
        return ProfileSet(
            (
                NetworkProfile.from_dict(item, f"{label}: networks[{i}]")
                for i, item in enumerate(networks)
            ),
            label=label,
        )
    return ProfileSet([NetworkProfile.from_dict(data, label)], label=label)


def load_profiles(path: str | Path) -> ProfileSet:
    """Read a profile file (JSON or YAML; a set of networks or a single network)."""
    path = Path(path)
    text = read_text(path, "profile file")
    if path.suffix == ".json":
        parse, errors = json.loads, (json.JSONDecodeError,)
    else:
        yaml, loader, _ = _yaml()
        parse, errors = (lambda t: yaml.load(t, Loader=loader)), (yaml.YAMLError,)  # noqa: S506 - safe loader
    try:
        data = parse(text)
    except errors as exc:
        raise ScheduleError(
            f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}"
        ) from None
    return profiles_from_data(data, str(path))


def profile_from_graph(
    graph: ModelGraph,
    name: str,
    *,
    disk_bytes_per_s: float = 40 * 1024 * 1024,
    macs_per_s: float = 1.0e9,
    architecture: str | None = None,
) -> NetworkProfile:
    """An *estimated* profile from a captured graph (``source = "capture-estimate"``).

    One layer per captured unit: weights are its parameter bytes, the load time reads them
    at ``disk_bytes_per_s``, the execute time runs its MACs at ``macs_per_s``, the execute
    memory is its output activations. Good enough to draw task graphs and try schedules
    before a prepared model has been profiled on the device. A model with no unit (no
    parameters, or every weight resident) gets one layer, :data:`WHOLE_MODEL`, with nothing
    to load: the whole forward pass is its execution.
    """
    layers = []
    for unit in graph.units:
        module = unit.module_type.lower()
        kind = "conv" if "conv" in module else "fc" if "linear" in module else "other"
        out_bytes = sum(math.prod(shape) for shape in unit.output_shapes) * 4
        layers.append(
            LayerProfile(
                name=unit.name or "root",
                kind=kind,
                load_time=unit.s / disk_bytes_per_s,
                exec_time=unit.f * max(unit.calls, 1) / macs_per_s,
                memory=unit.s,
                exec_memory=int(out_bytes),
            )
        )
    if not layers:
        out_bytes = sum(math.prod(shape) for shape in graph.output_shapes) * 4
        layers.append(
            LayerProfile(
                name=WHOLE_MODEL,
                kind="other",
                load_time=0.0,
                exec_time=0.0,  # the capture counts MACs in units only: profile the model
                memory=0,
                exec_memory=int(out_bytes),
            )
        )
    return NetworkProfile(
        name=name,
        layers=tuple(layers),
        architecture=architecture or graph.model_type,
        source="capture-estimate",
        notes={
            "disk_bytes_per_s": disk_bytes_per_s,
            "macs_per_s": macs_per_s,
            "input_shape": list(graph.input_shape),
        },
    )
