"""How each captured operator runs, whole and in row stripes: the kernels of processing by parts.

A module is seen as layerfit's capture sees it: :func:`~layerfit.capture.capture` (with
torch.fx) records every operator and the shape and dtype of every tensor, and the
capture's tracer (:func:`~layerfit.capture.activations.fx_trace`) gives the same
operators as fx nodes, by name. :func:`cnn_from_module` captures a module,
:func:`cnn_from_graph` reads a stored capture; :func:`layers_of` reads each operator as a
:class:`~layerfit.tradeoff.parts.cnn.Layer` - its kind, its geometry along the height,
whether it can process by parts - and builds the :class:`Kernel` that runs it:

* *window* layers (Conv2d incl. grouped/depthwise/dilated, MaxPool2d, AvgPool2d): output
  row ``o`` reads a window of input rows (Table 2: ``H_min^in = ks``);
* *pointwise* layers (BatchNorm2d in eval mode, activations, dropout in eval mode,
  elementwise ``+ - * /`` incl. residual adds and per-channel gates, channel concat):
  output row ``o`` reads row ``o`` of every input (``H_min^in = 1``);
* everything else (global/adaptive pooling, Linear, flatten, reshapes, unknown
  functions, non-tensor values) has a full-height receptive field as far as we know and
  is marked not tileable: it always runs whole, on whole inputs.

A tileable layer's *stripe kernel* computes output rows ``a..b`` from the input rows
they read, with the same arithmetic as the module: padding rows are materialised only
for phases touching the border, so interior phases pass views of the edge buffers
straight to the operator. Every layer also runs whole through its fx target. Both read
a module's weights when they run, not when they are built, so weights bound into the
module later (the engine binds a unit's by reference, :mod:`layerfit.engine.binding`)
are the ones they use. Operators
run out of place (``inplace`` flags are dropped) because a stripe is a view into a
buffer other consumers still read. Constants (``get_attr`` nodes) are no layers: their
values are bound into the kernels of the layers reading them, and their elements count
as the first such layer's parameters.
"""

from __future__ import annotations

import copy
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

from layerfit.capture import capture
from layerfit.capture.activations import fx_trace
from layerfit.capture.macs import module_macs
from layerfit.errors import CaptureError, TradeoffError
from layerfit.tradeoff.parts.cnn import CNN, Layer
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
WholeKernel = Callable[[list[Any]], Any]
# The shape and dtype of every node whose value is one tensor, by node name.
NodeValues = dict[str, tuple[tuple[int, ...], torch.dtype]]


@dataclass(frozen=True)
class Kernel:
    """How one layer runs: ``whole`` computes its value from its inputs' whole values;
    ``stripe`` (tileable layers) computes output rows ``a..b`` from per-input stripes.
    Both take the values of the layer's inputs in the order of ``Layer.inputs``."""

    whole: WholeKernel
    stripe: StripeKernel | None = None
    dtype: torch.dtype | None = None


@dataclass(frozen=True)
class Runner:
    """What it takes to run a CNN for real: the traced module, the kernel of every layer,
    how the module's result is assembled (the fx output argument with a :class:`Ref` for
    each layer's value) and an example input (empty: none to run it on)."""

    module: torch.fx.GraphModule
    kernels: tuple[Kernel, ...]
    output_arg: Any
    example: tuple[Any, ...] = ()

    @property
    def outputs(self) -> tuple[int, ...]:
        """The layers whose values the module returns."""
        return tuple(dict.fromkeys(r.index for r in refs(self.output_arg)))


def cnn_from_module(name: str, module: Any, *example: Any) -> CNN:
    """The layers of ``module`` (in eval mode) captured at ``example``, with their kernels
    and the example as the CNN's runner, so it can run (by parts) and be timed."""
    if module.training:
        trace(module)  # refuses a module in training mode
    try:
        graph = capture(module, example[0] if len(example) == 1 else tuple(example), method="fx")
    except CaptureError as exc:
        raise TradeoffError(f"cannot capture {type(module).__name__} for processing by parts: {exc}") from exc
    return cnn_from_graph(name, graph, module, example)


def cnn_from_graph(name: str, graph: Any, model: Any, example: tuple[Any, ...] | None = None) -> CNN:
    """Layers from a :class:`~layerfit.capture.graph.ModelGraph` captured with torch.fx.

    Every operator of the graph is a layer, with the shapes the graph recorded and the
    kind and geometry of the module's fx node of its name
    (:func:`layers_of`). The CNN has a runner when
    ``example`` (the input the graph was captured at) is given; otherwise nothing here
    has an input to run it on.
    """
    gm, values = graph_values(graph, model)
    layers, runner = layers_of(gm, values, example or ())
    return CNN(name, tuple(layers), runner=runner if example is not None else None)


def graph_values(graph: ModelGraph, module: nn.Module) -> tuple[torch.fx.GraphModule, NodeValues]:
    """The fx trace of ``module`` and, from ``graph`` (an fx capture of it, whose ops are
    that trace's nodes by name), the shape and dtype of every node's value.

    An op's value is its one output tensor when it has one (the graph does not say
    whether it came in a tuple); graph inputs are matched to the module's inputs in
    order. Raises :class:`TradeoffError` for a hooks capture, which does not record the
    operators between modules (residual adds among them), for a module in training
    mode, and for a graph that is not a capture of ``module``.
    """
    if graph.method != "fx":
        raise TradeoffError(
            f"the graph of {graph.model_type} was captured with {graph.method}: processing by "
            "parts needs every operator (residual adds included), which only an fx capture records"
        )
    gm = trace(module)
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
    return gm, values


def trace(module: nn.Module) -> torch.fx.GraphModule:
    """The capture's fx trace of ``module``, refused in training mode."""
    if module.training:
        raise TradeoffError("put the model in eval mode (model.eval()) before tracing it for processing by parts")
    try:
        return fx_trace(module)
    except Exception as exc:  # fx raises many types for untraceable code
        raise TradeoffError(f"cannot trace {type(module).__name__} with torch.fx: {exc}") from exc


def _value(tensor: TensorRecord) -> tuple[tuple[int, ...], torch.dtype]:
    """Shape and torch dtype of a captured tensor (capture names dtypes ``float32``)."""
    return tuple(tensor.shape), getattr(torch, tensor.dtype)


def layers_of(gm: torch.fx.GraphModule, values: NodeValues, example: tuple[Any, ...] = ()) -> tuple[list[Layer], Runner]:
    """The layers of ``gm`` in order and what runs them; ``values`` gives the tensors' shapes."""
    index: dict[torch.fx.Node, Any] = {}  # a layer's Ref, or a constant's value
    layers: list[Layer] = []
    kernels: list[Kernel] = []
    pending: dict[int, int] = {}  # elements of constants no layer has counted yet, by id
    output_arg: Any = None
    for fx_node in gm.graph.nodes:
        if fx_node.op == "output":
            output_arg = torch.fx.node.map_arg(fx_node.args[0], lambda n: index[n])
        elif fx_node.op == "get_attr":
            value = _fetch_attr(gm, str(fx_node.target))
            index[fx_node] = value
            if isinstance(value, torch.Tensor):
                pending[id(value)] = value.numel()
        else:
            layer, kernel = _classify(gm, fx_node, index, layers, values, pending)
            index[fx_node] = Ref(len(layers))
            layers.append(layer)
            kernels.append(kernel)
    return layers, Runner(gm, tuple(kernels), output_arg, tuple(example))


@dataclass(frozen=True)
class Ref:
    """Placeholder for "the value of layer ``index``" inside reconstructed arguments."""

    index: int


@dataclass(frozen=True)
class _Rows:
    """A constant with the output's height inside a stripe kernel's arguments: a phase
    reads its rows ``a..b``."""

    value: torch.Tensor


@dataclass(frozen=True)
class _Site:
    """What every layer builder needs: name, inputs (layer indices), the shapes of the
    layers so far, output shape and dtype, the whole runner, and the tensors of
    constants read (with the parameter elements first counted here)."""

    name: str
    inputs: tuple[int, ...]
    layers: list[Layer]
    shape: tuple[int, ...] | None
    dtype: torch.dtype | None
    run: WholeKernel
    constants: tuple[torch.Tensor, ...] = ()
    const_params: int = 0

    def layer(self, op: str, tileable: bool, reason: str = "", params: int = 0, macs: int = 0, **geometry: int) -> Layer:
        return Layer(
            name=self.name,
            op=op,
            inputs=tuple(self.layers[i].name for i in self.inputs),
            shape=tuple(self.shape) if self.shape is not None else (),
            params=params + self.const_params,
            macs=macs,
            tileable=tileable,
            reason=reason,
            **geometry,
        )

    def kernel(self, stripe: StripeKernel | None = None) -> Kernel:
        return Kernel(self.run, stripe, self.dtype)

    def spatial_input(self) -> Layer | None:
        if len(self.inputs) != 1 or not self.layers[self.inputs[0]].is_spatial:
            return None
        return self.layers[self.inputs[0]]

    @property
    def is_spatial(self) -> bool:
        return self.shape is not None and len(self.shape) == 4


def refs(arg: Any) -> list[Ref]:
    """The :class:`Ref` leaves of a nested argument, in order."""
    return [a for a in tree_leaves(arg) if isinstance(a, Ref)]


def substitute(arg: Any, values: Callable[[int], Any]) -> Any:
    """Replace every :class:`Ref` in a nested argument by ``values(index)``."""
    if isinstance(arg, Ref):
        return values(arg.index)
    if isinstance(arg, tuple):
        return tuple(substitute(a, values) for a in arg)
    if isinstance(arg, list):
        return [substitute(a, values) for a in arg]
    if isinstance(arg, dict):
        return {k: substitute(v, values) for k, v in arg.items()}
    return arg


def _constants(arg: Any) -> list[torch.Tensor]:
    """The constant tensors (values of ``get_attr`` nodes) in a nested argument."""
    return [a for a in tree_leaves(arg) if isinstance(a, torch.Tensor)]


def _pair(value: Any) -> tuple[int, int]:
    if isinstance(value, (tuple, list)):
        return (int(value[0]), int(value[-1]))
    return (int(value), int(value))


def _classify(
    gm: torch.fx.GraphModule,
    fx_node: torch.fx.Node,
    index: dict[torch.fx.Node, Any],
    layers: list[Layer],
    values: NodeValues,
    pending: dict[int, int],
) -> tuple[Layer, Kernel]:
    """The layer of ``fx_node``: its kind, geometry, whole runner and stripe kernel."""
    name = fx_node.name
    shape, dtype = values.get(name, (None, None))
    if fx_node.op == "placeholder":
        site = _Site(name, (), layers, shape, dtype, _fail_run(name))
        return site.layer("input", False, "graph input"), site.kernel()
    args = torch.fx.node.map_arg(fx_node.args, lambda n: index[n])
    kwargs = torch.fx.node.map_arg(fx_node.kwargs, lambda n: index[n])
    inputs = tuple(dict.fromkeys(r.index for r in refs((args, kwargs))))
    constants = tuple(_constants((args, kwargs)))
    counted = sum(pending.pop(id(t), 0) for t in constants)
    site = _Site(name, inputs, layers, shape, dtype, _whole_runner(gm, fx_node, args, kwargs), constants, counted)
    if fx_node.op == "call_module":
        return _module_node(site, gm.get_submodule(str(fx_node.target)))
    if fx_node.op == "call_function":
        return _function_node(site, fx_node.target, args, kwargs)
    if fx_node.op == "call_method":
        return _method_node(site, str(fx_node.target), args, kwargs)
    raise TradeoffError(f"unsupported fx node {fx_node.op} {fx_node.target}")


def _module_node(site: _Site, mod: nn.Module) -> tuple[Layer, Kernel]:
    """A ``call_module`` node: a window, pointwise or whole layer by the module's type."""
    params = sum(p.numel() for p in mod.parameters(recurse=False)) + sum(b.numel() for b in mod.buffers(recurse=False))
    if isinstance(mod, nn.Conv2d):
        return _conv_node(site, mod, params)
    if isinstance(mod, nn.MaxPool2d):
        return _maxpool_node(site, mod)
    if isinstance(mod, nn.AvgPool2d):
        return _avgpool_node(site, mod)
    if isinstance(mod, (nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d)):
        return _untileable(site, "global_pool", "adaptive pooling reads the full height")
    if isinstance(mod, nn.Linear):
        macs = _macs(mod, site.shape)
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


def _function_node(site: _Site, target: Any, args: Any, kwargs: Any) -> tuple[Layer, Kernel]:
    """A ``call_function`` node: elementwise functions and channel concatenation are
    pointwise; everything else runs whole."""
    if target in POINTWISE_FUNCTIONS:
        op = "add" if target in _ADDS else ("mul" if target in _MULS else "act")
        func = _OUT_OF_PLACE.get(target, target)
        kw = {k: v for k, v in kwargs.items() if k != "inplace"}
        return _pointwise_call(site, op, lambda a, k, func=func: func(*a, **k), args, kw)
    if target is torch.cat:
        dim = kwargs.get("dim", args[1] if len(args) > 1 else 0)
        if site.is_spatial and dim in (1, -3):
            return _pointwise_call(site, "concat", lambda a, k: torch.cat(*a, **k), args, kwargs)
        return _untileable(site, "other", f"concatenation along dim {dim} mixes rows")
    if target in (torch.flatten,):
        return _untileable(site, "flatten", "flatten mixes rows")
    if target in (F.adaptive_avg_pool2d, F.adaptive_max_pool2d):
        return _untileable(site, "global_pool", "adaptive pooling reads the full height")
    return _untileable(site, "other", f"function {getattr(target, '__name__', target)} is not known to work by parts")


def _method_node(site: _Site, method: str, args: Any, kwargs: Any) -> tuple[Layer, Kernel]:
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


def _fail_run(name: str) -> WholeKernel:
    def run(_values: list[Any]) -> Any:
        raise TradeoffError(f"graph input {name!r} has no value")

    return run


def _whole_runner(gm: torch.fx.GraphModule, fx_node: torch.fx.Node, args: Any, kwargs: Any) -> WholeKernel:
    """Run the fx node on whole values, out of place. ``values`` are indexed like its inputs."""
    slot = {idx: k for k, idx in enumerate(dict.fromkeys(r.index for r in refs((args, kwargs))))}
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


def _conv_node(site: _Site, mod: nn.Conv2d, params: int) -> tuple[Layer, Kernel]:
    src = site.spatial_input()
    kh, kw = mod.kernel_size
    sh, sw = mod.stride
    dh, dw = mod.dilation
    common = dict(params=params, macs=_macs(mod, site.shape), kernel=kh, stride=sh, dilation=dh)
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
    if src is None or not site.is_spatial:
        return _untileable(site, "conv", "input is not [N, C, H, W]", **common)
    rmap = RowMap("window", src.rows, window_extent(kh, dh), sh, ph)
    weights, groups = mod._parameters, mod.groups  # read at each call: the weights bound now

    def op(x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, weights["weight"], weights["bias"], (sh, sw), (0, pw), (dh, dw), groups)

    return site.layer("conv", True, padding=ph, **common), site.kernel(_window_stripe(rmap, 0.0, op))


def _maxpool_node(site: _Site, mod: nn.MaxPool2d) -> tuple[Layer, Kernel]:
    src = site.spatial_input()
    kh, kw = _pair(mod.kernel_size)
    sh, sw = _pair(mod.stride if mod.stride is not None else mod.kernel_size)
    ph, pw = _pair(mod.padding)
    dh, dw = _pair(mod.dilation)
    geometry = dict(kernel=kh, stride=sh, padding=ph, dilation=dh)
    if src is None or mod.return_indices or not site.is_spatial:
        return _untileable(site, "pool", "pooling with indices or non-4D input", **geometry)
    rmap = RowMap("window", src.rows, window_extent(kh, dh), sh, ph)
    ceil = mod.ceil_mode

    def op(x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(x, (kh, kw), (sh, sw), (0, pw), (dh, dw), ceil)

    return site.layer("pool", True, **geometry), site.kernel(_window_stripe(rmap, -math.inf, op))


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


def _avgpool_node(site: _Site, mod: nn.AvgPool2d) -> tuple[Layer, Kernel]:
    src = site.spatial_input()
    kh, kw = _pair(mod.kernel_size)
    sh, sw = _pair(mod.stride if mod.stride is not None else mod.kernel_size)
    ph, pw = _pair(mod.padding)
    geometry = dict(kernel=kh, stride=sh, padding=ph, dilation=1)
    if src is None or site.shape is None or not site.is_spatial:
        return _untileable(site, "pool", "non-4D input", **geometry)
    shape = site.shape
    rmap = RowMap("window", src.rows, kh, sh, ph)
    ceil = mod.ceil_mode
    override = mod.divisor_override
    if override:
        divisors: torch.Tensor | None = None
    else:
        dh = avgpool_divisors(src.rows, shape[2], kh, sh, ph, mod.count_include_pad)
        dwv = avgpool_divisors(src.shape[3], shape[3], kw, sw, pw, mod.count_include_pad)
        divisors = torch.tensor([[a * b for b in dwv] for a in dh], dtype=site.dtype)

    def op(x: torch.Tensor) -> torch.Tensor:
        return F.avg_pool2d(x, (kh, kw), (sh, sw), (0, pw), ceil, True, 1)

    window = _window_stripe(rmap, 0.0, op)

    def stripe(values: list[Any], a: int, b: int) -> torch.Tensor:
        sums = window(values, a, b)
        if divisors is None:
            return sums / override
        return sums / divisors[a : b + 1]

    return site.layer("pool", True, **geometry), site.kernel(stripe)


def _untileable(site: _Site, op: str, reason: str, **extra: Any) -> tuple[Layer, Kernel]:
    return site.layer(op, False, reason, **extra), site.kernel()


def _pointwise_module(site: _Site, op: str, mod: nn.Module, params: int) -> tuple[Layer, Kernel]:
    src = site.spatial_input()
    if src is None or site.shape is None or not site.is_spatial or src.rows != site.shape[2]:
        return _untileable(site, op, "input is not [N, C, H, W]", params=params)
    mod = _out_of_place_module(mod)
    forward = mod.forward  # the module's own arithmetic, without the hook machinery per phase
    if isinstance(mod, nn.BatchNorm2d) and mod.running_mean is not None:
        # what F.batch_norm calls in eval mode, minus its Python-level checks
        weights, stats, eps = mod._parameters, mod._buffers, mod.eps

        def stripe(values: list[Any], a: int, b: int) -> torch.Tensor:
            return torch.batch_norm(
                values[0], weights["weight"], weights["bias"], stats["running_mean"], stats["running_var"],
                False, 0.0, eps, torch.backends.cudnn.enabled,
            )

    else:

        def stripe(values: list[Any], a: int, b: int) -> torch.Tensor:
            return forward(values[0])

    return site.layer(op, True, params=params), site.kernel(stripe)


def _pointwise_call(
    site: _Site, op: str, call: Callable[[Any, Any], torch.Tensor], args: Any, kwargs: Any
) -> tuple[Layer, Kernel]:
    """Elementwise function of several inputs: identity maps, or broadcast for 1-row inputs
    (constants with the output's height are read by rows too)."""
    if site.shape is None or not site.is_spatial:
        return _untileable(site, op, "output is not [N, C, H, W]")
    rows = site.shape[2]
    shapes = [site.layers[i].shape for i in site.inputs] + [tuple(t.shape) for t in site.constants]
    for shape in shapes:
        spatial = len(shape) == 4
        if not spatial and len(shape) > 1 and math.prod(shape) > 1:
            return _untileable(site, op, "broadcast of a non-4D tensor")
        if spatial and shape[2] not in (rows, 1):
            return _untileable(site, op, "inputs of different heights")
    slot = {idx: k for k, idx in enumerate(site.inputs)}
    by_rows = {id(t) for t in site.constants if t.dim() == 4 and t.shape[2] == rows and rows > 1}
    if by_rows:  # a constant read by rows: each phase narrows it to its rows
        args, kwargs = _bind_rows(args, by_rows), _bind_rows(kwargs, by_rows)

    def stripe(values: list[Any], a: int, b: int) -> torch.Tensor:
        def get(i: int) -> Any:
            return values[slot[i]]

        if by_rows:
            return call(_narrowed(substitute(args, get), a, b), _narrowed(substitute(kwargs, get), a, b))
        return call(substitute(args, get), substitute(kwargs, get))

    return site.layer(op, True), site.kernel(stripe)


def _bind_rows(arg: Any, by_rows: set[int]) -> Any:
    """``arg`` with each constant of ``by_rows`` (by id) wrapped as :class:`_Rows`."""
    return tree_map(lambda t: _Rows(t) if isinstance(t, torch.Tensor) and id(t) in by_rows else t, arg)


def _narrowed(arg: Any, a: int, b: int) -> Any:
    """``arg`` with rows ``a..b`` of every :class:`_Rows` constant in place of it."""
    return tree_map(lambda r: r.value.narrow(2, a, b - a + 1) if isinstance(r, _Rows) else r, arg)
