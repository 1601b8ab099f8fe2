"""Per-layer records of a CNN, as the application model needs them.

A :class:`Layer` is the paper's ``l_i = (op_i, hyp_i, par_i)`` reduced to what the
memory-throughput trade-off needs: the operator kind, the hyper-parameters that decide
which input rows an output row reads (kernel, stride, padding, dilation along the
height), the layers it reads, the shape of the data it produces, its number of
parameters and its MACs. Layers come from hand-written lists (tests; YAML application
files, read by :mod:`~layerfit.tradeoff.parts.appfile`) or from a module as layerfit's
capture sees it (:func:`~layerfit.tradeoff.parts.kernels.cnn_from_module`, which keeps
what it takes to run the module, and :func:`~layerfit.tradeoff.parts.kernels.cnn_from_graph`,
from a stored capture).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from layerfit.errors import TradeoffError
from layerfit.tradeoff.parts.flow import FlowGraph, FlowNode
from layerfit.tradeoff.parts.rows import RowMap, window_extent

# Operators that can process data by parts (Table 2): windows and row-wise operators.
WINDOW_OPS = frozenset({"conv", "pool"})
POINTWISE_OPS = frozenset({"bn", "act", "add", "mul", "concat"})
TILEABLE_OPS = WINDOW_OPS | POINTWISE_OPS | {"input"}
LAYER_OPS = TILEABLE_OPS | {"global_pool", "fc", "flatten", "softmax", "other"}


@dataclass(frozen=True)
class Layer:
    """One layer: operator, hyper-parameters along the height, inputs, output data shape.

    ``shape`` is the shape of the data the layer produces (``[batch, ch, H, W]`` for
    feature maps). ``params`` is the number of parameter elements (Eq. 2 sums them).
    ``tileable`` overrides the operator's default ability to process by parts.
    """

    name: str
    op: str
    inputs: tuple[str, ...] = ()
    shape: tuple[int, ...] = ()
    kernel: int = 1
    stride: int = 1
    padding: int = 0
    dilation: int = 1
    params: int = 0
    macs: int = 0
    tileable: bool | None = None
    reason: str = ""

    @property
    def is_spatial(self) -> bool:
        return len(self.shape) == 4

    @property
    def rows(self) -> int:
        """Height of the output data (1 for data without a height)."""
        return self.shape[2] if self.is_spatial else 1

    @property
    def elems(self) -> int:
        """``|e.data|``: elements of the output data."""
        return math.prod(self.shape) if self.shape else 0

    @property
    def row_elems(self) -> int:
        return self.elems // self.rows


@dataclass
class CNN:
    """A CNN as a list of layers in topological (execution) order.

    ``runner`` optionally keeps what is needed to execute it for real (a
    :class:`~layerfit.tradeoff.parts.kernels.Runner`: every layer's kernel and an example
    input), used to run it by parts, to measure throughput and to run its partitions.
    """

    name: str
    layers: tuple[Layer, ...]
    runner: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.layers = tuple(self.layers)
        self._index = {}
        for i, layer in enumerate(self.layers):
            where = f"cnn {self.name!r} layer {i} ({layer.name!r})"
            if layer.name in self._index:
                raise TradeoffError(f"{where}: duplicate layer name")
            if layer.op not in LAYER_OPS:
                raise TradeoffError(f"{where}: unknown op {layer.op!r} (expected one of {sorted(LAYER_OPS)})")
            for name in layer.inputs:
                if name not in self._index:
                    raise TradeoffError(f"{where}: input {name!r} is not an earlier layer")
            if any(not isinstance(s, int) or s < 1 for s in layer.shape):
                raise TradeoffError(f"{where}: shape must be positive integers, got {list(layer.shape)}")
            self._index[layer.name] = i
        self._inputs = [tuple(self._index[n] for n in layer.inputs) for layer in self.layers]
        self._consumers: list[list[int]] = [[] for _ in self.layers]
        for c, ins in enumerate(self._inputs):
            for i in dict.fromkeys(ins):
                self._consumers[i].append(c)
        self._maps = [self._row_maps(i) for i in range(len(self.layers))]

    def index(self, name: str) -> int:
        try:
            return self._index[name]
        except KeyError:
            raise TradeoffError(f"cnn {self.name!r} has no layer {name!r}") from None

    def inputs_of(self, i: int) -> tuple[int, ...]:
        """Indices of the layers layer ``i`` reads, in argument order."""
        return self._inputs[i]

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

    def flow_graph(
        self, members: Sequence[int], external: int, outputs: Sequence[int], order: Sequence[int] | None = None
    ) -> FlowGraph:
        """The row analysis' graph of layers ``members`` (in order): the first ``external``
        are produced elsewhere (nodes without inputs, never by parts); ``outputs`` leave
        the graph; ``order`` (of member positions) is the order whole layers run in."""
        local = {g: k for k, g in enumerate(members)}
        nodes = []
        for k, g in enumerate(members):
            layer = self.layers[g]
            if k < external:
                nodes.append(FlowNode(layer.name, (), (), layer.rows, layer.row_elems, False))
            else:
                inputs = tuple(local[j] for j in self._inputs[g])
                nodes.append(FlowNode(layer.name, inputs, self.maps(g), layer.rows, layer.row_elems, self.tileable(g)))
        return FlowGraph(tuple(nodes), tuple(local[o] for o in outputs), None if order is None else tuple(order))

    def _row_maps(self, i: int) -> tuple[tuple[RowMap, ...], bool, str]:
        layer = self.layers[i]
        srcs = [self.layers[self._index[n]] for n in layer.inputs]
        all_maps = tuple(RowMap("all", s.rows) for s in srcs)
        if layer.tileable is False:
            return all_maps, False, layer.reason or "marked not tileable"
        if layer.op not in TILEABLE_OPS:
            return all_maps, False, layer.reason or f"{layer.op} reads the full height"
        if not layer.is_spatial:
            return all_maps, False, "output has no height"
        if layer.op == "input":
            return (), True, ""
        if layer.op in WINDOW_OPS:
            if len(srcs) != 1 or not srcs[0].is_spatial:
                return all_maps, False, f"{layer.op} needs one [N, C, H, W] input"
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
