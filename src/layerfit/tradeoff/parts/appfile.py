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
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from layerfit.errors import BudgetError, LayerfitError, TradeoffError
from layerfit.extras import require
from layerfit.fields import expect, integer, is_int, is_names, is_number, load_yaml, mapping, number
from layerfit.sizes import parse_bytes
from layerfit.tradeoff.parts.application import Application, Partition, split_partitions
from layerfit.tradeoff.parts.cnn import CNN, LAYER_OPS, Layer
from layerfit.tradeoff.parts.kernels import cnn_from_module

# PyYAML comes with the tradeoff extra too: application files are YAML
require("yaml", extra="tradeoff")


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
    return load_yaml(text, str(path), TradeoffError, application_from_dict)


def application_from_dict(data: Any) -> tuple[Application, Constraints]:
    """Build the application and constraints from parsed YAML."""
    known = {"name", "precision", "fanout", "cnns", "parallel", "schedules", "constraints"}
    data = mapping(data, "the application file", TradeoffError, known, "a mapping with a `cnns` list", "")
    name = data.get("name", "application")
    expect(isinstance(name, str), "name", "a string", name, TradeoffError)
    items = data.get("cnns")
    if not isinstance(items, list) or not items:
        raise TradeoffError("cnns: expected a non-empty list of CNNs")
    cnns = [_cnn_from_item(item, f"cnns[{k}]") for k, item in enumerate(items)]
    parallel = data.get("parallel")
    ok = parallel is None or (isinstance(parallel, list) and all(is_names(j) for j in parallel))
    expect(ok, "parallel", "a list of lists of partition names", parallel, TradeoffError)
    schedules = data.get("schedules")
    ok = schedules is None or isinstance(schedules, dict)
    expect(ok, "schedules", "a mapping partition -> list of steps", schedules, TradeoffError)
    for key, steps in (schedules or {}).items():
        if not isinstance(steps, list) or not all(isinstance(step, str) or is_names(step) for step in steps):
            raise TradeoffError(f"schedules[{key}]: expected a list of steps (layer names or lists of them)")
    partitions = [p for _, parts in cnns for p in parts]
    precision, fanout = data.get("precision", "fp32"), data.get("fanout", "tensor")
    app = Application([c for c, _ in cnns], partitions, parallel, schedules, precision, fanout, name)
    return app, _constraints(data.get("constraints"), {c.name for c in app.cnns})


def _cnn_from_item(item: Any, where: str) -> tuple[CNN, list[Partition]]:
    known = {"name", "model", "input", "layers", "partitions", "seed"}
    item = mapping(item, where, TradeoffError, known, "a mapping with name and model or layers")
    name = item.get("name")
    ok = isinstance(name, str) and name and "." not in name and ":" not in name
    expect(ok, f"{where}.name", "a non-empty string without '.' or ':'", name, TradeoffError)
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
    expect(isinstance(model, str), f"{where}.model", "a zoo model name", model, TradeoffError)
    try:
        entry = zoo.get(model)
    except LayerfitError as exc:
        raise TradeoffError(f"{where}.model: {exc}") from exc
    shape = item.get("input", list(entry.input_shape))
    ok = isinstance(shape, list) and len(shape) == 4 and all(is_int(s, 1) for s in shape)
    expect(ok, f"{where}.input", "four positive integers (batch, channels, height, width)", shape, TradeoffError)
    seed = integer(item.get("seed", 0), f"{where}.seed", TradeoffError)
    module = zoo.build(model, seed=seed)
    example = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return cnn_from_module(name, module, example)


def _partitions(cnn: CNN, spec: Any, where: str) -> list[Partition]:
    if is_int(spec, 1):
        return split_partitions(cnn, spec)
    ok = isinstance(spec, list) and spec
    expect(ok, where, "a count or a list of layer ranges (first, last)", spec, TradeoffError)
    result = []
    for k, rng in enumerate(spec):
        ok = isinstance(rng, list) and len(rng) == 2
        expect(ok, f"{where}[{k}]", "a range of two layers, first and last (names or indices)", rng, TradeoffError)
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
    expect(is_int(end), where, "a layer name or index", end, TradeoffError)
    if not 0 <= end < len(cnn.layers):
        raise TradeoffError(f"{where}: layer index {end} out of range [0, {len(cnn.layers)})")
    return end


# Layer fields an application file gives as integers, and their least values.
_INTS = {"kernel": 1, "stride": 1, "padding": 0, "dilation": 1, "macs": 0}


def layer_from_dict(data: Any, where: str, previous: str | None) -> Layer:
    """A :class:`Layer` from an application-file mapping (its fields but ``reason``, its
    kind as ``op``, its inputs by name); errors name the field."""
    known = {f.name for f in fields(Layer)} - {"reason", "kind"} | {"op"}
    data = mapping(data, where, TradeoffError, known, "a mapping with name, op, shape")
    name, op = data.get("name"), data.get("op")
    expect(isinstance(name, str) and name, f"{where}.name", "a non-empty string", name, TradeoffError)
    expect(op in LAYER_OPS, f"{where}.op", f"one of {sorted(LAYER_OPS)}", op, TradeoffError)
    inputs = data.get("inputs", [previous] if previous is not None and op != "input" else [])
    inputs = [inputs] if isinstance(inputs, str) else inputs
    expect(is_names(inputs), f"{where}.inputs", "a list of layer names", inputs, TradeoffError)
    shape = data.get("shape")
    ok = isinstance(shape, list) and shape and all(is_int(s, 1) for s in shape)
    expect(ok, f"{where}.shape", "a list of positive integers", shape, TradeoffError)
    ints = {key: integer(data.get(key, getattr(Layer, key)), f"{where}.{key}", TradeoffError, least) for key, least in _INTS.items()}
    tileable = data.get("tileable")
    expect(tileable is None or isinstance(tileable, bool), f"{where}.tileable", "true or false", tileable, TradeoffError)
    params = _param_count(data.get("params", 0), f"{where}.params")
    return Layer(name=name, kind=op, inputs=tuple(inputs), shape=tuple(shape), params=params, tileable=tileable, **ints)


def _param_count(value: Any, where: str) -> int:
    """Parameters as a count or as a list of tensor shapes (``[[8, 3, 5, 5], [8]]``)."""
    if is_int(value, 0):
        return value
    if isinstance(value, list) and all(isinstance(s, list) and all(is_int(d, 1) for d in s) for s in value):
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
    data = mapping(data, "constraints", TradeoffError, {"memory", "throughput"}, "a mapping with memory and throughput")
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
        expected = "a finite number of frames per second >= 0 (e.g. 40) or a mapping CNN -> fps"
        expect(is_number(value, 0), where, expected, value, TradeoffError)
        return dict.fromkeys(sorted(cnn_names), float(value))
    for key in value:
        if key not in cnn_names:
            raise TradeoffError(f"{where}.{key}: unknown CNN (have {sorted(cnn_names)})")
    return {key: number(fps, f"{where}.{key}", TradeoffError, 0, "a finite number of frames per second") for key, fps in value.items()}

