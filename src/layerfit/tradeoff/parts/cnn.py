"""A CNN as the application model needs it: its layers in execution order.

A layer is the paper's ``l_i = (op_i, hyp_i, par_i)`` reduced to what the
memory-throughput trade-off needs, and it is the engine's
:class:`~layerfit.engine.stripes.Operator` (``Layer`` here): the operator kind, the
hyper-parameters that decide which input rows an output row reads (kernel, stride,
padding, dilation along the height), the layers it reads, the shape of the data it
produces, its number of parameters and its MACs. Layers come from hand-written lists
(tests; YAML application files, read by :mod:`~layerfit.tradeoff.parts.appfile`), which
name their inputs, or from a module as layerfit's capture sees it
(:func:`~layerfit.tradeoff.parts.kernels.cnn_from_module`, which keeps what it takes to
run the module, and :func:`~layerfit.tradeoff.parts.kernels.cnn_from_graph`, from a
stored capture).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from layerfit.engine.stripes import Operator, window_extent
from layerfit.errors import TradeoffError
from layerfit.tradeoff.parts.flow import FlowGraph, FlowNode
from layerfit.tradeoff.parts.rows import RowMap

# Operators that can process data by parts (Table 2): windows and row-wise operators.
WINDOW_OPS = frozenset({"conv", "pool"})
POINTWISE_OPS = frozenset({"bn", "act", "add", "mul", "concat"})
TILEABLE_OPS = WINDOW_OPS | POINTWISE_OPS | {"input"}
LAYER_OPS = TILEABLE_OPS | {"global_pool", "fc", "flatten", "softmax", "other"}

# A layer of the application model is an operator as the engine's stripes run it.
Layer = Operator


@dataclass(frozen=True)
class Stage:
    """A contiguous range ``[first, stop)`` of a CNN's layers with the tensors crossing its
    boundary: ``inputs``, layers whose data comes from outside the stage (the first nodes
    of its flow graph, never by parts), and ``outputs``, its layers read after it or
    results."""

    first: int
    stop: int
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]

    @property
    def members(self) -> tuple[int, ...]:
        """The layers its flow graph's nodes stand for: its inputs, then its own layers."""
        return (*self.inputs, *(n for n in range(self.first, self.stop) if n not in self.inputs))


@dataclass
class CNN:
    """A CNN as a list of layers in topological (execution) order; a layer's inputs are
    earlier layers, by index or by name (resolved to indices here).

    ``runner`` optionally keeps what is needed to execute it for real (a
    :class:`~layerfit.engine.stripes.Runner`: every layer's kernel and an example
    input), used to run it by parts, to measure throughput and to run its partitions.
    """

    name: str
    layers: tuple[Layer, ...]
    runner: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._index: dict[str, int] = {}
        layers = []
        for i, layer in enumerate(self.layers):
            where = f"cnn {self.name!r} layer {i} ({layer.name!r})"
            if layer.name in self._index:
                raise TradeoffError(f"{where}: duplicate layer name")
            if layer.kind not in LAYER_OPS:
                raise TradeoffError(f"{where}: unknown op {layer.kind!r} (expected one of {sorted(LAYER_OPS)})")
            inputs = tuple(self._index.get(n, -1) if isinstance(n, str) else n for n in layer.inputs)
            for name, k in zip(layer.inputs, inputs, strict=True):
                if not 0 <= k < i:
                    raise TradeoffError(f"{where}: input {name!r} is not an earlier layer")
            if any(not isinstance(s, int) or s < 1 for s in layer.shape):
                raise TradeoffError(f"{where}: shape must be positive integers, got {list(layer.shape)}")
            self._index[layer.name] = i
            layers.append(layer if inputs == layer.inputs else replace(layer, inputs=inputs))
        self.layers = tuple(layers)
        self._consumers: list[list[int]] = [[] for _ in self.layers]
        for c, layer in enumerate(self.layers):
            for i in dict.fromkeys(layer.inputs):
                self._consumers[i].append(c)
        self._maps = [self._row_maps(i) for i in range(len(self.layers))]

    def index(self, name: str) -> int:
        try:
            return self._index[name]
        except KeyError:
            raise TradeoffError(f"cnn {self.name!r} has no layer {name!r}") from None

    def consumers(self) -> list[list[int]]:
        """For each layer, the layers reading its output (each listed once)."""
        return [list(c) for c in self._consumers]

    def maps(self, i: int) -> tuple[RowMap, ...]:
        """How layer ``i`` reads each of its inputs."""
        return self._maps[i][0]

    def tileable(self, i: int) -> bool:
        """Can layer ``i`` process data by parts?"""
        return self._maps[i][1]

    def tiling_reason(self, i: int) -> str:
        return self._maps[i][2]

    def graph_inputs(self) -> list[int]:
        """The layers of kind ``input``: the data the CNN is given."""
        return [i for i, layer in enumerate(self.layers) if layer.kind == "input"]

    def stage(
        self, first: int, stop: int, graph_inputs_outside: bool, results: Collection[int] | None = None
    ) -> Stage:
        """The stage of layers ``[first, stop)``. Its inputs are the earlier layers read in
        it and, when ``graph_inputs_outside`` (a stage that runs: its caller gives the
        graph's inputs), every graph input when it is the first stage; otherwise the graph
        inputs are layers of the stage, whose data its partition holds (the application
        model). Its outputs are its layers read after it or among ``results`` (default:
        the layers nothing reads)."""
        count = len(self.layers)
        if not 0 <= first < stop <= count:
            raise TradeoffError(f"invalid layer range [{first}, {stop}) of {count} layers")
        ins = {i for n in range(first, stop) for i in self.layers[n].inputs if i < first}
        if graph_inputs_outside and first == 0:
            ins |= set(self.graph_inputs())
        if results is None:
            results = [i for i, readers in enumerate(self._consumers) if not readers]
        outs = {i for n in range(stop, count) for i in self.layers[n].inputs if first <= i < stop}
        outs |= {o for o in results if first <= o < stop}
        return Stage(first, stop, tuple(sorted(ins)), tuple(sorted(outs)))

    def flow_graph(self, stage: Stage, order: Sequence[int] | None = None) -> FlowGraph:
        """The row analysis' graph of ``stage``: its inputs are nodes without inputs, never
        by parts; its outputs leave the graph; ``order`` (of node positions) is the order
        whole layers run in."""
        members = stage.members
        local = {g: k for k, g in enumerate(members)}
        nodes = []
        for k, g in enumerate(members):
            layer = self.layers[g]
            if k < len(stage.inputs):
                nodes.append(FlowNode(layer.name, (), (), layer.rows, False))
            else:
                inputs = tuple(local[j] for j in layer.inputs)
                nodes.append(FlowNode(layer.name, inputs, self.maps(g), layer.rows, self.tileable(g)))
        return FlowGraph(tuple(nodes), tuple(local[o] for o in stage.outputs), None if order is None else tuple(order))

    def _row_maps(self, i: int) -> tuple[tuple[RowMap, ...], bool, str]:
        layer = self.layers[i]
        srcs = [self.layers[n] for n in layer.inputs]
        all_maps = tuple(RowMap("all", s.rows) for s in srcs)
        if layer.tileable is False:
            return all_maps, False, layer.reason or "marked not tileable"
        if layer.kind not in TILEABLE_OPS:
            return all_maps, False, layer.reason or f"{layer.kind} reads the full height"
        if not layer.is_spatial:
            return all_maps, False, "output has no height"
        if layer.kind == "input":
            return (), True, ""
        if layer.kind in WINDOW_OPS:
            if len(srcs) != 1 or not srcs[0].is_spatial:
                return all_maps, False, f"{layer.kind} needs one [N, C, H, W] input"
            extent = window_extent(layer.kernel, layer.dilation)
            return (RowMap("window", srcs[0].rows, extent, layer.stride, layer.padding),), True, ""
        maps = []
        for s in srcs:
            if s.is_spatial and s.rows == layer.rows:
                maps.append(RowMap.identity(s.rows))
            elif s.rows == 1:
                maps.append(RowMap("broadcast", 1))
            else:
                return all_maps, False, "inputs of different heights"
        return tuple(maps), True, ""

    @property
    def param_count(self) -> int:
        return sum(layer.params for layer in self.layers)
