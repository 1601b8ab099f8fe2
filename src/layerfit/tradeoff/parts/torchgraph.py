"""A PyTorch module as a list of layers that can (or cannot) run by parts.

:func:`trace_module` traces a module with ``torch.fx``, propagates shapes for one
example input and classifies every node:

* *window* layers (Conv2d incl. grouped/depthwise/dilated, MaxPool2d, AvgPool2d): output
  row ``o`` reads a window of input rows (Table 2: ``H_min^in = ks``);
* *pointwise* layers (BatchNorm2d in eval mode, activations, dropout in eval mode,
  elementwise ``+ - * /`` incl. residual adds and per-channel gates, channel concat):
  output row ``o`` reads row ``o`` of every input (``H_min^in = 1``);
* everything else (global/adaptive pooling, Linear, flatten, reshapes, unknown
  functions, non-tensor values) has a full-height receptive field as far as we know and
  is marked not tileable: it always runs whole, on whole inputs.

Each tileable node carries a *stripe kernel* that computes output rows ``a..b`` from the
input rows they read, with the same arithmetic as the module: padding rows are
materialised only for phases touching the border, so interior phases pass views of
the edge buffers straight to the operator. Every node also runs whole through its fx
target. Operators run out of place (``inplace`` flags are dropped) because a stripe is
a view into a buffer other consumers still read.
"""

from __future__ import annotations

import copy
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp

from layerfit.errors import TradeoffError
from layerfit.tradeoff.parts.rows import RowMap, window_extent

# Modules applied element by element (row r of the output depends on row r of the input).
POINTWISE_MODULES: tuple[type[nn.Module], ...] = (
    nn.ReLU,
    nn.ReLU6,
    nn.SiLU,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.Sigmoid,
    nn.Tanh,
    nn.LeakyReLU,
    nn.GELU,
    nn.ELU,
    nn.Mish,
    nn.PReLU,
    nn.Softplus,
    nn.Identity,
    nn.Dropout,
    nn.Dropout2d,
)

# Functions whose tensor arguments are read element by element (with broadcasting).
POINTWISE_FUNCTIONS: frozenset[Any] = frozenset(
    {
        operator.add,
        operator.sub,
        operator.mul,
        operator.truediv,
        operator.iadd,
        operator.isub,
        operator.imul,
        operator.itruediv,
        torch.add,
        torch.sub,
        torch.mul,
        torch.div,
        torch.relu,
        torch.sigmoid,
        torch.tanh,
        F.relu,
        F.relu6,
        F.silu,
        F.hardswish,
        F.hardsigmoid,
        F.sigmoid,
        F.gelu,
        F.leaky_relu,
        F.elu,
        F.mish,
        F.dropout,
    }
)
POINTWISE_METHODS: frozenset[str] = frozenset(
    {"add", "sub", "mul", "div", "relu", "sigmoid", "tanh", "clamp", "add_", "mul_", "relu_"}
)
_OUT_OF_PLACE = {
    operator.iadd: operator.add,
    operator.isub: operator.sub,
    operator.imul: operator.mul,
    operator.itruediv: operator.truediv,
}

StripeKernel = Callable[[list[Any], int, int], torch.Tensor]


@dataclass
class TracedNode:
    """One fx node with its role in processing by parts.

    ``op`` is the layer kind (``input``, ``conv``, ``pool``, ``bn``, ``act``, ``add``,
    ``mul``, ``concat``, ``global_pool``, ``fc``, ``flatten``, ``const``, ``other``);
    ``inputs`` are indices of the nodes it reads; ``maps`` (one per input) say which rows
    of that input an output row reads; ``shape`` is the output shape (None when the
    node's value is not a tensor). ``stripe`` computes output rows ``a..b`` from
    per-input stripes; ``whole`` computes the full output from full inputs.
    """

    name: str
    op: str
    inputs: tuple[int, ...]
    maps: tuple[RowMap, ...]
    shape: tuple[int, ...] | None
    dtype: torch.dtype | None
    tileable: bool
    whole: Callable[[list[Any]], Any]
    stripe: StripeKernel | None = None
    params: tuple[tuple[int, ...], ...] = ()
    macs: int = 0
    reason: str = ""  # why the node cannot be tiled
    geometry: dict[str, int] = field(default_factory=dict)

    @property
    def is_spatial(self) -> bool:
        """True for ``[N, C, H, W]`` tensors, the only ones split into rows."""
        return self.shape is not None and len(self.shape) == 4

    @property
    def rows(self) -> int:
        return self.shape[2] if self.is_spatial else 1

    @property
    def numel(self) -> int:
        return math.prod(self.shape) if self.shape is not None else 0

    @property
    def row_elems(self) -> int:
        return self.numel // self.rows

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size() if self.dtype is not None else 0


@dataclass
class TracedGraph:
    """The traced nodes of a module in execution order, and how its result is assembled."""

    module: nn.Module
    nodes: list[TracedNode]
    placeholders: list[int]
    output_arg: Any  # fx output argument with fx Nodes replaced by node indices
    outputs: tuple[int, ...]

    def index(self, name: str) -> int:
        for i, node in enumerate(self.nodes):
            if node.name == name:
                return i
        raise TradeoffError(f"no node named {name!r} in the traced graph")

    def consumers(self) -> list[list[int]]:
        result: list[list[int]] = [[] for _ in self.nodes]
        for c, node in enumerate(self.nodes):
            for i in dict.fromkeys(node.inputs):
                result[i].append(c)
        return result


def trace_module(module: nn.Module, *example_inputs: torch.Tensor) -> TracedGraph:
    """Trace ``module`` with torch.fx and classify every node for processing by parts.

    Raises :class:`TradeoffError` if the module is in training mode (batch statistics
    and dropout depend on the whole tensor) or cannot be traced.
    """
    if module.training:
        raise TradeoffError("put the model in eval mode (model.eval()) before tracing it for processing by parts")
    try:
        gm = torch.fx.symbolic_trace(module)
    except Exception as exc:  # fx raises many types for untraceable code
        raise TradeoffError(f"cannot trace {type(module).__name__} with torch.fx: {exc}") from exc
    with torch.no_grad():
        ShapeProp(gm).propagate(*example_inputs)
    index: dict[torch.fx.Node, int] = {}
    nodes: list[TracedNode] = []
    placeholders: list[int] = []
    output_arg: Any = None
    for fx_node in gm.graph.nodes:
        if fx_node.op == "output":
            output_arg = torch.fx.node.map_arg(fx_node.args[0], lambda n: _Ref(index[n]))
            continue
        node = _classify(gm, fx_node, index, nodes)
        index[fx_node] = len(nodes)
        if fx_node.op == "placeholder":
            placeholders.append(len(nodes))
        nodes.append(node)
    outputs = tuple(dict.fromkeys(r.index for r in _refs(output_arg)))
    return TracedGraph(module=gm, nodes=nodes, placeholders=placeholders, output_arg=output_arg, outputs=outputs)


@dataclass(frozen=True)
class _Ref:
    """Placeholder for "the value of node ``index``" inside reconstructed arguments."""

    index: int


@dataclass(frozen=True)
class _Site:
    """What every node builder needs: name, inputs, output shape and dtype, whole runner."""

    name: str
    inputs: tuple[int, ...]
    nodes: list[TracedNode]
    shape: tuple[int, ...] | None
    dtype: torch.dtype | None
    run: Callable[[list[Any]], Any]

    def unpack(self) -> tuple[str, tuple[int, ...], list[TracedNode], tuple[int, ...] | None, torch.dtype | None, Callable[[list[Any]], Any]]:
        return self.name, self.inputs, self.nodes, self.shape, self.dtype, self.run


def _refs(arg: Any) -> list[_Ref]:
    found: list[_Ref] = []

    def visit(a: Any) -> None:
        if isinstance(a, _Ref):
            found.append(a)
        elif isinstance(a, (list, tuple)):
            for x in a:
                visit(x)
        elif isinstance(a, dict):
            for x in a.values():
                visit(x)

    visit(arg)
    return found


def substitute(arg: Any, values: Callable[[int], Any]) -> Any:
    """Replace every :class:`_Ref` in a nested argument by ``values(index)``."""
    if isinstance(arg, _Ref):
        return values(arg.index)
    if isinstance(arg, tuple):
        return tuple(substitute(a, values) for a in arg)
    if isinstance(arg, list):
        return [substitute(a, values) for a in arg]
    if isinstance(arg, dict):
        return {k: substitute(v, values) for k, v in arg.items()}
    return arg


def _meta(fx_node: torch.fx.Node) -> tuple[tuple[int, ...] | None, torch.dtype | None]:
    meta = fx_node.meta.get("tensor_meta")
    if meta is None or not hasattr(meta, "shape"):
        return None, None
    return tuple(int(s) for s in meta.shape), meta.dtype


def _pair(value: Any) -> tuple[int, int]:
    if isinstance(value, (tuple, list)):
        return (int(value[0]), int(value[-1]))
    return (int(value), int(value))


def _classify(
    gm: torch.fx.GraphModule,
    fx_node: torch.fx.Node,
    index: dict[torch.fx.Node, int],
    nodes: list[TracedNode],
) -> TracedNode:
    shape, dtype = _meta(fx_node)
    args = torch.fx.node.map_arg(fx_node.args, lambda n: _Ref(index[n]))
    kwargs = torch.fx.node.map_arg(fx_node.kwargs, lambda n: _Ref(index[n]))
    inputs = tuple(dict.fromkeys(r.index for r in _refs((args, kwargs))))
    name = fx_node.name
    spatial_out = shape is not None and len(shape) == 4

    def all_maps() -> tuple[RowMap, ...]:
        return tuple(RowMap("all", nodes[i].rows) for i in inputs)

    def whole_node(op: str, run: Callable[[list[Any]], Any], reason: str, **extra: Any) -> TracedNode:
        return TracedNode(name, op, inputs, all_maps(), shape, dtype, False, run, reason=reason, **extra)

    if fx_node.op == "placeholder":
        return TracedNode(name, "input", (), (), shape, dtype, False, _fail_run(name), reason="graph input")
    if fx_node.op == "get_attr":
        value = _fetch_attr(gm, str(fx_node.target))
        return TracedNode(name, "const", (), (), shape, dtype, False, lambda _v, value=value: value, reason="constant")

    run = _whole_runner(gm, fx_node, args, kwargs)
    site = _Site(name, inputs, nodes, shape, dtype, run)
    if fx_node.op == "call_module":
        mod = gm.get_submodule(str(fx_node.target))
        params = tuple(tuple(p.shape) for p in mod.parameters(recurse=False)) + tuple(
            tuple(b.shape) for b in mod.buffers(recurse=False)
        )
        if isinstance(mod, nn.Conv2d):
            return _conv_node(site, mod, params)
        if isinstance(mod, nn.MaxPool2d):
            return _maxpool_node(site, mod)
        if isinstance(mod, nn.AvgPool2d):
            return _avgpool_node(site, mod)
        if isinstance(mod, (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)):
            return whole_node("global_pool", run, "adaptive pooling reads the full height")
        if isinstance(mod, nn.Linear):
            macs = math.prod(shape[:-1]) * mod.in_features * mod.out_features if shape else 0
            return whole_node("fc", run, "fully connected reads the full input", params=params, macs=macs)
        if isinstance(mod, nn.Flatten):
            return whole_node("flatten", run, "flatten mixes rows")
        if isinstance(mod, nn.BatchNorm2d):
            return _pointwise_module(site, "bn", mod, params)
        if isinstance(mod, POINTWISE_MODULES):
            return _pointwise_module(site, "act", mod, params)
        return whole_node("other", run, f"{type(mod).__name__} is not known to work by parts", params=params)
    if fx_node.op == "call_function":
        target = fx_node.target
        if target in POINTWISE_FUNCTIONS:
            op = "add" if target in (operator.add, operator.iadd, torch.add, operator.sub, operator.isub, torch.sub) else (
                "mul" if target in (operator.mul, operator.imul, torch.mul, operator.truediv, operator.itruediv, torch.div) else "act"
            )
            func = _OUT_OF_PLACE.get(target, target)
            kw = {k: v for k, v in kwargs.items() if k != "inplace"}
            return _pointwise_call(site, op, lambda a, k, func=func: func(*a, **k), args, kw)
        if target is torch.cat:
            dim = kwargs.get("dim", args[1] if len(args) > 1 else 0)
            if spatial_out and dim in (1, -3):
                return _pointwise_call(site, "concat", lambda a, k: torch.cat(*a, **k), args, kwargs)
            return whole_node("other", run, f"concatenation along dim {dim} mixes rows")
        if target in (torch.flatten,):
            return whole_node("flatten", run, "flatten mixes rows")
        if target in (F.adaptive_avg_pool2d, F.adaptive_max_pool2d):
            return whole_node("global_pool", run, "adaptive pooling reads the full height")
        return whole_node("other", run, f"function {getattr(target, '__name__', target)} is not known to work by parts")
    if fx_node.op == "call_method":
        method = str(fx_node.target)
        if method in POINTWISE_METHODS:
            base = method.rstrip("_")
            kw = dict(kwargs)
            op = "add" if base in ("add", "sub") else ("mul" if base in ("mul", "div") else "act")
            return _pointwise_call(site, op, lambda a, k, base=base: getattr(a[0], base)(*a[1:], **k), args, kw)
        if method in ("flatten", "view", "reshape"):
            return whole_node("flatten", run, f"{method} mixes rows")
        if method == "mean":
            return whole_node("global_pool", run, "mean over spatial dimensions reads the full height")
        return whole_node("other", run, f"method {method} is not known to work by parts")
    raise TradeoffError(f"unsupported fx node {fx_node.op} {fx_node.target}")


def _fetch_attr(gm: torch.fx.GraphModule, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _fail_run(name: str) -> Callable[[list[Any]], Any]:
    def run(_values: list[Any]) -> Any:
        raise TradeoffError(f"graph input {name!r} has no value")

    return run


def _whole_runner(gm: torch.fx.GraphModule, fx_node: torch.fx.Node, args: Any, kwargs: Any) -> Callable[[list[Any]], Any]:
    """Run the fx node on whole values, out of place. ``values`` are indexed like ``inputs``."""
    refs = list(dict.fromkeys(r.index for r in _refs((args, kwargs))))
    slot = {idx: k for k, idx in enumerate(refs)}
    kwargs = {k: v for k, v in kwargs.items() if k != "inplace"} if isinstance(kwargs, dict) else kwargs
    if fx_node.op == "call_module":
        target: Any = _out_of_place_module(gm.get_submodule(str(fx_node.target)))
    elif fx_node.op == "call_function":
        target = _OUT_OF_PLACE.get(fx_node.target, fx_node.target)
    else:
        method = str(fx_node.target)
        if method.endswith("_") and hasattr(torch.Tensor, method[:-1]):
            method = method[:-1]

        def target(obj: Any, *a: Any, method: str = method, **k: Any) -> Any:
            return getattr(obj, method)(*a, **k)

    def run(values: list[Any]) -> Any:
        def get(i: int) -> Any:
            return values[slot[i]]

        return target(*substitute(args, get), **substitute(kwargs, get))

    return run


def _out_of_place_module(mod: nn.Module) -> nn.Module:
    if getattr(mod, "inplace", False):
        mod = copy.copy(mod)
        mod.inplace = False
    return mod


def _spatial_input(nodes: list[TracedNode], inputs: Sequence[int]) -> TracedNode | None:
    if len(inputs) != 1 or not nodes[inputs[0]].is_spatial:
        return None
    return nodes[inputs[0]]


def assemble(view: torch.Tensor, top: int, bottom: int, value: float) -> torch.Tensor:
    """``view`` with ``top`` and ``bottom`` rows of ``value`` added (border phases only)."""
    if top == 0 and bottom == 0:
        return view
    n, c, _, w = view.shape
    parts = []
    if top:
        parts.append(view.new_full((n, c, top, w), value))
    parts.append(view)
    if bottom:
        parts.append(view.new_full((n, c, bottom, w), value))
    return torch.cat(parts, dim=2)


def _window_stripe(rmap: RowMap, fill: float, op: Callable[[torch.Tensor], torch.Tensor]) -> StripeKernel:
    """Kernel for a window layer: pad the stripe at the borders, run ``op`` unpadded in H."""

    def stripe(values: list[Any], a: int, b: int) -> torch.Tensor:
        lo_u, hi_u = rmap.unclipped(a, b)
        lo, hi = max(lo_u, 0), min(hi_u, rmap.in_rows - 1)
        view = values[0]
        if lo > hi:  # the window lies wholly in padding
            n, c, _, w = view.shape
            return op(view.new_full((n, c, hi_u - lo_u + 1, w), fill))
        return op(assemble(view, lo - lo_u, hi_u - hi, fill))

    return stripe


def _conv_node(site: _Site, mod: nn.Conv2d, params: tuple[tuple[int, ...], ...]) -> TracedNode:
    name, inputs, nodes, shape, dtype, run = site.unpack()
    src = _spatial_input(nodes, inputs)
    kh, kw = mod.kernel_size
    sh, sw = mod.stride
    dh, dw = mod.dilation
    macs = math.prod(shape) * (mod.in_channels // mod.groups) * kh * kw if shape else 0
    common = dict(params=params, macs=macs, geometry=dict(kernel=kh, stride=sh, dilation=dh))
    if isinstance(mod.padding, str):
        if mod.padding == "valid":
            ph = pw = 0
        else:  # "same": torch pads total // 2 before and the rest after
            th, tw = dh * (kh - 1), dw * (kw - 1)
            if th % 2 or tw % 2:
                return _untileable(site, "conv", "asymmetric 'same' padding", **common)
            ph, pw = th // 2, tw // 2
    else:
        ph, pw = mod.padding
    if mod.padding_mode != "zeros":
        return _untileable(site, "conv", f"padding mode {mod.padding_mode!r}", **common)
    if src is None or shape is None or len(shape) != 4:
        return _untileable(site, "conv", "input is not [N, C, H, W]", **common)
    common["geometry"]["padding"] = ph
    rmap = RowMap("window", src.rows, window_extent(kh, dh), sh, ph)
    weight, bias, groups = mod.weight, mod.bias, mod.groups

    def op(x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, weight, bias, (sh, sw), (0, pw), (dh, dw), groups)

    return TracedNode(name, "conv", inputs, (rmap,), shape, dtype, True, run, _window_stripe(rmap, 0.0, op), **common)


def _maxpool_node(site: _Site, mod: nn.MaxPool2d) -> TracedNode:
    name, inputs, nodes, shape, dtype, run = site.unpack()
    src = _spatial_input(nodes, inputs)
    kh, kw = _pair(mod.kernel_size)
    sh, sw = _pair(mod.stride if mod.stride is not None else mod.kernel_size)
    ph, pw = _pair(mod.padding)
    dh, dw = _pair(mod.dilation)
    geometry = dict(kernel=kh, stride=sh, padding=ph, dilation=dh)
    if src is None or mod.return_indices or shape is None or len(shape) != 4:
        return _untileable(site, "pool", "pooling with indices or non-4D input", geometry=geometry)
    rmap = RowMap("window", src.rows, window_extent(kh, dh), sh, ph)
    ceil = mod.ceil_mode

    def op(x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(x, (kh, kw), (sh, sw), (0, pw), (dh, dw), ceil)

    return TracedNode(name, "pool", inputs, (rmap,), shape, dtype, True, run, _window_stripe(rmap, -math.inf, op), geometry=geometry)


def avgpool_divisors(
    in_size: int, out_size: int, kernel: int, stride: int, pad: int, count_include_pad: bool
) -> list[int]:
    """The divisor torch's CPU ``avg_pool2d`` uses along one dimension, per output index."""
    result = []
    for o in range(out_size):
        start = o * stride - pad
        end = min(start + kernel, in_size + pad)
        pool = end - start
        valid = min(end, in_size) - max(start, 0)
        result.append(pool if count_include_pad else valid)
    return result


def _avgpool_node(site: _Site, mod: nn.AvgPool2d) -> TracedNode:
    name, inputs, nodes, shape, dtype, run = site.unpack()
    src = _spatial_input(nodes, inputs)
    kh, kw = _pair(mod.kernel_size)
    sh, sw = _pair(mod.stride if mod.stride is not None else mod.kernel_size)
    ph, pw = _pair(mod.padding)
    geometry = dict(kernel=kh, stride=sh, padding=ph, dilation=1)
    if src is None or shape is None or len(shape) != 4:
        return _untileable(site, "pool", "non-4D input", geometry=geometry)
    rmap = RowMap("window", src.rows, kh, sh, ph)
    ceil = mod.ceil_mode
    override = mod.divisor_override
    if override:
        divisors: torch.Tensor | None = None
    else:
        dh = avgpool_divisors(src.rows, shape[2], kh, sh, ph, mod.count_include_pad)
        dwv = avgpool_divisors(src.shape[3], shape[3], kw, sw, pw, mod.count_include_pad)
        divisors = torch.tensor([[a * b for b in dwv] for a in dh], dtype=dtype)

    def op(x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(x, (kh, kw), (sh, sw), (0, pw), ceil, True, 1)

    window = _window_stripe(rmap, 0.0, op)

    def stripe(values: list[Any], a: int, b: int) -> torch.Tensor:
        sums = window(values, a, b)
        if divisors is None:
            return sums / override
        return sums / divisors[a : b + 1]

    return TracedNode(name, "pool", inputs, (rmap,), shape, dtype, True, run, stripe, geometry=geometry)


def _untileable(site: _Site, op: str, reason: str, **extra: Any) -> TracedNode:
    name, inputs, nodes, shape, dtype, run = site.unpack()
    maps = tuple(RowMap("all", nodes[i].rows) for i in inputs)
    return TracedNode(name, op, inputs, maps, shape, dtype, False, run, reason=reason, **extra)


def _pointwise_module(site: _Site, op: str, mod: nn.Module, params: tuple[tuple[int, ...], ...]) -> TracedNode:
    name, inputs, nodes, shape, dtype, run = site.unpack()
    src = _spatial_input(nodes, inputs)
    if src is None or shape is None or len(shape) != 4 or src.rows != shape[2]:
        return _untileable(site, op, "input is not [N, C, H, W]", params=params)
    mod = _out_of_place_module(mod)
    rmap = RowMap.identity(src.rows)
    forward = mod.forward  # the module's own arithmetic, without the hook machinery per phase
    if isinstance(mod, nn.BatchNorm2d) and mod.running_mean is not None:
        # what F.batch_norm calls in eval mode, minus its Python-level checks
        bn_args = (mod.weight, mod.bias, mod.running_mean, mod.running_var, False, 0.0, mod.eps)

        def stripe(values: list[Any], a: int, b: int) -> torch.Tensor:
            return torch.batch_norm(values[0], *bn_args, torch.backends.cudnn.enabled)

    else:

        def stripe(values: list[Any], a: int, b: int) -> torch.Tensor:
            return forward(values[0])

    return TracedNode(name, op, inputs, (rmap,), shape, dtype, True, run, stripe, params=params, geometry=dict(kernel=1, stride=1, padding=0, dilation=1))


def _pointwise_call(
    site: _Site, op: str, call: Callable[[Any, Any], torch.Tensor], args: Any, kwargs: Any
) -> TracedNode:
    name, inputs, nodes, shape, dtype, run = site.unpack()
    """Elementwise function of several inputs: identity maps, or broadcast for 1-row inputs."""
    if shape is None or len(shape) != 4:
        return _untileable(site, op, "output is not [N, C, H, W]")
    maps = []
    for i in inputs:
        src = nodes[i]
        if not src.is_spatial:
            if src.shape is None or src.numel <= 1 or len(src.shape) <= 1:
                maps.append(RowMap("broadcast", 1))  # scalars and tiny constants
                continue
            return _untileable(site, op, "broadcast of a non-4D tensor")
        if src.rows == shape[2]:
            maps.append(RowMap.identity(src.rows))
        elif src.rows == 1:
            maps.append(RowMap("broadcast", 1))
        else:
            return _untileable(site, op, "inputs of different heights")
    slot = {idx: k for k, idx in enumerate(inputs)}

    def stripe(values: list[Any], a: int, b: int) -> torch.Tensor:
        def get(i: int) -> Any:
            return values[slot[i]]

        return call(substitute(args, get), substitute(kwargs, get))

    return TracedNode(name, op, tuple(inputs), tuple(maps), shape, dtype, True, run, stripe, geometry=dict(kernel=1, stride=1, padding=0, dilation=1))
