"""A CNN's layers read from capture's graph, with the engine's kernels that run them.

A module is seen as layerfit's capture sees it: :func:`~layerfit.capture.capture` (with
torch.fx) records every operator and the shape and dtype of every tensor, and the
capture's tracer (:func:`~layerfit.capture.activations.fx_trace`) gives the same
operators as fx nodes, by name. :func:`cnn_from_module` captures a module,
:func:`cnn_from_graph` reads a stored capture; each operator, as the engine's stripes
read it (:func:`layerfit.engine.stripes.operators_of`: its kind, its geometry along the
height, whether it can run in stripes, its kernels), is a
:class:`~layerfit.tradeoff.parts.cnn.Layer` of the application model.
:func:`cnn_from_engine` reads the graph a loaded engine's ``prepare`` captured, with
kernels calling the engine's own model (whose weights it binds).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.fx
from torch import nn

from layerfit.capture import capture
from layerfit.capture.activations import fx_trace
from layerfit.engine.stripes import NodeValues, operators_of
from layerfit.errors import CaptureError, TradeoffError
from layerfit.tradeoff.parts.cnn import CNN

if TYPE_CHECKING:
    from layerfit.capture.graph import ModelGraph, TensorRecord
    from layerfit.engine.engine import Engine


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


def cnn_from_engine(engine: Engine, name: str | None = None, like: CNN | None = None) -> CNN:
    """The CNN of ``engine``'s model: its captured graph's operators, kernels calling the
    engine's skeleton, and the manifest's example input as its runner's example; refused
    unless its layers are those of ``like``, when given."""
    from layerfit.store.examples import example_call

    args, kwargs = example_call(engine.manifest)
    if kwargs:
        raise TradeoffError("processing by parts takes positional tensor inputs; this model was prepared from keywords")
    cnn = cnn_from_graph(name or engine.manifest.model["name"], engine.manifest.graph, engine.model, tuple(args))
    if like is not None and cnn.layers != like.layers:
        raise TradeoffError(f"the engine given for {like.name!r} runs another model (or input shape)")
    return cnn


def cnn_from_graph(name: str, graph: Any, model: Any, example: tuple[Any, ...] | None = None) -> CNN:
    """Layers from a :class:`~layerfit.capture.graph.ModelGraph` captured with torch.fx.

    Every operator of the graph is a layer, with the shapes the graph recorded and the
    kind and geometry of the module's fx node of its name
    (:func:`~layerfit.engine.stripes.operators_of`). The CNN has a runner when
    ``example`` (the input the graph was captured at) is given; otherwise nothing here
    has an input to run it on.
    """
    gm, values = graph_values(graph, model)
    operators, runner = operators_of(gm, values, example or ())
    return CNN(name, tuple(operators), runner=runner if example is not None else None)


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
