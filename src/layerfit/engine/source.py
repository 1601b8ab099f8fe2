"""Unit sources: who supplies a unit's weight bytes to the engine's hooks.

By default the engine supplies units itself: its reader thread reads them, in order,
into its circular buffer (:mod:`layerfit.engine.ring`). A *unit source* replaces that
for one inference (:meth:`layerfit.engine.Engine.run_from`): the multi-request
scheduler (:mod:`layerfit.schedule.runtime.executor`) reads units in load tasks, into memory it
budgets across many models, and lets a unit execute only when its execute task holds a
worker slot. The forward pass, the hooks and binding by reference stay the engine's;
only where the bytes come from and when the kernel may start change.
"""

from __future__ import annotations

from typing import Protocol

import torch


class UnitSource(Protocol):
    """Supplies the bytes of engine unit ``i`` (a block of the prepared model).

    The engine calls :meth:`acquire` in unit ``i``'s forward pre-hook, binds the unit's
    tensors as views of ``buffer[offset:offset + nbytes]``, runs the unit, unbinds, and
    calls :meth:`release` in its forward post-hook. Both are called from the thread that
    runs the forward pass; ``acquire`` may block (until the unit is loaded and allowed
    to run) and may raise to abandon the inference, which the engine propagates.
    """

    def acquire(self, i: int) -> tuple[torch.Tensor, int]:
        """``(uint8 buffer, offset)`` holding unit ``i``'s bytes, once it may execute."""
        ...

    def release(self, i: int) -> None:
        """Unit ``i`` finished executing and nothing references its bytes any more."""
        ...


__all__ = ["UnitSource"]
