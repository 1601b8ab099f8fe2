"""A PyTorch module as a list of layers that can (or cannot) run by parts.

The module is seen as layerfit's capture sees it: traced by the shared fx tracer
(:func:`~layerfit.capture.activations.fx_trace`, so node names are the captured ops'
names), with the shape and dtype of every tensor from the capture's recorded run
(:func:`~layerfit.capture.activations.run_fx`) - :func:`trace_module` - or from a
:class:`~layerfit.capture.graph.ModelGraph` captured earlier - :func:`traced_from_graph`.
What processing by parts adds to the capture is the classification of every node and
its kernels:

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
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from layerfit.capture.activations import fx_trace, run_fx
from layerfit.capture.macs import module_macs
from layerfit.errors import TradeoffError
from layerfit.tradeoff.parts.rows import RowMap, window_extent

if TYPE_CHECKING:
    from layerfit.capture.graph import ModelGraph, TensorRecord

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
# The shape and dtype of every node whose value is one tensor, by node name.
NodeValues = dict[str, tuple[tuple[int, ...], torch.dtype]]


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
    """Trace ``module`` as capture does, run it once on ``example_inputs`` to record the
    shape of every tensor, and classify every node for processing by parts.

    Raises :class:`TradeoffError` if the module is in training mode (batch statistics
    and dropout depend on the whole tensor) or cannot be traced.
    """
    gm = _trace(module)
    captured = run_fx(gm, example_inputs)
    values = {name: _value(captured.tensors[tid]) for name, tid in captured.tensor_of.items()}
    return _build(gm, values)


def traced_from_graph(graph: ModelGraph, module: nn.Module) -> TracedGraph:
    """The traced nodes of ``module`` with the shapes and dtypes of ``graph``, a capture of
    it with torch.fx (the same tracer, so every op is the node of its name).

    An op's value is taken to be its one output tensor when it has one (the graph does
    not say whether it came in a tuple); graph inputs are matched to the module's inputs
    in order. Raises :class:`TradeoffError` for a hooks capture, which does not record
    the operators between modules (residual adds among them), for a module in training
    mode, and for a graph that is not a capture of ``module``.
    """
    if graph.method != "fx":
        raise TradeoffError(
            f"the graph of {graph.model_type} was captured with {graph.method}: processing by "
            "parts needs every operator (residual adds included), which only an fx capture records"
        )
    gm = _trace(module)
    names = {node.name for node in gm.graph.nodes}
    strangers = [op.name for op in graph.ops if op.name not in names]
    if strangers:
        raise TradeoffError(
            f"the graph is not a capture of this {type(module).__name__}: it has no node "
            f"{strangers[0]!r}" + (f" (and {len(strangers) - 1} more)" if len(strangers) > 1 else "")
        )
    tensors = {t.id: t for t in graph.tensors}
    produced = {tid for op in graph.ops for tid in op.outputs}
    placeholders = [node.name for node in gm.graph.nodes if node.op == "placeholder"]
    inputs = [t for t in graph.tensors if t.id not in produced]
    values = {name: _value(t) for name, t in zip(placeholders, inputs, strict=False)}
    for op in graph.ops:
        if len(op.outputs) == 1:
            values[op.name] = _value(tensors[op.outputs[0]])
    return _build(gm, values)


def _trace(module: nn.Module) -> torch.fx.GraphModule:
    """The shared fx trace of ``module``, refused in training mode."""
    if module.training:
        raise TradeoffError("put the model in eval mode (model.eval()) before tracing it for processing by parts")
    try:
        return fx_trace(module)
    except Exception as exc:  # fx raises many types for untraceable code
        raise TradeoffError(f"cannot trace {type(module).__name__} with torch.fx: {exc}") from exc


def _value(tensor: TensorRecord) -> tuple[tuple[int, ...], torch.dtype]:
    """Shape and torch dtype of a captured tensor (capture names dtypes ``float32``)."""
    return tuple(tensor.shape), getattr(torch, tensor.dtype)


def _build(gm: torch.fx.GraphModule, values: NodeValues) -> TracedGraph:
    """Classify the nodes of ``gm`` in order; ``values`` gives the tensors' shapes."""
    index: dict[torch.fx.Node, int] = {}
    nodes: list[TracedNode] = []
    placeholders: list[int] = []
    output_arg: Any = None
    for fx_node in gm.graph.nodes:
        if fx_node.op == "output":
            output_arg = torch.fx.node.map_arg(fx_node.args[0], lambda n: _Ref(index[n]))
            continue
        node = _classify(gm, fx_node, index, nodes, values)
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


def _pair(value: Any) -> tuple[int, int]:
    if isinstance(value, (tuple, list)):
        return (int(value[0]), int(value[-1]))
    return (int(value), int(value))


def _classify(
    gm: torch.fx.GraphModule,
    fx_node: torch.fx.Node,
    index: dict[torch.fx.Node, int],
    nodes: list[TracedNode],
    values: NodeValues,
) -> TracedNode:
    """The traced node of ``fx_node``: its kind, row maps, whole runner and stripe kernel."""
    name = fx_node.name
    shape, dtype = values.get(name, (None, None))
    if fx_node.op == "placeholder":
        return TracedNode(name, "input", (), (), shape, dtype, False, _fail_run(name), reason="graph input")
    if fx_node.op == "get_attr":
        value = _fetch_attr(gm, str(fx_node.target))
        if isinstance(value, torch.Tensor):
            shape, dtype = tuple(value.shape), value.dtype
        return TracedNode(name, "const", (), (), shape, dtype, False, lambda _v, value=value: value, reason="constant")
    args = torch.fx.node.map_arg(fx_node.args, lambda n: _Ref(index[n]))
    kwargs = torch.fx.node.map_arg(fx_node.kwargs, lambda n: _Ref(index[n]))
    inputs = tuple(dict.fromkeys(r.index for r in _refs((args, kwargs))))
    site = _Site(name, inputs, nodes, shape, dtype, _whole_runner(gm, fx_node, args, kwargs))
    if fx_node.op == "call_module":
        return _module_node(site, gm.get_submodule(str(fx_node.target)))
    if fx_node.op == "call_function":
        return _function_node(site, fx_node.target, args, kwargs)
    if fx_node.op == "call_method":
        return _method_node(site, str(fx_node.target), args, kwargs)
    raise TradeoffError(f"unsupported fx node {fx_node.op} {fx_node.target}")


def _module_node(site: _Site, mod: nn.Module) -> TracedNode:
    """A ``call_module`` node: a window, pointwise or whole layer by the module's type."""
    shape = site.shape
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
        return _untileable(site, "global_pool", "adaptive pooling reads the full height")
    if isinstance(mod, nn.Linear):
        macs = _macs(mod, shape)
        return _untileable(site, "fc", "fully connected reads the full input", params=params, macs=macs)
    if isinstance(mod, nn.Flatten):
        return _untileable(site, "flatten", "flatten mixes rows")
    if isinstance(mod, nn.BatchNorm2d):
        return _pointwise_module(site, "bn", mod, params)
    if isinstance(mod, POINTWISE_MODULES):
        return _pointwise_module(site, "act", mod, params)
    return _untileable(site, "other", f"{type(mod).__name__} is not known to work by parts", params=params)


_ADDS = (operator.add, operator.iadd, torch.add, operator.sub, operator.isub, torch.sub)
_MULS = (operator.mul, operator.imul, torch.mul, operator.truediv, operator.itruediv, torch.div)


def _function_node(site: _Site, target: Any, args: Any, kwargs: Any) -> TracedNode:
    """A ``call_function`` node: elementwise functions and channel concatenation are
    pointwise; everything else runs whole."""
    if target in POINTWISE_FUNCTIONS:
        op = "add" if target in _ADDS else ("mul" if target in _MULS else "act")
        func = _OUT_OF_PLACE.get(target, target)
        kw = {k: v for k, v in kwargs.items() if k != "inplace"}
        return _pointwise_call(site, op, lambda a, k, func=func: func(*a, **k), args, kw)
    if target is torch.cat:
        dim = kwargs.get("dim", args[1] if len(args) > 1 else 0)
        if site.shape is not None and len(site.shape) == 4 and dim in (1, -3):
            return _pointwise_call(site, "concat", lambda a, k: torch.cat(*a, **k), args, kwargs)
        return _untileable(site, "other", f"concatenation along dim {dim} mixes rows")
    if target in (torch.flatten,):
        return _untileable(site, "flatten", "flatten mixes rows")
    if target in (F.adaptive_avg_pool2d, F.adaptive_max_pool2d):
        return _untileable(site, "global_pool", "adaptive pooling reads the full height")
    return _untileable(site, "other", f"function {getattr(target, '__name__', target)} is not known to work by parts")


def _method_node(site: _Site, method: str, args: Any, kwargs: Any) -> TracedNode:
    """A ``call_method`` node: elementwise tensor methods are pointwise; reshapes and
    means run whole."""
    if method in POINTWISE_METHODS:
        base = method.rstrip("_")
        op = "add" if base in ("add", "sub") else ("mul" if base in ("mul", "div") else "act")
        return _pointwise_call(site, op, lambda a, k, base=base: getattr(a[0], base)(*a[1:], **k), args, dict(kwargs))
    if method in ("flatten", "view", "reshape"):
        return _untileable(site, "flatten", f"{method} mixes rows")
    if method == "mean":
        return _untileable(site, "global_pool", "mean over spatial dimensions reads the full height")
    return _untileable(site, "other", f"method {method} is not known to work by parts")


def _macs(mod: nn.Module, shape: tuple[int, ...] | None) -> int:
    """MACs of ``mod`` producing a tensor of ``shape``, as capture counts a unit's
    (:func:`~layerfit.capture.macs.module_macs`; for convolutions and fully connected
    layers the output decides them)."""
    return module_macs(mod, (), torch.empty(shape, device="meta")) if shape else 0


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
    macs = _macs(mod, shape)
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
