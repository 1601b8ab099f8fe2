"""Application files: a CNN-based application and its constraints in YAML.

Example::

    name: adaptive-classification
    precision: fp32            # fp32 | fp16 (par_bytes = data_bytes)
    fanout: tensor             # tensor (one edge per produced tensor) | edge (per consumer, as the paper)
    cnns:
      - name: mobilenet
        model: mobilenet_v2    # a zoo model, traced at `input` (default: the zoo's input shape)
        input: [1, 3, 224, 224]
        partitions: 2          # pipeline stages of about equal MACs, or [[first, last], ...] inclusive
      - name: tiny
        layers:                # or hand-written layers; each reads the previous one unless `inputs`
          - {name: data, op: input, shape: [1, 3, 32, 32]}
          - {name: conv1, op: conv, shape: [1, 8, 32, 32], kernel: 5, padding: 2, params: [[8, 3, 5, 5], [8]]}
          - {name: fc, op: fc, shape: [1, 10], params: 81930}
    parallel: [[mobilenet.p0, mobilenet.p1]]   # optional; default: the stages of each split CNN
    schedules: {tiny.p0: [[data], [conv1], [fc]]}   # optional; default: one layer per step
    constraints: {memory: 15MB, throughput: {mobilenet: 40}}   # optional; the CLI can override

Every malformed field raises :class:`~layerfit.errors.TradeoffError` naming the field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from layerfit.errors import BudgetError, LayerfitError, TradeoffError
from layerfit.extras import require
from layerfit.sizes import parse_bytes
from layerfit.tradeoff.parts.application import Application, Partition, split_partitions
from layerfit.tradeoff.parts.cnn import CNN, LAYER_OPS, Layer
from layerfit.tradeoff.parts.kernels import cnn_from_module

# PyYAML comes with the tradeoff extra too: application files are YAML
yaml = require("yaml", extra="tradeoff")


@dataclass(frozen=True)
class Constraints:
    """``M^c`` in bytes (None: no memory constraint) and ``T^c_n`` in frames per second."""

    memory: int | None = None
    throughput: dict[str, float] = field(default_factory=dict)


def load_application(path: str | Path) -> tuple[Application, Constraints]:
    """Read an application file; raise TradeoffError naming any malformed field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TradeoffError(f"cannot read application file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise TradeoffError(
            f"{path}: not a text file (byte {exc.start} is not UTF-8): give a YAML application file"
        ) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TradeoffError(f"{path}: not valid YAML: {exc}") from exc
    try:
        return application_from_dict(data)
    except TradeoffError as exc:
        line = field_line(text, str(exc))
        raise TradeoffError(f"{path}: {exc}" + (f" (line {line})" if line else "")) from exc


_FIELD = re.compile(r"^[A-Za-z_][\w-]*(?:\[[^\]]+\]|\.[\w-]+)*")
_TOKEN = re.compile(r"\[([^\]]+)\]|\.?([\w-]+)")


def field_line(text: str, message: str) -> int | None:
    """Line (1-based) of the field an error message starts with, e.g. ``cnns[0].layers[1].kernel``.

    The deepest part of the path found in the YAML text counts; None when the message
    names no field of the file.
    """
    match = _FIELD.match(message)
    if match is None:
        return None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    line = None
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


def _mapping(data: Any, known: set[str], where: str, what: str) -> dict[str, Any]:
    """``data`` if it is a mapping of ``known`` fields only, else TradeoffError."""
    if not isinstance(data, dict):
        raise TradeoffError(f"{where}: expected {what}, got {data!r}")
    unknown = set(data) - known
    if unknown:
        raise TradeoffError(f"{where}: unknown field(s) {sorted(unknown)} (known: {sorted(known)})")
    return data


def _names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(x, str) for x in value)


def application_from_dict(data: Any) -> tuple[Application, Constraints]:
    """Build the application and constraints from parsed YAML."""
    known = {"name", "precision", "fanout", "cnns", "parallel", "schedules", "constraints"}
    data = _mapping(data, known, "the application file", "a mapping with a `cnns` list")
    name = data.get("name", "application")
    if not isinstance(name, str):
        raise TradeoffError(f"name: expected a string, got {name!r}")
    items = data.get("cnns")
    if not isinstance(items, list) or not items:
        raise TradeoffError("cnns: expected a non-empty list of CNNs")
    cnns = [_cnn_from_item(item, f"cnns[{k}]") for k, item in enumerate(items)]
    parallel = data.get("parallel")
    if parallel is not None and not (isinstance(parallel, list) and all(_names(j) for j in parallel)):
        raise TradeoffError(f"parallel: expected a list of lists of partition names, got {parallel!r}")
    schedules = data.get("schedules")
    if schedules is not None and not isinstance(schedules, dict):
        raise TradeoffError(f"schedules: expected a mapping partition -> list of steps, got {schedules!r}")
    for key, steps in (schedules or {}).items():
        if not isinstance(steps, list) or not all(isinstance(step, str) or _names(step) for step in steps):
            raise TradeoffError(f"schedules[{key}]: expected a list of steps (layer names or lists of them)")
    partitions = [p for _, parts in cnns for p in parts]
    precision, fanout = data.get("precision", "fp32"), data.get("fanout", "tensor")
    app = Application([c for c, _ in cnns], partitions, parallel, schedules, precision, fanout, name)
    return app, _constraints(data.get("constraints"), {c.name for c in app.cnns})


def _cnn_from_item(item: Any, where: str) -> tuple[CNN, list[Partition]]:
    known = {"name", "model", "input", "layers", "partitions", "seed"}
    item = _mapping(item, known, where, "a mapping with name and model or layers")
    name = item.get("name")
    if not isinstance(name, str) or not name or "." in name or ":" in name:
        raise TradeoffError(f"{where}.name: expected a non-empty string without '.' or ':', got {name!r}")
    if ("model" in item) == ("layers" in item):
        raise TradeoffError(f"{where}: give exactly one of `model` (a zoo name) or `layers`")
    if "model" in item:
        cnn = _zoo_cnn(name, item, where)
    else:
        layers = layers_from_dicts(item["layers"], f"{where}.layers")
        try:
            cnn = CNN(name, layers)
        except TradeoffError as exc:
            raise TradeoffError(f"{where}.layers: {exc}") from exc
    return cnn, _partitions(cnn, item.get("partitions", 1), f"{where}.partitions")


def _zoo_cnn(name: str, item: dict[str, Any], where: str) -> CNN:
    import torch

    from layerfit import zoo

    model = item["model"]
    if not isinstance(model, str):
        raise TradeoffError(f"{where}.model: expected a zoo model name, got {model!r}")
    try:
        entry = zoo.get(model)
    except LayerfitError as exc:
        raise TradeoffError(f"{where}.model: {exc}") from exc
    shape = item.get("input", list(entry.input_shape))
    if not isinstance(shape, list) or len(shape) != 4 or not all(_is_int(s, 1) for s in shape):
        raise TradeoffError(f"{where}.input: expected four positive integers (batch, channels, height, width), got {shape!r}")
    seed = item.get("seed", 0)
    if not _is_int(seed):
        raise TradeoffError(f"{where}.seed: expected an integer, got {seed!r}")
    module = zoo.build(model, seed=seed)
    example = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return cnn_from_module(name, module, example)


def _partitions(cnn: CNN, spec: Any, where: str) -> list[Partition]:
    if _is_int(spec, 1):
        return split_partitions(cnn, spec)
    if not isinstance(spec, list) or not spec:
        raise TradeoffError(f"{where}: expected a count or a list of layer ranges (first, last), got {spec!r}")
    result = []
    for k, rng in enumerate(spec):
        if not isinstance(rng, list) or len(rng) != 2:
            raise TradeoffError(f"{where}[{k}]: expected a range of two layers, first and last (names or indices), got {rng!r}")
        bounds = [_layer_index(cnn, end, f"{where}[{k}]") for end in rng]
        result.append(Partition(f"{cnn.name}.p{k}", cnn.name, bounds[0], bounds[1] + 1))
    return result


def _layer_index(cnn: CNN, end: Any, where: str) -> int:
    """A layer given by name or index."""
    if isinstance(end, str):
        try:
            return cnn.index(end)
        except TradeoffError as exc:
            raise TradeoffError(f"{where}: {exc}") from exc
    if not _is_int(end):
        raise TradeoffError(f"{where}: expected a layer name or index, got {end!r}")
    if not 0 <= end < len(cnn.layers):
        raise TradeoffError(f"{where}: layer index {end} out of range [0, {len(cnn.layers)})")
    return end


# Layer fields an application file gives as integers, and their least values.
_INTS = {"kernel": 1, "stride": 1, "padding": 0, "dilation": 1, "macs": 0}


def layer_from_dict(data: Any, where: str, previous: str | None) -> Layer:
    """A :class:`Layer` from an application-file mapping (its fields but ``reason``, its
    kind as ``op``, its inputs by name); errors name the field."""
    known = {f.name for f in fields(Layer)} - {"reason", "kind"} | {"op"}
    data = _mapping(data, known, where, "a mapping with name, op, shape")
    name, op = data.get("name"), data.get("op")
    if not isinstance(name, str) or not name:
        raise TradeoffError(f"{where}.name: expected a non-empty string, got {name!r}")
    if op not in LAYER_OPS:
        raise TradeoffError(f"{where}.op: expected one of {sorted(LAYER_OPS)}, got {op!r}")
    inputs = data.get("inputs", [previous] if previous is not None and op != "input" else [])
    inputs = [inputs] if isinstance(inputs, str) else inputs
    if not _names(inputs):
        raise TradeoffError(f"{where}.inputs: expected a list of layer names, got {inputs!r}")
    shape = data.get("shape")
    if not isinstance(shape, list) or not shape or not all(_is_int(s, 1) for s in shape):
        raise TradeoffError(f"{where}.shape: expected a list of positive integers, got {shape!r}")
    ints = {key: data.get(key, getattr(Layer, key)) for key in _INTS}
    for key, value in ints.items():
        if not _is_int(value, _INTS[key]):
            raise TradeoffError(f"{where}.{key}: expected an integer >= {_INTS[key]}, got {value!r}")
    tileable = data.get("tileable")
    if tileable is not None and not isinstance(tileable, bool):
        raise TradeoffError(f"{where}.tileable: expected true or false, got {tileable!r}")
    params = _param_count(data.get("params", 0), f"{where}.params")
    return Layer(name=name, kind=op, inputs=tuple(inputs), shape=tuple(shape), params=params, tileable=tileable, **ints)


def _is_int(value: Any, least: int | None = None) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and (least is None or value >= least)


def _param_count(value: Any, where: str) -> int:
    """Parameters as a count or as a list of tensor shapes (``[[8, 3, 5, 5], [8]]``)."""
    if _is_int(value, 0):
        return value
    if isinstance(value, list) and all(isinstance(s, list) and all(_is_int(d, 1) for d in s) for s in value):
        return sum(math.prod(s) for s in value)
    raise TradeoffError(f"{where}: expected a count or a list of tensor shapes, got {value!r}")


def layers_from_dicts(items: Sequence[Any], where: str) -> tuple[Layer, ...]:
    """Layers from a list of mappings; each layer reads the previous one unless told."""
    if not isinstance(items, list) or not items:
        raise TradeoffError(f"{where}: expected a non-empty list of layers")
    layers: list[Layer] = []
    for i, item in enumerate(items):
        layers.append(layer_from_dict(item, f"{where}[{i}]", layers[-1].name if layers else None))
    return tuple(layers)


def _constraints(data: Any, cnn_names: set[str]) -> Constraints:
    if data is None:
        return Constraints()
    data = _mapping(data, {"memory", "throughput"}, "constraints", "a mapping with memory and throughput")
    memory = None
    if data.get("memory") is not None:
        try:
            memory = parse_bytes(data["memory"])
        except BudgetError as exc:
            raise TradeoffError(f"constraints.memory: {exc}") from exc
    return Constraints(memory, parse_throughput(data.get("throughput"), cnn_names, "constraints.throughput"))


def parse_throughput(value: Any, cnn_names: set[str], where: str) -> dict[str, float]:
    """``T^c``: one number for every CNN, or a mapping CNN name -> frames per second."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        if not _is_fps(value):
            raise TradeoffError(
                f"{where}: expected a finite, non-negative number of frames per second (e.g. 40) or a "
                f"mapping CNN -> fps, got {value!r}"
            )
        return dict.fromkeys(sorted(cnn_names), float(value))
    for key, fps in value.items():
        if key not in cnn_names:
            raise TradeoffError(f"{where}.{key}: unknown CNN (have {sorted(cnn_names)})")
        if not _is_fps(fps):
            raise TradeoffError(f"{where}.{key}: expected a finite, non-negative number of frames per second, got {fps!r}")
    return {key: float(fps) for key, fps in value.items()}


def _is_fps(value: Any) -> bool:
    """A throughput constraint: a finite number >= 0 (NaN, infinity and integers too
    large for a float are not)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value)) and value >= 0
    except OverflowError:
        return False
