"""Planned activation memory: the arena size a model needs, and running inside it.

Two services for the engine, both built on :mod:`layerfit.memory` (Pisarchyk & Lee):

* :func:`plan_activations` plans the captured graph's activation buffers with the
  offsets approach (``best`` by default) and reports the arena size, so a user sees the
  total planned memory: weight budget + activation arena. It is computed on demand from
  the manifest's graph (milliseconds to a second): the prepared directory stays as
  ``prepare`` wrote it and old manifests need nothing new.
* :class:`PlannedActivations` executes the model with **one** pre-allocated arena laid
  out by that plan (``Engine(..., activations="planned")``).

How planned execution works. The skeleton is traced with torch.fx (the same tracer
capture used, so node names are the graph's op names) and run node by node by an
interpreter that resolves modules and attributes on the engine's skeleton, so weights
still arrive through the engine's pre/post hooks, which it calls around each module's
``forward``. Every ATen op runs under a dispatch mode. For each node, a calibration run
on the meta device (at construction, no weights needed) finds the one ATen op whose
result *is* the node's output; at run time that op alone is redirected to its ``out=``
overload with the node's planned slice of the arena as ``out``. So:

* views and in-place ops produce no new storage: they alias an arena slice already;
  the planner's in-place reuse gives an output the same offset as its dying input;
* temporaries inside a node (e.g. a max-pool's indices) are allocated by PyTorch and
  freed at once; buffers holding a model output are allocated by PyTorch too, because
  they are returned to the caller and must survive the next inference;
* every op computes with the same kernel it would use anyway (``out=`` overloads share
  it, or are generated wrappers that copy the functional result), so the output is
  bit-identical to ``model(x)``.

A graph is refused (:class:`~layerfit.errors.LayerfitError` naming the op) where a node's
output comes from an op with no ``out=`` overload, or where capture did not use fx. So is
a forward pass whose result the traced graph would not reproduce: one that writes state
(a buffer, a Python attribute) the graph does not carry from call to call, or creates a
tensor from constants (``torch.randn(8)``, a plain tensor attribute) that tracing froze.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from layerfit.engine.config import ACTIVATION_MODES
from layerfit.errors import LayerfitError
from layerfit.memory.from_graph import GraphRecords, records_from_graph
from layerfit.memory.plans import OffsetsPlan
from layerfit.memory.registry import plan_offsets

if TYPE_CHECKING:
    from layerfit.capture.graph import ModelGraph
    from layerfit.store.manifest import Manifest

MODES = ACTIVATION_MODES


class ActivationPlanError(LayerfitError):
    """The model cannot run with a planned activation arena."""


# --- the plan and its report ------------------------------------------------------------


@dataclass(frozen=True)
class ActivationPlan:
    """The offsets plan of a captured graph's activation buffers."""

    records: GraphRecords
    offsets: OffsetsPlan
    seconds: float

    @property
    def arena_bytes(self) -> int:
        return self.offsets.arena_size

    def to_dict(self) -> dict[str, Any]:
        """The figures a report shows (no per-tensor assignment)."""
        return {
            "strategy": self.offsets.strategy,
            "winner": self.offsets.note,
            "arena_bytes": self.arena_bytes,
            "lower_bound_bytes": self.offsets.lower_bound,
            "buffers": len(self.records.records),
            "tensor_bytes": self.records.tensor_bytes,
            "planning_s": self.seconds,
        }


def plan_activations(graph: ModelGraph, strategy: str = "best") -> ActivationPlan:
    """Plan ``graph``'s activation buffers in one arena with offsets ``strategy``."""
    t0 = time.perf_counter()
    records = records_from_graph(graph)
    offsets = plan_offsets(records.records, strategy)
    return ActivationPlan(records, offsets, time.perf_counter() - t0)


def memory_summary(plan: ActivationPlan, weight_bytes: int) -> dict[str, Any]:
    """Report keys: the activation arena next to the weight bytes, and their sum."""
    return {
        "activation_arena_bytes": plan.arena_bytes,
        "activation_plan": plan.to_dict(),
        "planned_total_bytes": weight_bytes + plan.arena_bytes,
    }


# --- out= overloads ---------------------------------------------------------------------

_OUT_CACHE: dict[Any, Any] = {}


def out_overload(func: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The ``out=`` overload of ``func`` taking the same arguments plus outs, or None."""
    if func in _OUT_CACHE:
        return _OUT_CACHE[func]
    found = None
    want = [(a.name, str(a.type)) for a in func._schema.arguments]
    packet = func.overloadpacket
    for name in packet.overloads():
        candidate = getattr(packet, name)
        args = candidate._schema.arguments
        outs = [a for a in args if a.is_out]
        if (
            len(outs) == len(func._schema.returns)
            and [(a.name, str(a.type)) for a in args if not a.is_out] == want
        ):
            found = candidate
            break
    _OUT_CACHE[func] = found
    return found


def _is_functional(func: torch._ops.OpOverload) -> bool:
    schema = func._schema
    return not schema.is_mutable and all(r.alias_info is None for r in schema.returns)


def _extent(t: torch.Tensor) -> int:
    """Bytes of storage ``t`` spans from its first element."""
    if t.numel() == 0:
        return 0
    return (
        1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True))
    ) * t.element_size()


def _flat(x: Any) -> list[Any]:
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _flat(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _flat(v)]
    return [x]


# --- calibration on the meta device -----------------------------------------------------


@dataclass(frozen=True)
class _Target:
    """Where one node's producing op writes: its ``out=`` call and arena slice."""

    node: str
    op_index: int  # which ATen call of the node (in dispatch order)
    func: Any
    out_func: Any
    out_names: tuple[str, ...]
    out_index: int  # which return is the node's output
    offset: int
    shapes: tuple[tuple[tuple[int, ...], tuple[int, ...], torch.dtype], ...]  # every return
    inputs: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()  # (shape, stride) of each tensor argument


class _Recorder(TorchDispatchMode):
    """Records every ATen call of the current node and its results (meta tensors)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, list[Any]]] = []
        self.inputs: list[tuple] = []  # the layout of each call's tensor arguments

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        result = func(*args, **(kwargs or {}))
        self.calls.append((func, _flat(result)))
        self.inputs.append(_layouts(args, kwargs))
        return result


class _SkeletonInterpreter(torch.fx.Interpreter):
    """Runs the traced graph against ``skeleton``, each node under ``mode``.

    Modules and attributes are looked up on ``skeleton`` at run time (the engine binds
    weights there). A module's forward pre/post hooks run outside the mode, so the
    engine's binding is never mistaken for the node's own work. A module the trace went
    through (a unit streamed with its children) has no node of its own: its pre-hooks run
    before the first of its nodes (``enter``) and its hooks after the last (``leave``).
    """

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        skeleton: nn.Module,
        mode: Any,
        enter: dict[str, list[str]] | None = None,
        leave: dict[str, list[str]] | None = None,
    ) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.skeleton = skeleton
        self.mode = mode
        self._modules = dict(skeleton.named_modules(remove_duplicate=False))
        self._enter, self._leave = enter or {}, leave or {}

    def fetch_attr(self, target: str) -> Any:
        owner, _, attr = target.rpartition(".")
        return getattr(self._modules[owner] if owner else self.skeleton, attr)

    def run_node(self, n: torch.fx.Node) -> Any:
        for name in self._enter.get(n.name, ()):
            module = self._modules[name]
            for hook in module._forward_pre_hooks.values():
                hook(module, ())
        out = self._run_node(n)
        for name in self._leave.get(n.name, ()):
            module = self._modules[name]
            for hook in module._forward_hooks.values():
                hook(module, (), out)
        return out

    def _run_node(self, n: torch.fx.Node) -> Any:
        if n.op in ("placeholder", "output", "get_attr"):
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        if n.op == "call_module":
            module = self._modules[n.target]
            for hook in module._forward_pre_hooks.values():
                changed = hook(module, args)
                if changed is not None:
                    args = changed if isinstance(changed, tuple) else (changed,)
            self.mode.begin(n.name)
            try:
                out = module.forward(*args, **kwargs)
            finally:
                self.mode.end()
            for hook in module._forward_hooks.values():
                changed = hook(module, args, out)
                if changed is not None:
                    out = changed
            return out
        self.mode.begin(n.name)
        try:
            return getattr(self, n.op)(n.target, args, kwargs)
        finally:
            self.mode.end()


class _CalibrationMode(_Recorder):
    """Keeps the calls of each node separately."""

    def __init__(self) -> None:
        super().__init__()
        self.by_node: dict[str, list[tuple[Any, list[Any]]]] = {}
        self.inputs_by_node: dict[str, list[tuple]] = {}

    def begin(self, name: str) -> None:
        self.calls = []
        self.inputs = []
        self.by_node[name] = self.calls
        self.inputs_by_node[name] = self.inputs

    def end(self) -> None:
        self.calls = []
        self.inputs = []


class _RecordingInterpreter(_SkeletonInterpreter):
    """Also keeps every node's result, to find the op that produced it."""

    def __init__(self, *a: Any) -> None:
        super().__init__(*a)
        self.results: dict[str, Any] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        result = super().run_node(n)
        self.results[n.name] = result
        return result


# --- the arena mode at run time ---------------------------------------------------------


class _ArenaMode(TorchDispatchMode):
    """Redirects each node's producing op to its ``out=`` overload into the arena."""

    def __init__(self, arena: torch.Tensor, targets: dict[str, _Target], log: list | None) -> None:
        super().__init__()
        self.arena = arena
        self.targets = targets
        self.current: _Target | None = None
        self.count = 0
        self.log = log

    def begin(self, name: str) -> None:
        self.current = self.targets.get(name)
        self.count = 0

    def end(self) -> None:
        self.current = None

    def _slice(
        self, shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype, offset: int
    ) -> torch.Tensor:
        typed = self.arena.view(dtype)
        return typed.as_strided(shape, stride, offset // typed.element_size())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        t = self.current
        if t is not None:
            k = self.count
            self.count += 1
            if k == t.op_index:
                if func is not t.func:
                    raise ActivationPlanError(
                        f"node {t.node}: ATen call {k} is {func}, calibration saw {t.func}; "
                        "the model's control flow differs from the traced graph"
                    )
                if _layouts(args, kwargs) != t.inputs:
                    # Another input shape or memory layout than the plan's: the op may give
                    # another shape or layout (channels-last) than its planned slice, so it
                    # allocates its own result, as in the model.
                    return func(*args, **kwargs)
                outs = {}
                for j, (name, (shape, stride, dtype)) in enumerate(
                    zip(t.out_names, t.shapes, strict=True)
                ):
                    if j == t.out_index:
                        outs[name] = self._slice(shape, stride, dtype, t.offset)
                    else:
                        outs[name] = torch.empty_strided(shape, stride, dtype=dtype)
                result = t.out_func(*args, **kwargs, **outs)
                if self.log is not None:
                    self.log.append((t.node, outs[t.out_names[t.out_index]].data_ptr()))
                return result
        return func(*args, **kwargs)


@dataclass
class PlannedActivations:
    """A model's traced graph bound to one pre-allocated activation arena.

    Built once per engine from the manifest (``strategy`` of the offsets planner); call
    :meth:`run` in place of ``skeleton(*args)``. ``log_writes`` keeps, for tests, every
    redirected node with the address it wrote to (``last_writes``).
    """

    manifest: Manifest
    strategy: str = "best"
    log_writes: bool = False
    plan: ActivationPlan = field(init=False)
    targets: dict[str, _Target] = field(init=False)
    notes: dict[str, str] = field(init=False)  # node -> why it is not written in the arena
    arena: torch.Tensor = field(init=False)
    last_writes: list[tuple[str, int]] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        graph = self.manifest.graph
        if graph.method != "fx":
            raise ActivationPlanError(
                f"planned activations need a graph captured by torch.fx; this model was captured "
                f"by {graph.method} (run it with activations='default')"
            )
        from layerfit.engine.skeleton import build_skeleton

        strided = [t.name for seg in self.manifest.segments for t in seg.tensors if t.stride is not None]
        if strided:
            raise ActivationPlanError(
                f"weight {strided[0]} is not row-major (channels-last or transposed): the arena's "
                "layout, planned on the meta device, could differ from the one PyTorch gives "
                "its outputs, and so the output's last bits; run it with activations='default'"
            )
        writes = [r.name for r in graph.resident if r.reason.startswith("the forward pass writes it")]
        if writes:
            raise ActivationPlanError(
                f"the forward pass writes {writes[0]}, a state the traced graph does not carry "
                "from call to call: run it with activations='default'"
            )
        meta = build_skeleton(self.manifest)
        before = _python_state(meta)
        try:
            self.gm = torch.fx.symbolic_trace(meta)
        except Exception as exc:  # the skeleton traced at prepare; its factory may differ now
            raise ActivationPlanError(
                f"torch.fx cannot trace the model's skeleton ({type(exc).__name__}: {exc}): "
                "run it with activations='default'"
            ) from exc
        changed = [k for k, v in _python_state(meta).items() if k in before and before[k] != v]
        if changed:
            raise ActivationPlanError(
                f"the forward pass changes attribute {changed[0]}, a state the traced graph "
                "froze at trace time: run it with activations='default'"
            )
        self._enter, self._leave = self._unit_spans()
        self._check_constants()
        self.placeholders = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        self.plan = plan_activations(graph, self.strategy)
        try:
            self.targets, self.notes = self._calibrate(meta, graph)
        except ActivationPlanError:
            raise
        except Exception as exc:  # the forward pass needs real values (.item(), printing ...)
            raise ActivationPlanError(
                f"the traced graph cannot be laid out without weights ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0]}): run it with activations='default'"
            ) from exc
        self.arena = torch.empty(self.plan.arena_bytes, dtype=torch.uint8)
        self._interpreters: dict[int, _SkeletonInterpreter] = {}

    def _unit_spans(self) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        """Where the engine binds each unit: at its module's call, or, for a module the
        trace went through (a unit streamed with its children), around the unbroken run
        of nodes its forward made. Returns the units to enter before, and to leave after,
        each node by name."""
        nodes = list(self.gm.graph.nodes)
        called = {n.target for n in nodes if n.op == "call_module"}
        enter: dict[str, list[str]] = {}
        leave: dict[str, list[str]] = {}
        spans: dict[str, list[int]] = {}  # module -> the nodes made while it ran
        for k, n in enumerate(nodes):
            for path in _traced_through(n):
                spans.setdefault(path, []).append(k)
        loose = []
        for unit in self.manifest.units:
            if unit.name in called:
                continue
            inside = spans.get(unit.name, []) if unit.name else []
            if not inside or inside[-1] - inside[0] + 1 != len(inside):
                loose.append(unit.name)
                continue
            enter.setdefault(nodes[inside[0]].name, []).append(unit.name)
            leave.setdefault(nodes[inside[-1]].name, []).append(unit.name)
        if loose:
            raise ActivationPlanError(
                f"planned activations need every unit to be one module call, or one unbroken "
                f"run of nodes, of the traced graph; {len(loose)} are not (first: {loose[0] or '<root>'}, which the trace keeps inside "
                "another module's call or splits): run it with activations='default'"
            )
        return enter, leave

    def _check_constants(self) -> None:
        """Refuse tensors tracing froze into the graph: created from constant arguments
        (``torch.randn(8)``, ``torch.zeros(2)``) or held in a plain attribute. Each call of
        the model makes them anew (a new random draw); the graph would reuse one."""
        frozen = [
            n.target
            for n in self.gm.graph.nodes
            if n.op == "get_attr" and n.target.rpartition(".")[2].startswith("_tensor_constant")
        ]
        if frozen:
            raise ActivationPlanError(
                f"the forward pass creates {len(frozen)} tensor(s) from constant arguments "
                "(such as torch.randn(8) or torch.zeros(2)), which torch.fx freezes into the "
                "traced graph: run it with activations='default'"
            )

    def _calibrate(
        self, meta: nn.Module, graph: ModelGraph
    ) -> tuple[dict[str, _Target], dict[str, str]]:
        from layerfit.store.manifest import DTYPES

        mode = _CalibrationMode()
        interp = _RecordingInterpreter(self.gm, meta, mode)
        x = torch.empty(
            tuple(self.manifest.input_shape), dtype=DTYPES[self.manifest.input_dtype], device="meta"
        )
        with torch.no_grad(), mode:
            interp.run(x)
        ops = {op.name: op for op in graph.ops}
        records = self.plan.records
        size = {r.id: r.size for r in records.records}
        output_node = next(n for n in self.gm.graph.nodes if n.op == "output")
        returned = {
            records.record_of[tid]
            for a in output_node.all_input_nodes
            if a.name in ops
            for tid in ops[a.name].outputs
        }
        targets: dict[str, _Target] = {}
        notes: dict[str, str] = {}
        missing: list[str] = []
        for name, calls in mode.by_node.items():
            op = ops.get(name)
            if op is None:
                continue
            result = interp.results.get(name)
            if not isinstance(result, torch.Tensor):
                notes[name] = "several outputs: left to PyTorch"
                continue
            found = _producer(calls, result)
            if found is None:
                notes[name] = "view or input: no new storage"
                continue
            k, j = found
            func, outs = calls[k]
            if not _is_functional(func):
                notes[name] = f"view: {func} aliases or writes over its input, no new storage"
                continue
            record = records.record_of[op.outputs[0]]
            if record in returned:
                notes[name] = "model output: allocated by PyTorch for the caller"
                continue
            out_func = out_overload(func)
            if out_func is None:
                missing.append(f"{name} ({func})")
                continue
            produced = outs[j]
            if _extent(produced) > size[record]:
                notes[name] = (
                    f"{func} writes {_extent(produced)} bytes, more than its planned {size[record]}"
                )
                continue
            if not all(isinstance(o, torch.Tensor) for o in outs):
                notes[name] = f"{func} returns non-tensors: left to PyTorch"
                continue
            targets[name] = _Target(
                name, k, func, out_func,
                tuple(a.name for a in out_func._schema.arguments if a.is_out), j,
                self.plan.offsets.offsets[record],
                tuple((tuple(o.shape), tuple(o.stride()), o.dtype) for o in outs),
                mode.inputs_by_node[name][k],
            )  # fmt: skip
        if missing:
            raise ActivationPlanError(
                f"planned activations need an out= ATen overload for every op; {len(missing)} have none: "
                + ", ".join(missing[:5])
                + (" …" if len(missing) > 5 else "")
                + " (run with activations='default')"
            )
        return targets, notes

    @property
    def arena_bytes(self) -> int:
        return self.plan.arena_bytes

    def run(self, skeleton: nn.Module, args: tuple, kwargs: dict) -> Any:
        """Execute the traced graph on ``skeleton`` writing activations into the arena."""
        log: list | None = [] if self.log_writes else None
        mode = _ArenaMode(self.arena, self.targets, log)
        interp = self._interpreters.get(id(skeleton))
        if interp is None or interp.skeleton is not skeleton:  # built once per skeleton
            interp = self._interpreters[id(skeleton)] = _SkeletonInterpreter(
                self.gm, skeleton, mode, self._enter, self._leave
            )
        interp.mode = mode
        with mode:
            out = interp.run(*self._inputs(args, kwargs))
        if log is not None:
            self.last_writes = log
        return _mutable(out)

    def _inputs(self, args: tuple, kwargs: dict) -> list[Any]:
        """The traced graph's placeholders, in order, from positional and keyword inputs."""
        names = [n.target for n in self.placeholders]
        unknown = [k for k in kwargs if k not in names[len(args):]]
        if len(args) > len(names) or unknown:
            raise LayerfitError(
                f"the traced model takes inputs ({', '.join(names)}); it was called with "
                f"{len(args)} positional input(s)"
                + (f" and keyword(s) {', '.join(unknown)}" if unknown else "")
                + " (run it with activations='default' for other arguments)"
            )
        values = list(args)
        for node in self.placeholders[len(args):]:
            if node.target in kwargs:
                values.append(kwargs[node.target])
            elif node.args:  # the forward's default
                values.append(node.args[0])
            else:
                raise LayerfitError(f"input {node.target!r} of the traced model is missing")
        return values

    def report(self) -> dict[str, Any]:
        """What the arena holds: nodes written there, and nodes PyTorch allocated."""
        fallback = {
            n: r for n, r in self.notes.items() if not r.startswith("view")
        }  # views need no storage
        return {
            "arena_bytes": self.arena_bytes,
            "nodes_in_arena": len(self.targets),
            "nodes_allocated_by_pytorch": fallback,
        }


def _traced_through(node: torch.fx.Node) -> set[str]:
    """The modules whose ``forward`` was running when the trace made ``node``."""
    return {path for path, _type in node.meta.get("nn_module_stack", {}).values()}


def _layouts(args: Any, kwargs: Any) -> tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]:
    """``(shape, stride)`` of every tensor among an op's arguments."""
    return tuple(
        (tuple(t.shape), tuple(t.stride()))
        for t in _flat([args, kwargs or {}])
        if isinstance(t, torch.Tensor) and t.layout == torch.strided
    )


def _python_state(model: nn.Module) -> dict[str, Any]:
    """Every module's plain Python attributes (numbers, strings, flags), by qualified name."""
    state: dict[str, Any] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        for attr, value in vars(module).items():
            if isinstance(value, (bool, int, float, str, type(None))) and not attr.startswith("_"):
                state[f"{name}.{attr}" if name else attr] = value
    return state


def _mutable(x: Any) -> Any:
    """``x`` with torch.fx's immutable lists and dicts (what the interpreter returns for
    a model that returns a list or dict) made plain lists and dicts again, as the model
    returns them; tuples, named tuples and tensors are kept."""
    if isinstance(x, list):
        return [_mutable(v) for v in x]
    if isinstance(x, dict):
        return {k: _mutable(v) for k, v in x.items()}
    if isinstance(x, tuple):
        items = [_mutable(v) for v in x]
        return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)
    return x


def _producer(calls: list[tuple[Any, list[Any]]], result: torch.Tensor) -> tuple[int, int] | None:
    """(call index, return index) of the ATen call whose result is ``result``."""
    for k in range(len(calls) - 1, -1, -1):
        for j, o in enumerate(calls[k][1]):
            if o is result:
                return k, j
    return None


def make_activations(
    mode: str, manifest: Manifest, strategy: str = "best"
) -> PlannedActivations | None:
    """None for ``default``; the planned arena for ``planned``; else a clear error."""
    if mode == "default":
        return None
    if mode == "planned":
        return PlannedActivations(manifest, strategy)
    raise LayerfitError(f"unknown activations mode {mode!r}; choose one of {', '.join(MODES)}")


def engine_activation_report(engine: Any) -> dict[str, Any]:
    """Report keys of an engine: its activations mode, the planned arena next to its
    weight buffers (resident + unit buffers), their sum, and what PyTorch still allocates
    in planned mode."""
    arena: PlannedActivations | None = getattr(engine, "arena", None)
    plan = arena.plan if arena is not None else plan_activations(engine.manifest.graph)
    weights = engine.memory.weight_bytes
    out: dict[str, Any] = {"activations": "default" if arena is None else "planned"}
    out.update(memory_summary(plan, weights))
    if arena is not None:
        out["activation_fallbacks"] = arena.report()["nodes_allocated_by_pytorch"]
    return out
