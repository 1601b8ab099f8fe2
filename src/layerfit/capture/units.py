"""Which modules become streamed units, in which order, and which tensors stay resident.

A unit is a module that owns parameters or buffers directly and has no descendant that
owns any (a "leaf owner"), and that runs exactly once per forward pass. Its tensors can
be brought in just before it runs and dropped right after. Everything else that holds
tensors is *resident*: shared or tied tensors (bound at several places), tensors owned
by a container whose children also own tensors, and tensors of a module called several
times. A tensor must also stay resident when it is used while its module is not running:
an op outside the module's ``forward`` reads it (``x @ self.embed.weight.t()`` in the
parent), or a view of it leaves the module's ``forward`` in the output. Streamed, such a
tensor would be unbound (a meta tensor, so a silent meta result) or its bytes reused by
the next unit when it is read. A tensor the forward pass writes (a counter, a cache: an
in-place op on it, or a new tensor assigned to it) stays resident too, so its state
carries over from call to call as in the model; streamed, each call would start again
from the stored bytes. Modules that never run in the forward pass, and whose tensors
nothing reads, are reported as unused and not stored.

A tensor resident only for where it is used (a container's own, one read by an
ancestor's ``forward``, one of a module called several times) streams after all when an
ancestor below the root runs once and runs at every use of it and of its subtree's other
tensors: that ancestor's whole subtree is then one unit (``nn.MultiheadAttention`` with
its ``out_proj``), if this lowers the model's minimum budget
(:meth:`UnitRecorder._merge_subtrees`). Such a unit's tensors name their path below it
(``out_proj.weight``).

:class:`StateGuard` undoes what the capture's forward passes write, so ``prepare`` packs
the model's weights as they were before it ran, never after.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from layerfit.capture.graph import ParamSpec, ResidentTensor, UnitInfo
from layerfit.capture.macs import module_macs
from layerfit.sizes import format_bytes


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``float32``."""
    return str(dtype).removeprefix("torch.")


def _shapes(x: object) -> tuple[tuple[int, ...], ...]:
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape),)
    if isinstance(x, (tuple, list)):
        return tuple(s for v in x for s in _shapes(v))
    if isinstance(x, dict):
        return tuple(s for v in x.values() for s in _shapes(v))
    return ()


@dataclass
class _Place:
    module: str
    attr: str
    kind: str
    tensor: torch.Tensor


@dataclass
class _CallStats:
    calls: int = 0
    macs: int = 0
    input_shapes: tuple = ()
    output_shapes: tuple = ()
    first_call: int = -1
    children_owning: bool = False
    places: list[_Place] = field(default_factory=list)


def _direct_tensors(module: nn.Module) -> list[tuple[str, str, torch.Tensor]]:
    found = [(n, "param", p) for n, p in module._parameters.items() if p is not None]
    found += [(n, "buffer", b) for n, b in module._buffers.items() if b is not None]
    return found


def storage_address(t: torch.Tensor) -> int | None:
    """The address of ``t``'s storage (None where it has none to compare)."""
    if t.device.type == "meta" or t.layout != torch.strided or t.numel() == 0:
        return None
    return t.untyped_storage().data_ptr()


# Ops that read a tensor's metadata, not its bytes: a meta tensor answers them alike.
# Not ``device`` (nor ``is_meta``, ``is_cuda``, ``get_device``): an unbound weight of the
# skeleton is on device meta, so ``torch.zeros(n, device=self.fc.weight.device)`` read
# outside ``fc`` would make a meta tensor; such a weight stays resident.
_METADATA_OPS = frozenset({
    "shape", "dtype", "size", "dim", "ndim", "ndimension", "numel", "nelement",
    "layout", "requires_grad", "is_leaf", "is_sparse", "is_quantized",
    "is_floating_point", "is_complex", "is_contiguous", "stride", "element_size", "itemsize",
    "nbytes", "names", "__len__",
})


def _op_name(func) -> str:
    name = getattr(func, "__name__", str(func))
    if name in ("__get__", "__set__"):  # a property: name it after the attribute
        name = getattr(getattr(func, "__self__", None), "__name__", name)
    return name


class _OutsideUse(TorchFunctionMode):
    """Notes every owned tensor an op reads while none of its owning modules is running."""

    def __init__(self, recorder: UnitRecorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rec = self.recorder
        if not rec._in_hook:
            for leaf in tree_leaves((args, kwargs)):
                if not isinstance(leaf, torch.Tensor):
                    continue
                if id(leaf) in rec._plain and _op_name(func) not in _METADATA_OPS:
                    rec.plain_reads.setdefault(rec._plain[id(leaf)], _op_name(func))
                owners = rec._owners.get(id(leaf))
                if owners and _op_name(func) not in _METADATA_OPS:
                    rec._note_read(id(leaf))
                    if id(leaf) not in rec.outside and not any(rec._running[o] for o in owners):
                        rec.outside[id(leaf)] = _op_name(func)
        return func(*args, **kwargs)


def _written_args(func, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensor arguments an ATen op writes (in-place and ``out=`` arguments)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return []
    out = []
    for k, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = args[k] if k < len(args) else kwargs.get(arg.name)
        out.extend(t for t in tree_leaves(value) if isinstance(t, torch.Tensor))
    return out


class StateGuard(TorchDispatchMode):
    """Undoes what forward passes write to a model's parameters and buffers.

    While active, the first in-place write to an owned tensor's storage saves a copy of
    every owned tensor on that storage (copy on write: nothing is copied for a model that
    writes nothing); :meth:`restore` copies them back and puts back every parameter and
    buffer the forward pass replaced (``self.state = self.state + 1``). ``written`` maps
    ``id`` of each such tensor to what changed it, for the capture to keep it resident.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self._slots: list[tuple[dict, str, torch.Tensor]] = []
        self._by_storage: dict[int, list[torch.Tensor]] = defaultdict(list)
        seen: set[int] = set()
        for _, module in model.named_modules(remove_duplicate=False):
            for holder in (module._parameters, module._buffers):
                for attr, t in holder.items():
                    if t is None:
                        continue
                    self._slots.append((holder, attr, t))
                    if id(t) not in seen and (key := storage_address(t)) is not None:
                        seen.add(id(t))
                        self._by_storage[key].append(t)
        self._saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id -> (tensor, copy)
        self.written: dict[int, str] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for t in _written_args(func, args, kwargs):
            key = storage_address(t)
            for owned in self._by_storage.get(key, ()) if key is not None else ():
                if id(owned) not in self._saved:
                    self._saved[id(owned)] = (owned, owned.detach().clone())
                self.written.setdefault(id(owned), f"in place by {func.overloadpacket.__name__}")
        return func(*args, **kwargs)

    def restore(self) -> None:
        """Put back every written value and every replaced tensor (the mode is off)."""
        with torch.no_grad():
            for tensor, copy in self._saved.values():
                tensor.copy_(copy)
        self._saved.clear()
        for holder, attr, t in self._slots:
            if holder.get(attr) is not t:
                holder[attr] = t
                self.written.setdefault(id(t), "replaced by a new tensor")

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self.restore()


class UnitRecorder:
    """Forward hooks that record the call order, call counts and MACs of every module.

    Use as a context manager around one forward pass; then :meth:`build` classifies the
    tensors into units and resident tensors. A torch function mode watches, meanwhile,
    for owned tensors read outside their module's ``forward``, and the hooks for views of
    them in a module's output.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.stats: dict[str, _CallStats] = {}
        self._handles: list = []
        self._clock = 0
        names = dict(model.named_modules(remove_duplicate=False))
        for name, module in names.items():
            st = self.stats.setdefault(name, _CallStats())
            for attr, kind, tensor in _direct_tensors(module):
                st.places.append(_Place(name, attr, kind, tensor))
        owners = {n for n, st in self.stats.items() if st.places}
        for name in owners:  # mark each owner's owning ancestors (linear in the modules)
            parts = name.split(".") if name else []
            for k in range(len(parts)):
                ancestor = ".".join(parts[:k])
                if ancestor in owners:
                    self.stats[ancestor].children_owning = True
        self._modules = names
        self._owners: dict[int, set[str]] = defaultdict(set)  # id(tensor) -> owning modules
        for name, st in self.stats.items():
            for place in st.places:
                self._owners[id(place.tensor)].add(name)
        self._by_storage: dict[int, set[int]] = defaultdict(set)  # storage -> id(tensor)
        for st in self.stats.values():
            for place in st.places:
                if (key := storage_address(place.tensor)) is not None:
                    self._by_storage[key].add(id(place.tensor))
        self._running: dict[str, int] = defaultdict(int)  # module -> calls in progress
        self._stack: list[str] = []  # the modules running now, outermost first
        self._active: frozenset[str] = frozenset()
        # Which modules were running at every read (or escape) of each owned tensor, and at
        # every call of each module: a module in both for all of a subtree's tensors can
        # bind the whole subtree as one unit (see _merge_subtrees).
        self.read_cover: dict[int, frozenset[str]] = {}
        self.call_cover: dict[str, frozenset[str]] = {}
        self._in_hook = False  # our own hooks' ops are not the model's reads
        self.outside: dict[int, str] = {}  # id(tensor) -> the op that read it outside
        self.escaped: set[int] = set()  # id(tensor) whose view left its module's forward
        # Tensors held in plain attributes (neither parameter nor buffer): never stored,
        # so the skeleton has them only as its factory makes them on device meta.
        self._plain: dict[int, str] = {}  # id(tensor) -> "module.attr"
        for name, module in names.items():
            for attr, value in vars(module).items():
                if attr in ("_parameters", "_buffers", "_modules") or isinstance(value, nn.Module):
                    continue
                for leaf in tree_leaves(value) if isinstance(value, (list, tuple, dict)) else [value]:
                    if isinstance(leaf, torch.Tensor) and not isinstance(leaf, nn.Parameter):
                        self._plain.setdefault(id(leaf), f"{name}.{attr}" if name else attr)
        for tid in self._owners:
            self._plain.pop(tid, None)
        self.plain_reads: dict[str, str] = {}  # "module.attr" -> the op that read it
        self.canonical: dict[int, str] = {}  # id(tensor) -> its first qualified name
        for qual, tensor in _named_state(model):
            self.canonical.setdefault(id(tensor), qual)
        self._mode = _OutsideUse(self)

    def __enter__(self) -> UnitRecorder:
        seen: set[int] = set()
        for name, module in self._modules.items():
            if id(module) in seen:
                continue  # a module registered under two names runs once per call
            seen.add(id(module))
            self._handles.append(module.register_forward_pre_hook(self._pre(name)))
            self._handles.append(module.register_forward_hook(self._post(name)))
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(None, None, None)
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _pre(self, name: str):
        def hook(module: nn.Module, args: tuple) -> None:
            st = self.stats[name]
            if st.first_call < 0:
                st.first_call = self._clock
                self._clock += 1
            st.calls += 1
            self._running[name] += 1
            self.call_cover[name] = self.call_cover.get(name, self._active) & self._active
            self._stack.append(name)
            self._active = frozenset(self._stack)

        return hook

    def _post(self, name: str):
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            self._running[name] -= 1
            if name in self._stack:
                del self._stack[len(self._stack) - 1 - self._stack[::-1].index(name)]
                self._active = frozenset(self._stack)
            self._in_hook = True
            try:
                st = self.stats[name]
                st.macs += module_macs(module, args, output)
                if not st.input_shapes:
                    st.input_shapes = _shapes(args)
                    st.output_shapes = _shapes(output)
                self._note_escapes(output)
            finally:
                self._in_hook = False

        return hook

    def _note_read(self, tid: int) -> None:
        """Narrow the modules that were running at every use of owned tensor ``tid``."""
        cover = self.read_cover.get(tid)
        self.read_cover[tid] = self._active if cover is None else cover & self._active

    def _note_escapes(self, output: object) -> None:
        """Owned tensors that ``output`` holds a view of while no owner of theirs runs."""
        for leaf in tree_leaves(output):
            if isinstance(leaf, torch.Tensor) and (key := storage_address(leaf)) is not None:
                for tid in self._by_storage.get(key, ()):
                    self._note_read(tid)  # the view lives on in the caller
                    if not any(self._running[o] for o in self._owners[tid]):
                        self.escaped.add(tid)

    def build(self, written: dict[int, str] | None = None) -> tuple[list[UnitInfo], list[ResidentTensor], list[str]]:
        """Classify every tensor: ``(units in execution order, resident, unused names)``.

        ``written`` maps ``id`` of each tensor the forward pass wrote to how
        (:attr:`StateGuard.written`): those stay resident. First each module's tensors
        are sorted into streamed, resident and unused (:meth:`_classify`), then subtrees
        that let resident tensors stream become one unit (:meth:`_merge_subtrees`), then
        the streamed modules become units in the order they first ran (:meth:`_units`).
        """
        written = written or {}
        streamed, resident, rescuable, unused = self._classify(written)
        merged = self._merge_subtrees(streamed, resident, rescuable)
        units = self._units(streamed, merged)
        # A tensor counted unused above may also be bound by a module that does run.
        used = {r.name for r in resident.values()} | {p.name for u in units for p in u.params}
        unused = sorted(set(unused) - used)
        return units, list(resident.values()), unused

    def _spec(self, p: _Place) -> ParamSpec:
        """How the manifest describes the tensor at ``p`` (named by its first qualified name)."""
        t = p.tensor
        return ParamSpec(
            name=self.canonical[id(t)],
            attr=p.attr,
            kind=p.kind,
            dtype=dtype_name(t.dtype),
            shape=tuple(t.shape),
            nbytes=t.numel() * t.element_size(),
        )

    def _used_outside(self, p: _Place, written: dict[int, str]) -> str | None:
        """Why the tensor at ``p`` is used while its module is not running (None if it is not):
        the forward pass writes it, an op outside reads it, or a view of it escapes."""
        if id(p.tensor) in written:
            return f"the forward pass writes it ({written[id(p.tensor)]})"
        if id(p.tensor) in self.outside:
            return f"read outside its module's forward (by {self.outside[id(p.tensor)]})"
        if id(p.tensor) in self.escaped:
            return "a view of it leaves its module's forward"
        return None

    def _module_reason(self, st: _CallStats) -> str | None:
        """Why every tensor a module owns stays resident (None if nothing about the module
        keeps them): it never runs, it has owning children, or it runs several times."""
        reason = "its module never runs" if st.calls == 0 else None
        if st.children_owning:
            reason = "owned by a module whose children also own tensors"
        elif st.calls > 1:
            reason = f"module runs {st.calls} times per forward pass"
        return reason

    def _classify(
        self, written: dict[int, str]
    ) -> tuple[dict[str, list[_Place]], dict[int, ResidentTensor], dict[int, _Place], list[str]]:
        """Each module's tensors sorted: ``(streamed places by module, resident tensors by
        id, rescuable places by id, unused names)``.

        A tensor stays resident if several modules bind it, if it is used while its module
        is not running (:meth:`_used_outside`), or for its module (:meth:`_module_reason`);
        resident only for where it is used, it is *rescuable* (:meth:`_merge_subtrees` may
        still stream it). A module that never runs has its tensors unused unless an op reads
        them outside, which keeps them resident.
        """
        places_of: dict[int, list[_Place]] = defaultdict(list)
        for st in self.stats.values():
            for place in st.places:
                places_of[id(place.tensor)].append(place)

        def needed(q: _Place) -> bool:
            return self.stats[q.module].calls > 0 or id(q.tensor) in self.outside

        resident: dict[int, ResidentTensor] = {}
        rescuable: dict[int, _Place] = {}  # resident only for where it is used
        unused: list[str] = []
        streamed: dict[str, list[_Place]] = {}
        for name, st in self.stats.items():
            if not st.places:
                continue
            if st.calls == 0:
                unused.extend(self.canonical[id(p.tensor)] for p in st.places if id(p.tensor) not in self.outside)
                if not any(id(p.tensor) in self.outside for p in st.places):
                    continue
            reason = self._module_reason(st)
            keep: list[_Place] = []
            for p in st.places:
                if st.calls == 0 and id(p.tensor) not in self.outside:
                    continue  # unused
                shared = len({pl.module for pl in places_of[id(p.tensor)]}) > 1
                why = "shared by several modules" if shared else self._used_outside(p, written) or reason
                if why is None:
                    keep.append(p)
                elif id(p.tensor) not in resident:
                    if not shared and id(p.tensor) not in written:
                        rescuable[id(p.tensor)] = p
                    places = tuple(_place_name(q) for q in places_of[id(p.tensor)] if needed(q))
                    resident[id(p.tensor)] = _resident(self._spec(p), places, why)
            if keep:
                streamed[name] = keep
        return streamed, resident, rescuable, unused

    def _units(self, streamed: dict[str, list[_Place]], merged: set[str]) -> list[UnitInfo]:
        """The streamed modules as units, in the order they first ran; a merged subtree's
        unit binds each tensor at its path below the unit and counts the subtree's MACs."""
        units: list[UnitInfo] = []
        for index, name in enumerate(sorted(streamed, key=lambda n: self.stats[n].first_call)):
            st = self.stats[name]
            specs = []
            for p in streamed[name]:
                s = self._spec(p)
                if p.module != name:  # a merged subtree's tensor, bound at its path below the unit
                    s = replace(s, attr=p.module[len(name) + 1 if name else 0 :] + "." + p.attr)
                specs.append(s)
            macs = sum(self.stats[m].macs for m in self._subtree(name)) if name in merged else st.macs
            units.append(
                UnitInfo(
                    index=index,
                    name=name,
                    module_type=type(self._modules[name]).__name__,
                    params=tuple(specs),
                    s=sum(x.nbytes for x in specs),
                    d=len(specs),
                    f=int(macs),
                    calls=st.calls,
                    input_shapes=st.input_shapes,
                    output_shapes=st.output_shapes,
                )
            )
        return units

    def _subtree(self, root: str) -> list[str]:
        """``root`` and every module below it, by qualified name."""
        prefix = root + "." if root else ""
        return [n for n in self.stats if n == root or n.startswith(prefix)]

    def _covers(self, root: str, place: _Place) -> bool:
        """Whether binding ``root``'s subtree around ``root``'s one call covers every use
        of ``place``'s tensor: each read of it, each view of it leaving a module, and each
        call of its module happened while ``root`` was running."""
        if self.stats[root].calls != 1:
            return False
        reads = self.read_cover.get(id(place.tensor))
        if reads is not None and root not in reads:
            return False
        owner = place.module
        return owner == root or self.stats[owner].calls == 0 or root in self.call_cover.get(owner, frozenset())

    def _merge_subtrees(
        self, streamed: dict[str, list[_Place]], resident: dict[int, ResidentTensor], rescuable: dict[int, _Place]
    ) -> set[str]:
        """Stream, as one unit, a module's whole subtree where that lets tensors that would
        otherwise stay resident stream (updating ``streamed`` and ``resident``); returns the
        merged roots.

        A tensor that is resident only because of where it is used (owned by a container,
        read by an ancestor's ``forward`` as ``nn.MultiheadAttention`` reads its
        ``out_proj.weight``, or owned by a module called several times within one call of
        an ancestor) can still stream with the smallest ancestor that runs once and is
        running at every use of it: bound before that ancestor's ``forward``, released
        after it. A subtree is merged only if every tensor it streams today is covered
        too, if no unit outside it runs within its call (units never nest), and only if
        that lowers the model's minimum budget (resident bytes plus the
        largest unit): a block's small scale parameter stays resident rather than make
        the block one unit larger than every layer. The root is never merged: the whole
        model as one unit would only be read again on every call. Deepest subtrees are
        tried first, which keeps units as small as they can be.
        """
        candidates: set[str] = set()
        for place in rescuable.values():
            parts = place.module.split(".") if place.module else []
            for k in range(len(parts), 0, -1):  # the owner, then each ancestor below the root
                root = ".".join(parts[:k])
                if self._covers(root, place):
                    candidates.add(root)
                    break

        def minimum() -> int:
            largest = max((sum(p.tensor.nbytes for p in ps) for ps in streamed.values()), default=0)
            return sum(r.nbytes for r in resident.values()) + largest

        merged: set[str] = set()
        for root in sorted(candidates, key=lambda n: (-(n.count(".") + 1 if n else 0), n)):
            below = set(self._subtree(root))
            absorbed = [n for n in streamed if n in below]
            if any(not self._covers(root, p) for n in absorbed for p in streamed[n]):
                continue
            if any(root in self.call_cover.get(n, frozenset()) for n in streamed if n not in below):
                continue  # another unit runs within root's call (a module passed to its forward)
            rescued = [p for tid, p in rescuable.items() if tid in resident and p.module in below and self._covers(root, p)]
            if not rescued:
                continue
            before = minimum()
            saved = {n: streamed.pop(n) for n in absorbed}
            gone = {id(p.tensor): resident.pop(id(p.tensor)) for p in rescued}
            order = sorted(below, key=lambda n: (self.stats[n].first_call < 0, self.stats[n].first_call, n))
            streamed[root] = [p for n in order for p in [*saved.get(n, ()), *(q for q in rescued if q.module == n)]]
            after = minimum()
            if after >= before:  # undo: the model's minimum would not shrink, and say so
                del streamed[root]
                streamed.update(saved)
                for tid, r in gone.items():
                    resident[tid] = replace(
                        r, reason=f"{r.reason}; streamed with {root} as one unit, it would raise the "
                        f"minimum budget from {format_bytes(before)} to {format_bytes(after)}"
                    )
                continue
            merged -= below
            merged.add(root)
        return merged


def _named_state(model: nn.Module):
    """Every parameter and buffer with its first qualified name (duplicates skipped)."""
    seen: set[int] = set()
    for name, module in model.named_modules(remove_duplicate=False):
        for attr, _kind, tensor in _direct_tensors(module):
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            yield (f"{name}.{attr}" if name else attr), tensor


def _place_name(p: _Place) -> str:
    """``module.attr`` (just ``attr`` on the root module)."""
    return f"{p.module}.{p.attr}" if p.module else p.attr


def _resident(s: ParamSpec, places: tuple[str, ...], reason: str) -> ResidentTensor:
    """The manifest's entry for a resident tensor described by ``s``, bound at ``places``."""
    return ResidentTensor(
        name=s.name, kind=s.kind, dtype=s.dtype, shape=s.shape, nbytes=s.nbytes, places=places, reason=reason,
    )
