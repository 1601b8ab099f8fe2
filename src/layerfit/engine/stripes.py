"""A unit executed in row stripes: processing by parts (Minakova & Stefanov) as the engine runs it.

The engine runs a unit whole (its module's forward) or, here, in horizontal row stripes:
each captured operator (an fx node of the capture's trace, :mod:`layerfit.capture`) is
read as an :class:`Operator` - its kind, its geometry along the height, whether it can
run in stripes - with the :class:`Kernel` that runs it:

* *window* operators (Conv2d incl. grouped/depthwise/dilated, MaxPool2d, AvgPool2d):
  output row ``o`` reads a window of input rows (Table 2: ``H_min^in = ks``);
* *pointwise* operators (BatchNorm2d in eval mode, activations, dropout in eval mode,
  elementwise ``+ - * /`` incl. residual adds and per-channel gates, channel concat):
  output row ``o`` reads row ``o`` of every input (``H_min^in = 1``);
* everything else (global/adaptive pooling, Linear, flatten, reshapes, unknown
  functions, non-tensor values) has a full-height receptive field as far as we know and
  runs whole, on whole inputs.

A stripe kernel computes output rows ``a..b`` from the input rows they read, with the
same arithmetic as the module: padding rows are materialised only for phases touching
the border, so interior phases pass views of the row buffers straight to the operator.
Every operator also runs whole through its fx target. Both read a module's weights
when they run, so the weights the engine binds by reference (:mod:`layerfit.engine.binding`)
are the ones they use. Operators run out of place (``inplace`` flags are dropped)
because a stripe is a view into a buffer other consumers still read. Constants
(``get_attr`` nodes) are no operators: their values are bound into the kernels reading
them, and their elements count as the first such operator's parameters.

:func:`run_stripes` executes a :class:`StripeSchedule` (which operator produces which
rows at each step, and the row buffers' sizes: the decision is the caller's,
:func:`layerfit.tradeoff.parts.flow.plan_rows`). The tensor between two operators run in
stripes lives in a :class:`RowBuffer` holding only the rows a consumer may still read;
the run's ledger (:class:`RunStats`) counts every buffer from allocation until its last
reader ran (row buffers at capacity, whole intermediate tensors at full size; the
caller's inputs and outputs, the one-phase result and border phases' padded stripes are
not counted).

On an engine, the phases of neighbouring operators interleave ("unit 1 runs inside unit
0"), and a stripe kernel calls no hook, so the units of a chain of operators run in
stripes are bound as one for the span of steps their phases take (:func:`held_spans`,
:meth:`KernelStage.hold <layerfit.engine.kernels.KernelStage.hold>`): they are waited
for and bound before its first phase and released after its last, under any policy
whose gates let a unit be read while the one before it still runs, and when the ring
holds them at once. Operators run whole call their modules, whose hooks bind their
units as in any pass.
"""

from __future__ import annotations

import copy
import math
import operator
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_leaves, tree_map

from layerfit.capture.macs import module_macs
from layerfit.errors import BudgetError, LayerfitError, TradeoffError

if TYPE_CHECKING:
    from layerfit.engine.stream import UnitStream

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
    """How one operator runs: ``whole`` computes its value from its inputs' whole values;
    ``stripe`` (operators that run in stripes) computes output rows ``a..b`` from
    per-input stripes. Both take the values of its inputs in the order of ``Operator.inputs``."""

    whole: WholeKernel
    stripe: StripeKernel | None = None
    dtype: torch.dtype | None = None


@dataclass(frozen=True)
class Runner:
    """What it takes to run a traced module by operators: the trace, the kernel of every
    operator, how the module's result is assembled (the fx output argument with a
    :class:`Ref` for each operator's value) and an example input (empty: none to run it on)."""

    module: torch.fx.GraphModule
    kernels: tuple[Kernel, ...]
    output_arg: Any
    example: tuple[Any, ...] = ()

    @property
    def outputs(self) -> tuple[int, ...]:
        """The operators whose values the module returns."""
        return tuple(dict.fromkeys(r.index for r in refs(self.output_arg)))


def operators_of(
    gm: torch.fx.GraphModule, values: NodeValues, example: tuple[Any, ...] = ()
) -> tuple[list[Operator], Runner]:
    """The operators of ``gm`` in order and what runs them; ``values`` gives the shape and
    dtype of each node's tensor (the capture's records, by node name)."""
    index: dict[torch.fx.Node, Any] = {}  # an operator's Ref, or a constant's value
    layers: list[Operator] = []
    kernels: list[Kernel] = []
    pending: dict[int, int] = {}  # elements of constants no operator has counted yet, by id
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
class Operator:
    """One captured operator as stripes run it: its kind, its geometry along the height
    (kernel, stride, top padding, dilation), the operators it reads (by index), the shape
    of the tensor it produces, its parameter elements and MACs, whether it can run in
    stripes and, if not, why.

    It is also a layer of the application model of processing by parts
    (:class:`~layerfit.tradeoff.parts.cnn.CNN`, the paper's ``l_i = (op_i, hyp_i,
    par_i)``), where a hand-written layer may name its inputs (its CNN resolves them to
    indices) and leave ``tileable`` None: decided by its kind."""

    name: str
    kind: str
    inputs: tuple[int, ...] = ()
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
        """Height of the output (1 for data without a height)."""
        return self.shape[2] if self.is_spatial else 1

    @property
    def elems(self) -> int:
        """Elements of the output (``|e.data|``)."""
        return math.prod(self.shape) if self.shape else 0

    @property
    def row_elems(self) -> int:
        return self.elems // self.rows


@dataclass(frozen=True)
class Ref:
    """Placeholder for "the value of operator ``index``" inside reconstructed arguments."""

    index: int


@dataclass(frozen=True)
class _Rows:
    """A constant with the output's height inside a stripe kernel's arguments: a phase
    reads its rows ``a..b``."""

    value: torch.Tensor


@dataclass(frozen=True)
class _Site:
    """What every operator builder needs: name, inputs (operator indices), the
    operators so far, output shape and dtype, the whole runner, and the tensors of
    constants read (with the parameter elements first counted here)."""

    name: str
    inputs: tuple[int, ...]
    layers: list[Operator]
    shape: tuple[int, ...] | None
    dtype: torch.dtype | None
    run: WholeKernel
    constants: tuple[torch.Tensor, ...] = ()
    const_params: int = 0

    def operator(
        self, kind: str, tileable: bool, reason: str = "", params: int = 0, macs: int = 0, **geometry: int
    ) -> Operator:
        return Operator(
            name=self.name,
            kind=kind,
            inputs=self.inputs,
            shape=tuple(self.shape) if self.shape is not None else (),
            params=params + self.const_params,
            macs=macs,
            tileable=tileable,
            reason=reason,
            **geometry,
        )

    def kernel(self, stripe: StripeKernel | None = None) -> Kernel:
        return Kernel(self.run, stripe, self.dtype)

    def spatial_input(self) -> Operator | None:
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
    layers: list[Operator],
    values: NodeValues,
    pending: dict[int, int],
) -> tuple[Operator, Kernel]:
    """The operator of ``fx_node``: its kind, geometry, whole runner and stripe kernel."""
    name = fx_node.name
    shape, dtype = values.get(name, (None, None))
    if fx_node.op == "placeholder":
        site = _Site(name, (), layers, shape, dtype, _fail_run(name))
        return site.operator("input", False, "graph input"), site.kernel()
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


def _module_node(site: _Site, mod: nn.Module) -> tuple[Operator, Kernel]:
    """A ``call_module`` node: a window, pointwise or whole operator by the module's type."""
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


def _function_node(site: _Site, target: Any, args: Any, kwargs: Any) -> tuple[Operator, Kernel]:
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


def _method_node(site: _Site, method: str, args: Any, kwargs: Any) -> tuple[Operator, Kernel]:
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


def window_extent(kernel: int, dilation: int = 1) -> int:
    """Rows spanned by a kernel of ``kernel`` taps spaced ``dilation`` apart (Table 2's
    ``H_min^in`` of a window operator)."""
    return dilation * (kernel - 1) + 1


def _window_stripe(
    in_rows: int, extent: int, stride: int, pad: int, fill: float, op: Callable[[torch.Tensor], torch.Tensor]
) -> StripeKernel:
    """Kernel for a window operator reading ``extent`` rows every ``stride`` from top
    padding ``pad``: pad the stripe at the borders, run ``op`` unpadded in H."""

    def stripe(values: list[Any], a: int, b: int) -> torch.Tensor:
        lo_u, hi_u = a * stride - pad, b * stride - pad + extent - 1
        lo, hi = max(lo_u, 0), min(hi_u, in_rows - 1)
        view = values[0]
        if lo > hi:  # the window lies wholly in padding
            n, c, _, w = view.shape
            return op(view.new_full((n, c, hi_u - lo_u + 1, w), fill))
        return op(assemble(view, lo - lo_u, hi_u - hi, fill))

    return stripe


def _conv_node(site: _Site, mod: nn.Conv2d, params: int) -> tuple[Operator, Kernel]:
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
    window = (src.rows, window_extent(kh, dh), sh, ph)
    weights, groups = mod._parameters, mod.groups  # read at each call: the weights bound now

    def op(x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, weights["weight"], weights["bias"], (sh, sw), (0, pw), (dh, dw), groups)

    return site.operator("conv", True, padding=ph, **common), site.kernel(_window_stripe(*window, 0.0, op))


def _maxpool_node(site: _Site, mod: nn.MaxPool2d) -> tuple[Operator, Kernel]:
    src = site.spatial_input()
    kh, kw = _pair(mod.kernel_size)
    sh, sw = _pair(mod.stride if mod.stride is not None else mod.kernel_size)
    ph, pw = _pair(mod.padding)
    dh, dw = _pair(mod.dilation)
    geometry = dict(kernel=kh, stride=sh, padding=ph, dilation=dh)
    if src is None or mod.return_indices or not site.is_spatial:
        return _untileable(site, "pool", "pooling with indices or non-4D input", **geometry)
    window = (src.rows, window_extent(kh, dh), sh, ph)
    ceil = mod.ceil_mode

    def op(x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(x, (kh, kw), (sh, sw), (0, pw), (dh, dw), ceil)

    return site.operator("pool", True, **geometry), site.kernel(_window_stripe(*window, -math.inf, op))


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


def _avgpool_node(site: _Site, mod: nn.AvgPool2d) -> tuple[Operator, Kernel]:
    src = site.spatial_input()
    kh, kw = _pair(mod.kernel_size)
    sh, sw = _pair(mod.stride if mod.stride is not None else mod.kernel_size)
    ph, pw = _pair(mod.padding)
    geometry = dict(kernel=kh, stride=sh, padding=ph, dilation=1)
    if src is None or site.shape is None or not site.is_spatial:
        return _untileable(site, "pool", "non-4D input", **geometry)
    shape = site.shape
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

    window = _window_stripe(src.rows, kh, sh, ph, 0.0, op)

    def stripe(values: list[Any], a: int, b: int) -> torch.Tensor:
        sums = window(values, a, b)
        if divisors is None:
            return sums / override
        return sums / divisors[a : b + 1]

    return site.operator("pool", True, **geometry), site.kernel(stripe)


def _untileable(site: _Site, op: str, reason: str, **extra: Any) -> tuple[Operator, Kernel]:
    return site.operator(op, False, reason, **extra), site.kernel()


def _pointwise_module(site: _Site, op: str, mod: nn.Module, params: int) -> tuple[Operator, Kernel]:
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

    return site.operator(op, True, params=params), site.kernel(stripe)


def _pointwise_call(
    site: _Site, op: str, call: Callable[[Any, Any], torch.Tensor], args: Any, kwargs: Any
) -> tuple[Operator, Kernel]:
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

    return site.operator(op, True), site.kernel(stripe)


def _bind_rows(arg: Any, by_rows: set[int]) -> Any:
    """``arg`` with each constant of ``by_rows`` (by id) wrapped as :class:`_Rows`."""
    return tree_map(lambda t: _Rows(t) if isinstance(t, torch.Tensor) and id(t) in by_rows else t, arg)


def _narrowed(arg: Any, a: int, b: int) -> Any:
    """``arg`` with rows ``a..b`` of every :class:`_Rows` constant in place of it."""
    return tree_map(lambda r: r.value.narrow(2, a, b - a + 1) if isinstance(r, _Rows) else r, arg)


class RowBuffer:
    """A buffer of ``capacity`` rows holding a contiguous window of a tensor's rows.

    Rows are appended in order and released from the front; the window is kept
    contiguous in memory (shifted to the front when it reaches the end) so a consumer
    always receives a view, never a gathered copy.
    """

    def __init__(self, capacity: int, like: torch.Tensor) -> None:
        n, c, _, w = like.shape
        self.capacity = capacity
        self.storage = like.new_empty((n, c, capacity, w))
        self.lo = 0  # first row held
        self.hi = 0  # one past the last row written
        self.phys = 0  # storage row of row ``lo``
        self.keep_from = 0  # rows below this are released (and not stored when written)
        self.high_water = 0  # most rows ever held at once

    @property
    def nbytes(self) -> int:
        return self.storage.numel() * self.storage.element_size()

    def release(self, row: int) -> None:
        """Rows below ``row`` will not be read again."""
        if row <= self.keep_from:
            return
        self.keep_from = row
        new_lo = min(max(self.lo, row), self.hi)
        self.phys += new_lo - self.lo
        self.lo = new_lo
        if self.lo == self.hi:
            self.phys = 0

    def write(self, first: int, data: torch.Tensor) -> None:
        """Append rows ``first .. first + data.shape[2] - 1`` (``first`` is the next row)."""
        if first != self.hi:
            raise RuntimeError(f"rows must be written in order: expected row {self.hi}, got {first}")
        rows = data.shape[2]
        skip = self.keep_from - first
        if skip > 0:  # leading rows nobody reads: do not store them
            skip = min(skip, rows)
            self.hi += skip
            self.lo = max(self.lo, min(self.keep_from, self.hi))
            if self.lo == self.hi:
                self.phys = 0
            rows -= skip
            if rows == 0:
                return
            data = data.narrow(2, skip, rows)
        held = self.hi - self.lo
        if held + rows > self.capacity:
            raise RuntimeError(
                f"row buffer overflow: {held} rows held + {rows} new > capacity {self.capacity}"
            )
        if self.phys + held + rows > self.capacity:
            self._compact()
        self.storage.narrow(2, self.phys + held, rows).copy_(data)
        self.hi += rows
        if held + rows > self.high_water:
            self.high_water = held + rows

    def skip_to(self, row: int) -> None:
        """Rows below ``row`` were never produced because no consumer reads them."""
        if self.hi < row:  # then every held row is below the release point too
            self.release(row)
            self.lo = self.hi = row
            self.phys = 0

    def _compact(self) -> None:
        held, shift = self.hi - self.lo, self.phys
        for start in range(0, held, shift):  # chunks no longer than the shift never overlap
            stop = min(start + shift, held)
            self.storage[:, :, start:stop].copy_(self.storage[:, :, start + shift : stop + shift])
        self.phys = 0

    def view(self, lo: int, hi: int) -> torch.Tensor:
        """Rows ``lo..hi`` (inclusive) as a view; an empty view when ``lo > hi``."""
        if lo > hi:
            return self.storage[:, :, 0:0]
        if lo < self.lo or hi >= self.hi:
            raise RuntimeError(f"rows {lo}..{hi} not held (holding {self.lo}..{self.hi - 1})")
        return self.storage.narrow(2, self.phys + lo - self.lo, hi - lo + 1)


@dataclass
class RunStats:
    """What one run held and did: its ledger of edge buffers.

    ``live_bytes``: bytes of edge buffers alive now; ``peak_bytes``: the most alive at
    once; ``buffer_bytes``: bytes allocated per buffered tensor (row buffers at capacity,
    whole tensors at full size); ``high_water_rows``: most rows each row buffer held;
    ``node_seconds``: time spent in each node's phases (filled when profiling).
    """

    peak_bytes: int = 0
    buffer_bytes: dict[str, int] = field(default_factory=dict)
    high_water_rows: dict[str, int] = field(default_factory=dict)
    node_seconds: dict[str, float] = field(default_factory=dict)
    phases: int = 0
    live_bytes: int = 0

    def hold(self, name: str, nbytes: int) -> None:
        """The buffer of tensor ``name`` (``nbytes``) is allocated."""
        self.buffer_bytes[name] = nbytes
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def free(self, nbytes: int) -> None:
        self.live_bytes -= nbytes



# Per input slot of an operator run in stripes: (input, code, extent, stride, pad_top,
# in_rows, first reading row); code 1 = read a window by parts, 0 = read every row at
# once, 2 = broadcast row 0. The first reading row is the first output row whose window
# reaches a real input row, ceil((pad_top - extent + 1) / stride): rows before it read
# only the top padding.
Slot = tuple[int, int, int, int, int, int, int]


def slot_reads(slot: Slot, a: int, b: int) -> tuple[int, int]:
    """Rows ``[lo, hi]`` of the slot's input that the phase producing rows ``a..b`` reads:
    the window clipped to the input (``lo > hi`` when it lies wholly in padding), every row
    (read at once) or row 0 (broadcast)."""
    _, code, extent, stride, pad, in_rows, _ = slot
    if code == 2:
        return 0, 0
    if code == 0:
        return 0, in_rows - 1
    lo, hi = a * stride - pad, b * stride - pad + extent - 1
    return (lo if lo > 0 else 0), (hi if hi < in_rows else in_rows - 1)


def release_point(slot: Slot, produced: int, rows: int) -> int:
    """Rows of the slot's input below this index are read no more by its reader, which
    has produced ``produced`` of its ``rows`` rows; ``in_rows`` means "nothing more"."""
    _, code, _, stride, pad, in_rows, first = slot
    if produced >= rows:
        return in_rows
    if code != 1:  # read at once (or a broadcast row): everything until done
        return 0
    row = (produced if produced > first else first) * stride - pad
    return 0 if row < 0 else (in_rows if row > in_rows else row)


@dataclass(frozen=True)
class StripeSchedule:
    """What a run in stripes executes, per node (an operator; the first ``external`` are
    the caller's inputs): its kernel, name, shape, inputs (earlier nodes), rows, whether
    it runs in stripes and whether its tensor is buffered for readers (not an output or
    input, read by someone); ``outputs`` are returned. ``steps[s] = (node, a, b)``: step
    ``s`` produces rows ``a..b`` of ``node``; ``buffer_rows`` sizes each row buffer;
    ``last_read`` is the step of each tensor's last read; ``slots`` what each phase reads
    and ``readers`` who reads each node (:data:`Slot`)."""

    kernels: tuple[Kernel, ...]
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    inputs: tuple[tuple[int, ...], ...]
    rows: tuple[int, ...]
    external: int
    outputs: tuple[int, ...]
    keeps: tuple[bool, ...]
    by_parts: tuple[bool, ...]
    steps: tuple[tuple[int, int, int], ...]
    buffer_rows: tuple[int, ...]
    last_read: tuple[int, ...]
    slots: tuple[tuple[Slot, ...], ...]
    readers: tuple[tuple[tuple[int, Slot], ...], ...]


@dataclass(frozen=True)
class Holds:
    """Units bound as one by a run in stripes on ``stream``: ``begin[s]`` are held from
    step ``s``, and let go after each step of ``end``."""

    stream: UnitStream
    begin: dict[int, range]
    end: frozenset[int]


@torch.no_grad()
def run_stripes(
    schedule: StripeSchedule, inputs: Sequence[Any], out: Sequence[torch.Tensor] | None = None,
    profile: bool = False, holds: Holds | None = None,
) -> tuple[list[Any], RunStats]:
    """Run ``schedule`` on ``inputs`` (its external nodes' values, in order): the values of
    its outputs, in order, and the run's ledger. ``out`` optionally supplies tensors to
    write the outputs into; ``profile`` records the seconds of each node's phases
    (``node_seconds``); ``holds`` binds units of an engine as one around their steps."""
    run = _Run(schedule, inputs, out)
    timers = run.execute(profile, holds)
    stats = run.stats
    stats.phases = len(schedule.steps)
    stats.node_seconds = {schedule.names[k]: t for k, t in timers.items()}
    return [run.values[o] for o in schedule.outputs], stats


class _Run:
    """The state of one :func:`run_stripes`: every node's whole value or row buffer, the
    rows it has produced, and the bytes its buffers hold (``stats``, the ledger)."""

    def __init__(self, schedule: StripeSchedule, inputs: Sequence[Any], out: Sequence[torch.Tensor] | None) -> None:
        count = len(schedule.names)
        self.schedule = schedule
        self.values: list[Any] = [None] * count  # whole values (inputs, whole outputs, results)
        self.buffers: list[RowBuffer | None] = [None] * count
        self.produced = [0] * count
        self.held = [0] * count  # bytes counted in the ledger for this tensor
        self.stats = RunStats()
        self.out = out
        self.out_slot = {o: j for j, o in enumerate(schedule.outputs)}
        self.is_output = [k in self.out_slot for k in range(count)]
        self.unique_inputs = [tuple(dict.fromkeys(ins)) for ins in schedule.inputs]
        for k, value in enumerate(inputs):
            self.values[k] = value
            self.produced[k] = schedule.rows[k]
        self.device = next((v.device for v in inputs if isinstance(v, torch.Tensor)), torch.device("cpu"))

    def execute(self, profile: bool, holds: Holds | None) -> dict[int, float]:
        """Run every step of the schedule; returns the seconds per node when ``profile``.

        One loop over locals: it runs once per phase of every node, and its bookkeeping
        is the overhead processing by parts adds to the operators.
        """
        schedule = self.schedule
        by_parts, last_read, reads_of = schedule.by_parts, schedule.last_read, schedule.slots
        is_output, unique_inputs, n_in = self.is_output, self.unique_inputs, schedule.external
        values, buffers, produced, held = self.values, self.buffers, self.produced, self.held
        rows_of, oldest, store, whole = self.rows_of, self.oldest, self._store, self._whole
        stripes = [kernel.stripe for kernel in schedule.kernels]
        begin, end = (holds.begin, holds.end) if holds is not None else ({}, frozenset())
        timers: dict[int, float] = {}
        for step, (k, a, b) in enumerate(schedule.steps):
            if k < n_in:
                continue
            if step in begin:
                holds.stream.kernels.hold(begin[step])  # type: ignore[union-attr]
            start = time.perf_counter() if profile else 0.0
            if not by_parts[k]:
                whole(k)
            elif is_output[k] or b >= oldest(k):
                args = []
                for slot in reads_of[k]:
                    i = slot[0]
                    if slot[1] != 1:  # a broadcast row (a by-parts node reads no input whole)
                        args.append(values[i] if buffers[i] is None else rows_of(i, 0, 0))
                    else:
                        args.append(rows_of(i, *slot_reads(slot, a, b)))
                store(k, a, stripes[k](args, a, b))  # type: ignore[misc]
            elif buffers[k] is not None:
                buffers[k].skip_to(b + 1)  # type: ignore[union-attr]
            produced[k] = b + 1
            if profile:
                timers[k] = timers.get(k, 0.0) + time.perf_counter() - start
            # Release what no consumer reads any more; free tensors after their last read.
            for i in unique_inputs[k]:
                buf = buffers[i]
                if buf is not None:
                    buf.release(oldest(i))
                if last_read[i] == step and held[i]:
                    self._free(i, buf)
            if step in end:
                holds.stream.kernels.let_go()  # type: ignore[union-attr]
        return timers

    def rows_of(self, i: int, lo: int, hi: int) -> Any:
        """Rows ``lo..hi`` of node ``i``'s tensor, from its row buffer or its whole value."""
        if lo > hi:  # a phase reading only padding: an empty stripe of the right shape
            shape = self.schedule.shapes[i]
            dtype = self.schedule.kernels[i].dtype
            return torch.empty((shape[0], shape[1], 0, shape[3]), dtype=dtype, device=self.device)
        buf = self.buffers[i]
        if buf is not None:
            return buf.view(lo, hi)
        return self.values[i].narrow(2, lo, hi - lo + 1)

    def oldest(self, i: int) -> int:
        """First row of ``i`` a consumer may still read (beyond the rows produced when
        the next rows are gaps no consumer reads; its row count when all are done)."""
        produced, rows = self.produced, self.schedule.rows
        low = rows[i]
        for c, slot in self.schedule.readers[i]:  # a loop, not min(): it runs at every step
            row = release_point(slot, produced[c], rows[c])
            if row < low:
                low = row
        return low

    def _whole(self, k: int) -> None:
        """Run node ``k`` whole on whole inputs; hold its result until its last reader."""
        schedule, buffers = self.schedule, self.buffers
        args = [
            self.values[i] if buffers[i] is None else self.rows_of(i, 0, schedule.rows[i] - 1)
            for i in schedule.inputs[k]
        ]
        result = schedule.kernels[k].whole(args)
        if self.is_output[k] and self.out is not None:
            target = self.out[self.out_slot[k]]
            target.copy_(result)
            result = target
        self.values[k] = result
        if schedule.keeps[k] and isinstance(result, torch.Tensor):
            self.held[k] = result.numel() * result.element_size()
            self.stats.hold(schedule.names[k], self.held[k])

    def _store(self, k: int, first: int, rows: torch.Tensor) -> None:
        """Write output rows of node ``k``: into its result tensor or its row buffer."""
        if self.is_output[k]:
            if self.values[k] is None:
                shape = self.schedule.shapes[k]
                self.values[k] = self.out[self.out_slot[k]] if self.out is not None else rows.new_empty(shape)
            self.values[k][:, :, first : first + rows.shape[2]].copy_(rows)
            return
        buf = self.buffers[k]
        if buf is None:
            buf = RowBuffer(self.schedule.buffer_rows[k], rows)
            self.buffers[k] = buf
            self.held[k] = buf.nbytes
            self.stats.hold(self.schedule.names[k], buf.nbytes)
        buf.skip_to(first)  # rows nobody reads may have been skipped
        buf.write(first, rows)

    def _free(self, i: int, buf: RowBuffer | None) -> None:
        """Node ``i``'s tensor was read for the last time: its bytes leave the ledger."""
        self.stats.free(self.held[i])
        self.held[i] = 0
        if buf is not None:
            self.stats.high_water_rows[self.schedule.names[i]] = buf.high_water
            self.buffers[i] = None
        if not self.is_output[i]:
            self.values[i] = None


def held_spans(
    steps: Sequence[tuple[int, int, int]], by_parts: Sequence[bool], unit_of: Sequence[int | None]
) -> list[tuple[int, int, range]]:
    """The spans of steps ``(first, last, units)`` over which ``units`` are bound as one.

    A unit holding an operator run in stripes is bound from the first step of any of its
    operators to the last; spans that overlap, and the units any step inside a span
    runs (a whole operator between two phases), join until none overlap. ``unit_of``
    gives each node's unit (None: an operator with no weights of its own)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for s, (k, _, _) in enumerate(steps):
        u = unit_of[k]
        if u is not None:
            first.setdefault(u, s)
            last[u] = s
    striped = {unit_of[k] for k, _, _ in steps if by_parts[k]} - {None}
    spans = sorted({(first[u], last[u]) for u in striped})
    if not spans:
        return []
    while True:
        merged: list[tuple[int, int]] = []
        for s, e in spans:
            if merged and s <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(e, merged[-1][1]))
            else:
                merged.append((s, e))
        grown = []
        for s, e in merged:
            units = [u for u in (unit_of[steps[t][0]] for t in range(s, e + 1)) if u is not None]
            inside = [u for u in range(min(units), max(units) + 1) if u in first]
            grown.append((min(s, *(first[u] for u in inside)), max(e, *(last[u] for u in inside))))
        if grown == merged:
            break
        spans = grown
    result = []
    for s, e in merged:
        units = [u for u in (unit_of[steps[t][0]] for t in range(s, e + 1)) if u is not None]
        result.append((s, e, range(min(units), max(units) + 1)))
    return result


def holds_for(stream: UnitStream, spans: Sequence[tuple[int, int, range]]) -> Holds:
    """The units ``stream`` binds as one over ``spans`` (:func:`held_spans`), refused
    where its policy reads a unit only once the one before it ran, or where its ring
    cannot hold a span's streamed units at once (each would wait for the others)."""
    policy = stream.policy
    ring = stream.device_ring if stream.device_ring is not None else stream.ring
    for _, _, units in spans:
        streamed = [i for i in units if i not in stream.kept]
        if policy is None or policy.resident or len(streamed) < 2:
            continue
        if not all(policy.read_may_start(i, i, units.start, stream.device.stages) for i in streamed):
            raise LayerfitError(
                f"units {units.start}-{units.stop - 1} run in stripes, so they are bound at once, but pipeline "
                f"{policy.name!r} reads a unit only once the one before it ran: load the model with another pipeline"
            )
        sizes = [stream.blocks[i].nbytes for i in streamed]
        if ring is not None and sum(sizes) + max(sizes) > ring.capacity:
            raise BudgetError(
                f"units {units.start}-{units.stop - 1} run in stripes, so their {sum(sizes)} bytes are bound at "
                f"once, and the weight ring ({ring.capacity} bytes) must hold them and, as it wraps, the largest "
                "of them again: raise the budget or process fewer of their layers by parts"
            )
    return Holds(stream, {s: units for s, _, units in spans}, frozenset(e for _, e, _ in spans))


__all__ = [
    "Holds",
    "Kernel",
    "Operator",
    "Ref",
    "RowBuffer",
    "RunStats",
    "Runner",
    "Slot",
    "StripeSchedule",
    "held_spans",
    "holds_for",
    "operators_of",
    "refs",
    "release_point",
    "run_stripes",
    "slot_reads",
    "window_extent",
    "substitute",
]
