"""Activation tensors and operators of one forward pass (tensor usage records).

Two ways to see them:

* ``fx``: symbolic tracing (:func:`fx_trace`, the one tracer every fx consumer shares,
  so node names are op names everywhere), then an interpreter run (:func:`run_fx`) that
  records each node's output shape and whether it aliases an input (views, in-place
  ops). Every call node is one op. :class:`FxCapture` keeps the traced module beside the
  records, for code that runs the graph node by node (processing by parts).
* ``hooks``: for models fx cannot trace (Hugging Face transformers, data-dependent
  Python), every leaf module call is one op and tensors are matched by storage. Work
  done by functional code between modules is invisible here; tensors it creates appear
  as produced by the first module that reads them.

Either way tensor ids are numbered in production order and ops in execution order, and
every tensor's interval runs from the op that produces it to the last op that reads it;
the model's outputs stay alive until the last op.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch import nn

from layerfit.capture.graph import OpRecord, TensorRecord

# Ops whose output may overwrite their input (same shape and dtype, elementwise).
ELEMENTWISE_MODULES = (
    nn.ReLU,
    nn.ReLU6,
    nn.LeakyReLU,
    nn.SiLU,
    nn.Sigmoid,
    nn.Tanh,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.GELU,
    nn.Mish,
    nn.ELU,
    nn.Dropout,
    nn.Identity,
    nn.modules.batchnorm._BatchNorm,
)
ELEMENTWISE_FUNCTIONS = {
    "relu", "relu_", "relu6", "leaky_relu", "silu", "sigmoid", "tanh", "hardswish",
    "hardsigmoid", "gelu", "mish", "elu", "dropout", "add", "add_", "iadd", "mul", "mul_",
    "imul", "sub", "truediv", "div", "clamp", "hardtanh", "neg", "exp",
}  # fmt: skip


def _flat_tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _flat_tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _flat_tensors(v)]
    if hasattr(x, "to_tuple"):  # Hugging Face ModelOutput
        return _flat_tensors(x.to_tuple())
    return []


def output_names(output: Any) -> list[str]:
    """A name for each tensor of a model's output, in :func:`_flat_tensors`' order: the
    keys of a dict (a Hugging Face ``ModelOutput``'s ``logits``, ``last_hidden_state``),
    ``output`` for a lone tensor, ``output_0``, ``output_1``, ... for a tuple's items, with
    nested keys and positions joined by dots (``encoder_outputs.0``)."""
    if isinstance(output, torch.Tensor):
        return ["output"]
    if isinstance(output, (tuple, list)):
        return [n for i, v in enumerate(output) for n in _paths(v, f"output_{i}")]
    return _paths(output, "")


def _paths(x: Any, prefix: str) -> list[str]:
    join = (lambda key: f"{prefix}.{key}") if prefix else str
    if isinstance(x, torch.Tensor):
        return [prefix or "output"]
    if isinstance(x, (tuple, list)):
        return [n for i, v in enumerate(x) for n in _paths(v, join(i))]
    if isinstance(x, dict):
        return [n for k, v in x.items() for n in _paths(v, join(k))]
    if hasattr(x, "to_tuple"):
        return _paths(x.to_tuple(), prefix)
    return []


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _storage_key(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except RuntimeError:
        return id(t)


class _Builder:
    """Accumulates ops and tensors; ends each tensor's interval at its last reader."""

    def __init__(self) -> None:
        self.ops: list[OpRecord] = []
        self._tensors: list[dict[str, Any]] = []

    def new_tensor(self, t: torch.Tensor, producer: int, alias_of: int | None = None) -> int:
        tid = len(self._tensors)
        self._tensors.append(
            {
                "id": tid,
                "first_op": producer,
                "last_op": producer,
                "nbytes": _nbytes(t),
                "shape": tuple(t.shape),
                "dtype": str(t.dtype).removeprefix("torch."),
                "alias_of": alias_of,
            }
        )
        return tid

    def read(self, tid: int, op: int) -> None:
        rec = self._tensors[tid]
        rec["last_op"] = max(rec["last_op"], op)
        rec["first_op"] = min(rec["first_op"], op) if rec["first_op"] >= 0 else op

    def add_op(self, **kw: Any) -> None:
        self.ops.append(OpRecord(index=len(self.ops), **kw))

    def finish(self, output_ids: list[int]) -> list[TensorRecord]:
        last = max(len(self.ops) - 1, 0)
        for tid in output_ids:
            self._tensors[tid]["last_op"] = last
        for rec in self._tensors:
            rec["first_op"] = max(rec["first_op"], 0)
            rec["last_op"] = max(rec["last_op"], rec["first_op"])
        return [TensorRecord(**rec) for rec in self._tensors]


def _target_name(node: torch.fx.Node) -> str:
    t = node.target
    return t if isinstance(t, str) else getattr(t, "__name__", str(t))


class _RecordingInterpreter(torch.fx.Interpreter):
    """Runs the traced graph and records every call node as one op."""

    def __init__(self, gm: torch.fx.GraphModule, builder: _Builder) -> None:
        super().__init__(gm)
        self.b = builder
        self.ids: dict[torch.fx.Node, list[int]] = {}
        self.tensor_of: dict[str, int] = {}  # node name -> its tensor, where its value is one

    def run_node(self, n: torch.fx.Node) -> Any:
        result = super().run_node(n)
        outs = _flat_tensors(result)
        if n.op == "placeholder":
            # Inputs exist before the first op; their interval starts at the first reader.
            self.ids[n] = [self.b.new_tensor(t, -1) for t in outs]
            if isinstance(result, torch.Tensor):
                self.tensor_of[n.name] = self.ids[n][0]
            return result
        if n.op in ("get_attr", "output") or not outs:
            if n.op == "get_attr":
                self.ids[n] = []
            return result
        input_nodes = [a for a in n.all_input_nodes if a in self.ids]
        in_ids = [tid for a in input_nodes for tid in self.ids[a]]
        in_tensors = {
            _storage_key(t): tid
            for a in input_nodes
            for t, tid in zip(_flat_tensors(self.env[a]), self.ids[a], strict=False)
        }
        op_index = len(self.b.ops)
        for tid in in_ids:
            self.b.read(tid, op_index)
        out_ids = [
            self.b.new_tensor(t, op_index, alias_of=in_tensors.get(_storage_key(t)))
            for t in outs
        ]
        self.ids[n] = out_ids
        if isinstance(result, torch.Tensor):
            self.tensor_of[n.name] = out_ids[0]
        if n.op == "call_module":
            module = self.fetch_attr(n.target)
            elementwise = isinstance(module, ELEMENTWISE_MODULES)
        else:
            elementwise = _target_name(n).lower() in ELEMENTWISE_FUNCTIONS
        inplace = (
            elementwise
            and len(in_ids) >= 1
            and len(outs) == 1
            and any(self.b._tensors[i]["shape"] == tuple(outs[0].shape) for i in in_ids)
        )
        self.b.add_op(
            name=n.name,
            kind=n.op,
            target=_target_name(n),
            inputs=tuple(in_ids),
            outputs=tuple(out_ids),
            inplace=inplace,
        )
        return result


@dataclass(frozen=True)
class FxCapture:
    """One fx trace of a module and the records of one run of it.

    ``module`` is the traced ``GraphModule`` (its node names are the ops' names);
    ``tensor_of`` maps the name of every node whose value is one tensor (graph inputs
    included) to that tensor's id. A node whose value is a tuple or list of tensors, or
    no tensor at all (``x.size(0)``), has no entry.
    """

    module: torch.fx.GraphModule
    ops: list[OpRecord]
    tensors: list[TensorRecord]
    tensor_of: dict[str, int] = field(default_factory=dict)


def fx_trace(model: nn.Module) -> torch.fx.GraphModule:
    """``model`` traced by torch.fx, as every capture traces it (raises if it cannot be)."""
    return torch.fx.symbolic_trace(model, concrete_args=None)


def run_fx(gm: torch.fx.GraphModule, args: tuple, kwargs: dict | None = None) -> FxCapture:
    """Run the traced ``gm`` on ``args`` and record its ops and tensors."""
    kwargs = kwargs or {}
    b = _Builder()
    interp = _RecordingInterpreter(gm, b)
    with torch.no_grad():
        out = interp.run(*args, *kwargs.values())
    output_node = next(n for n in gm.graph.nodes if n.op == "output")
    out_ids: list[int] = []
    for a in output_node.all_input_nodes:
        out_ids.extend(interp.ids.get(a, []))
    del out
    return FxCapture(gm, b.ops, b.finish(out_ids), interp.tensor_of)


def trace_fx(model: nn.Module, args: tuple, kwargs: dict) -> tuple[list[OpRecord], list[TensorRecord]]:
    """Ops and tensors by torch.fx; raises if the model cannot be traced."""
    captured = run_fx(fx_trace(model), args, kwargs)
    return captured.ops, captured.tensors


def trace_hooks(model: nn.Module, args: tuple, kwargs: dict) -> tuple[list[OpRecord], list[TensorRecord]]:
    """Ops and tensors from leaf-module calls, for models fx cannot trace."""
    b = _Builder()
    by_storage: dict[int, int] = {}
    keep: list[torch.Tensor] = []  # hold every tensor so storage addresses stay unique

    for t in _flat_tensors((args, kwargs)):
        by_storage[_storage_key(t)] = b.new_tensor(t, -1)
        keep.append(t)

    def post(module: nn.Module, inputs: tuple, output: Any) -> None:
        op_index = len(b.ops)
        in_ids: list[int] = []
        for t in _flat_tensors(inputs):
            key = _storage_key(t)
            if key not in by_storage:
                by_storage[key] = b.new_tensor(t, op_index)
                keep.append(t)
            in_ids.append(by_storage[key])
        for tid in in_ids:
            b.read(tid, op_index)
        out_ids = []
        in_keys = {_storage_key(t): tid for t, tid in zip(_flat_tensors(inputs), in_ids, strict=False)}
        for t in _flat_tensors(output):
            key = _storage_key(t)
            tid = b.new_tensor(t, op_index, alias_of=in_keys.get(key))
            by_storage[key] = tid
            keep.append(t)
            out_ids.append(tid)
        b.add_op(
            name=names[id(module)],
            kind="module",
            target=type(module).__name__,
            inputs=tuple(in_ids),
            outputs=tuple(out_ids),
            inplace=isinstance(module, ELEMENTWISE_MODULES),
        )

    names = {}
    handles = []
    for name, module in model.named_modules():
        if next(module.children(), None) is None:
            names[id(module)] = name
            handles.append(module.register_forward_hook(post))
    try:
        with torch.no_grad():
            output = model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    out_ids = [by_storage[_storage_key(t)] for t in _flat_tensors(output) if _storage_key(t) in by_storage]
    return b.ops, b.finish(out_ids)
