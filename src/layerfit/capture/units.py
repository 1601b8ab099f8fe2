"""Which modules become streamed units, in which order, and which tensors stay resident.

A unit is a module that owns parameters or buffers directly and has no descendant that
owns any (a "leaf owner"), and that runs exactly once per forward pass. Its tensors can
be brought in just before it runs and dropped right after. Everything else that holds
tensors is *resident*: shared or tied tensors (bound at several places), tensors owned
by a container whose children also own tensors, and tensors of a module called several
times. Modules that never run in the forward pass are reported as unused and not stored.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch import nn

from layerfit.capture.graph import ParamSpec, ResidentTensor, UnitInfo
from layerfit.capture.macs import module_macs


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


class UnitRecorder:
    """Forward hooks that record the call order, call counts and MACs of every module.

    Use as a context manager around one forward pass; then :meth:`build` classifies the
    tensors into units and resident tensors.
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
        for name in owners:
            for other in owners:
                if other != name and (name == "" or other.startswith(name + ".")):
                    self.stats[name].children_owning = True
                    break
        self._modules = names

    def __enter__(self) -> UnitRecorder:
        seen: set[int] = set()
        for name, module in self._modules.items():
            if id(module) in seen:
                continue  # a module registered under two names runs once per call
            seen.add(id(module))
            self._handles.append(module.register_forward_pre_hook(self._pre(name)))
            self._handles.append(module.register_forward_hook(self._post(name)))
        return self

    def __exit__(self, *exc: object) -> None:
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

        return hook

    def _post(self, name: str):
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            st = self.stats[name]
            st.macs += module_macs(module, args, output)
            if not st.input_shapes:
                st.input_shapes = _shapes(args)
                st.output_shapes = _shapes(output)

        return hook

    def build(self) -> tuple[list[UnitInfo], list[ResidentTensor], list[str]]:
        """Classify every tensor: ``(units in execution order, resident, unused names)``."""
        canonical: dict[int, str] = {}
        for qual, tensor in _named_state(self.model):
            canonical.setdefault(id(tensor), qual)
        places_of: dict[int, list[_Place]] = defaultdict(list)
        for st in self.stats.values():
            for place in st.places:
                places_of[id(place.tensor)].append(place)

        def place_str(p: _Place) -> str:
            return f"{p.module}.{p.attr}" if p.module else p.attr

        def spec(p: _Place) -> ParamSpec:
            t = p.tensor
            return ParamSpec(
                name=canonical[id(t)],
                attr=p.attr,
                kind=p.kind,
                dtype=dtype_name(t.dtype),
                shape=tuple(t.shape),
                nbytes=t.numel() * t.element_size(),
            )

        resident: dict[int, ResidentTensor] = {}
        unused: list[str] = []
        streamed: list[tuple[int, str, _CallStats]] = []
        for name, st in self.stats.items():
            if not st.places:
                continue
            if st.calls == 0:
                unused.extend(canonical[id(p.tensor)] for p in st.places)
                continue
            reason = None
            if st.children_owning:
                reason = "owned by a module whose children also own tensors"
            elif st.calls > 1:
                reason = f"module runs {st.calls} times per forward pass"
            keep: list[_Place] = []
            for p in st.places:
                shared = len({pl.module for pl in places_of[id(p.tensor)]}) > 1
                why = "shared by several modules" if shared else reason
                if why is None:
                    keep.append(p)
                elif id(p.tensor) not in resident:
                    s = spec(p)
                    resident[id(p.tensor)] = ResidentTensor(
                        name=s.name,
                        kind=s.kind,
                        dtype=s.dtype,
                        shape=s.shape,
                        nbytes=s.nbytes,
                        places=tuple(
                            place_str(q)
                            for q in places_of[id(p.tensor)]
                            if self.stats[q.module].calls > 0
                        ),
                        reason=why,
                    )
            if keep:
                streamed.append((st.first_call, name, st))
        streamed.sort()
        units: list[UnitInfo] = []
        for index, (_, name, st) in enumerate(streamed):
            specs = tuple(
                spec(p)
                for p in st.places
                if id(p.tensor) not in resident
            )
            units.append(
                UnitInfo(
                    index=index,
                    name=name,
                    module_type=type(self._modules[name]).__name__,
                    params=specs,
                    s=sum(x.nbytes for x in specs),
                    d=len(specs),
                    f=int(st.macs),
                    calls=st.calls,
                    input_shapes=st.input_shapes,
                    output_shapes=st.output_shapes,
                )
            )
        # A tensor counted unused above may also be bound by a module that does run.
        used = {r.name for r in resident.values()} | {p.name for u in units for p in u.params}
        unused = sorted(set(unused) - used)
        return units, list(resident.values()), unused


def _named_state(model: nn.Module):
    """Every parameter and buffer with its first qualified name (duplicates skipped)."""
    seen: set[int] = set()
    for name, module in model.named_modules(remove_duplicate=False):
        for attr, _kind, tensor in _direct_tensors(module):
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            yield (f"{name}.{attr}" if name else attr), tensor
