"""How many bytes of tensors a forward pass holds at once, as eager PyTorch runs it.

The tensor usage records (:mod:`layerfit.capture.activations`) describe the pass an
activation planner would lay out: with hooks they see only what leaf modules hand each
other, so the attention scores of a transformer, or a key/value cache made by functional
code and returned inside an output object, are missing; and they count an elementwise
module's output as written over its input, which eager PyTorch does not do for batch
normalisation. A scheduler that admits a network by its activations needs what the pass
really allocates. :class:`PassAllocations` watches every operator the pass dispatches
and counts each new storage from the operator that makes it until the last tensor
viewing it is gone, so its peak is the most bytes of tensors the pass held at once.

The pass's inputs count from the start (the caller holds them throughout), as they do
in the usage records; the model's weights and buffers never count, nor does what a
kernel allocates and frees inside one operator (scratch), nor the allocator's overhead.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["PassAllocations"]


def _storage(t: torch.Tensor) -> tuple[int, int] | None:
    """``(address, bytes)`` of the storage under ``t``; None for tensors with none."""
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse, nested and other layouts
        return None
    address = storage.data_ptr()
    return (address, storage.nbytes()) if address else None


def _storages(tensors: Iterable[Any]) -> dict[int, int]:
    """``{address: bytes}`` of the distinct storages under the tensors in ``tensors``
    (nested in tuples, lists and dicts)."""
    return dict(
        key for t in tree_leaves(list(tensors))
        if isinstance(t, torch.Tensor) and (key := _storage(t)) is not None
    )


class PassAllocations(TorchDispatchMode):
    """A dispatch mode that tracks the bytes of storages created while it is active.

    ``peak`` is the largest total of live bytes seen; ``live`` what is live now (after
    the pass: its inputs, its outputs and whatever the model kept). The storages under
    ``inputs`` count as live throughout, those under ``weights`` never count. A new
    storage is live while any tensor created under the mode views it (counted by weak
    references, so the mode keeps nothing alive itself).
    """

    def __init__(self, weights: Iterable[Any] = (), inputs: Iterable[Any] = ()) -> None:
        super().__init__()
        held = _storages(inputs)
        self._existing = set(_storages(weights)) | set(held)
        self._views: dict[int, list[int]] = {}  # address -> [bytes, live tensors viewing it]
        # the weak references themselves, by id: a set would compare two references to one
        # tensor by comparing the tensors
        self._refs: dict[int, weakref.ref] = {}
        self.live = self.peak = sum(held.values())

    def _gone(self, ref: weakref.ref, address: int) -> None:
        self._refs.pop(id(ref), None)
        entry = self._views.get(address)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            del self._views[address]
            self.live -= entry[0]

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or (key := _storage(t)) is None:
                continue
            address, nbytes = key
            if address in self._existing:
                continue
            entry = self._views.get(address)
            if entry is None:
                entry = self._views[address] = [nbytes, 0]
                self.live += nbytes
                self.peak = max(self.peak, self.live)
            entry[1] += 1
            ref = weakref.ref(t, lambda ref, a=address: self._gone(ref, a))
            self._refs[id(ref)] = ref
        return out
