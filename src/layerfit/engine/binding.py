"""How a unit's weights are attached to the skeleton when its kernel starts.

``reference`` is what the engine does: the skeleton's tensors become zero-copy views of
the read buffer (SwapNet's zero-copy swap-in plus assembly by reference, Sections 4-5).
The two other modes exist only to measure what those designs save (SwapNet's ablation,
Section 8.3); they do the work SwapNet removes, inside the same engine:

* ``copy`` (paper: w/o-uni-add) - every tensor is copied out of the read buffer into a
  fresh tensor, as ``.to(device)`` does when the buffer is not in unified memory, and the
  copies are bound. They live until the unit is unbound.
* ``instantiate`` (paper: w/o-mod-ske) - the unit's modules are instantiated anew, with
  freshly initialised parameters as building a model object does (the "dummy model"),
  and ``load_state_dict`` copies the read bytes into them; the dummy's tensors are bound
  and dropped on unbind.

Both extra copies are counted in :attr:`Binder.peak_bytes`, which the engine adds to its
weight ledger, so the ablation's memory cost is visible in the engine's own numbers.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from layerfit.engine.skeleton import Binding, bind, unbind
from layerfit.errors import LayerfitError


class Binder:
    """Attach (``bind``) and detach (``unbind``) one unit's tensors; by reference here."""

    name = "reference"

    def __init__(self) -> None:
        self.extra_bytes = 0  # bytes held outside the read buffer right now
        self.peak_bytes = 0  # their peak since the last reset
        self._made: dict[int, int] = {}  # id(first binding) -> dequantized bytes it holds
        # whether bound units may make bytes (a model with GGML blocks): the engine says so
        # once, so a float model's per-unit bind does not look at every binding
        self.counts_made = False

    def bind(self, bindings: list[Binding], buffer: torch.Tensor, base: int) -> None:
        """Bind a unit for the pass that streams it (its weights computed in bf16 in the packed
        mode stay blocks: :mod:`.int4_packed`); what it makes is counted until unbound."""
        bind(bindings, buffer, base, streamed=True)
        made = sum(b.made_when(streamed=True) for b in bindings) if self.counts_made else 0
        if made:  # a quantized unit's values live beside the read buffer until unbound
            self._made[id(bindings[0])] = made
            self._hold(made)

    def unbind(self, bindings: list[Binding]) -> None:
        unbind(bindings)
        if bindings and self._made:
            self.extra_bytes -= self._made.pop(id(bindings[0]), 0)

    def reset(self) -> None:
        """Forget the peak (at the start of an inference)."""
        self.peak_bytes = self.extra_bytes

    def _hold(self, nbytes: int) -> None:
        self.extra_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.extra_bytes)


class CopyBinder(Binder):
    """No zero-copy swap-in: bind fresh copies of the read bytes."""

    name = "copy"

    def __init__(self) -> None:
        super().__init__()
        self._held: dict[int, int] = {}  # id(first binding) -> bytes

    def bind(self, bindings: list[Binding], buffer: torch.Tensor, base: int) -> None:
        total = 0
        for b in bindings:
            b.attach(b.view(buffer, base + b.offset).detach().clone())
            total += b.nbytes
        if bindings:
            self._held[id(bindings[0])] = total
            self._hold(total)

    def unbind(self, bindings: list[Binding]) -> None:
        unbind(bindings)
        if bindings:
            self.extra_bytes -= self._held.pop(id(bindings[0]), 0)


class InstantiateBinder(Binder):
    """No assembly by reference: instantiate the unit's modules, ``load_state_dict``."""

    name = "instantiate"

    def __init__(self) -> None:
        super().__init__()
        self._dummies: dict[int, tuple[list[nn.Module], int]] = {}

    def bind(self, bindings: list[Binding], buffer: torch.Tensor, base: int) -> None:
        by_module: dict[int, tuple[nn.Module, list[Binding]]] = {}
        for b in bindings:
            by_module.setdefault(id(b.module), (b.module, []))[1].append(b)
        dummies, total = [], 0
        for module, group in by_module.values():
            dummy = copy.deepcopy(module)
            dummy._forward_hooks.clear()
            dummy._forward_pre_hooks.clear()
            dummy = dummy.to_empty(device="cpu")
            if hasattr(dummy, "reset_parameters"):
                dummy.reset_parameters()  # the random weights of a freshly built model
            state = {}
            for b in group:
                state[b.attr] = b.view(buffer, base + b.offset)
            dummy.load_state_dict(state, strict=False)
            for b in group:
                source = dummy._parameters if b.kind == "param" else dummy._buffers
                b.attach(source[b.attr].detach())
            total += sum(t.numel() * t.element_size() for t in dummy.state_dict().values())
            dummies.append(dummy)
        if bindings:
            self._dummies[id(bindings[0])] = (dummies, total)
            self._hold(total)

    def unbind(self, bindings: list[Binding]) -> None:
        unbind(bindings)
        if bindings:
            _, total = self._dummies.pop(id(bindings[0]), ([], 0))
            self.extra_bytes -= total


BINDERS: dict[str, Callable[[], Binder]] = {
    "reference": Binder,
    "copy": CopyBinder,
    "instantiate": InstantiateBinder,
}


def get_binder(name: str, *, counts_made: bool = False) -> Binder:
    """A fresh binder for mode ``name`` (``counts_made``: the model has GGML blocks, whose
    bound values it counts); a clear error listing the modes otherwise."""
    try:
        binder = BINDERS[name]()
    except KeyError:
        raise LayerfitError(f"unknown binding mode {name!r}: choose one of {', '.join(BINDERS)}") from None
    binder.counts_made = counts_made
    return binder
