"""One network of one job executing under the scheduler: the engine's unit source.

The network's forward pass runs on its own thread through
:meth:`layerfit.engine.Engine.run_from`, with this object as the unit source. Worker
threads drive it task by task:

- a **load** task reads unit ``i`` through the engine's reader into a fresh aligned
  buffer of exactly the unit's bytes (what the ledger reserved) — :meth:`load`;
- an **execute** task grants unit ``i`` to the forward thread and holds its worker slot
  until the unit's kernel has run — :meth:`execute`; the forward thread blocks in
  :meth:`acquire` until unit ``i`` is loaded *and* granted, and :meth:`release` tells
  the worker it is done. The last unit counts as done only when the forward pass has
  returned, so a network whose tasks are all complete always has its output;
- an **unload** task frees the buffer — :meth:`unload` — or hands it to the runtime's
  weight cache (:meth:`take_unit`), from which a later job's load adopts it.

Ops between units (activations, additions, reshapes) run on the forward thread between
two execute tasks, outside any worker slot.

Everything waits on one condition that shares the runtime's lock; nothing polls.
:meth:`abandon` (the job failed or was cancelled) wakes every waiter: the forward
thread leaves the model by raising from :meth:`acquire`, and buffers are freed as soon
as nothing can reference them.
"""

from __future__ import annotations

import contextlib
import mmap
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from layerfit.engine.engine import Engine
from layerfit.errors import ScheduleError


class Abandoned(ScheduleError):
    """Raised in a network's threads when its job failed or was cancelled."""


@dataclass
class _Unit:
    buffer: mmap.mmap
    tensor: torch.Tensor | None
    nbytes: int

    def free(self) -> None:
        """Drop the tensor and unmap the buffer (later, by the GC, if a view is still alive)."""
        self.tensor = None
        with contextlib.suppress(BufferError):
            self.buffer.close()


class NetworkRun:
    """State shared by a network's forward thread and the workers running its tasks."""

    def __init__(
        self,
        uid: str,
        job_id: str,
        model: str,
        engine: Engine,
        inputs: tuple[Any, ...],
        lock: threading.RLock,
        on_exit: Callable[[NetworkRun], None],
        keywords: dict[str, Any] | None = None,
    ) -> None:
        self.uid = uid
        self.job_id = job_id
        self.model = model
        self.engine = engine
        self.inputs = inputs
        self.keywords = dict(keywords or {})  # a model prepared from keyword arguments
        self.cond = threading.Condition(lock)
        # No unit (no parameters, or every weight resident): the forward pass is the one
        # execute task of the scheduler's single layer, and its load and unload hold nothing.
        self.whole = not engine.blocks
        self.last = max(len(engine.blocks) - 1, 0)
        self._units: dict[int, _Unit] = {}
        self._granted: set[int] = set()
        self._done: set[int] = set()
        self.abandoned = False
        self.finished = False  # the forward pass returned or raised
        self.error: BaseException | None = None
        self.output: Any = None
        self.held_bytes = 0  # bytes of unit buffers alive now
        self.exited = False  # the forward thread has left the model (set by the runtime)
        self._on_exit = on_exit
        self.thread = threading.Thread(
            target=self._forward, name=f"layerfit-forward-{uid}", daemon=True
        )

    # --- the forward thread -----------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def _forward(self) -> None:
        try:
            if self.whole:  # no unit asks for the worker slot: wait for it before running
                with self.cond:
                    self.cond.wait_for(lambda: self.abandoned or 0 in self._granted)
                    if self.abandoned:
                        raise Abandoned(f"network {self.uid} was abandoned before it ran")
            output = self.engine.run_from(self, *self.inputs, **self.keywords)
        except BaseException as exc:  # handed to the job (the runtime fails it)
            with self.cond:
                self.error = exc
                self.finished = True
                self.cond.notify_all()
        else:
            with self.cond:
                self.output = output
                self._done.add(self.last)
                self.finished = True
                self.cond.notify_all()
        finally:
            self.inputs, self.keywords = (), {}
            self._on_exit(self)

    def acquire(self, i: int) -> tuple[torch.Tensor, int]:
        """Block until unit ``i`` is loaded and its execute task holds a worker slot."""
        with self.cond:
            self.cond.wait_for(
                lambda: self.abandoned or (i in self._granted and i in self._units)
            )
            if self.abandoned:
                raise Abandoned(f"network {self.uid} was abandoned (its job failed or was cancelled)")
            tensor = self._units[i].tensor
            assert tensor is not None
            return tensor, 0

    def release(self, i: int) -> None:
        """Unit ``i``'s kernel ran; the last unit completes when the forward pass returns."""
        if i == self.last:
            return
        with self.cond:
            self._done.add(i)
            self.cond.notify_all()

    # --- the workers ------------------------------------------------------------------

    def load(self, i: int, cached: _Unit | None = None) -> int:
        """Read unit ``i`` into a buffer of its own — or adopt ``cached``, the same unit of
        the same model loaded by an earlier job; returns its bytes."""
        if self.whole:
            return 0  # nothing to read
        if cached is not None:
            unit = cached
        else:
            buffer = self.engine.read_unit_buffer(i)
            # Through a memoryview: the tensor then holds an export of the mapping, so
            # free() cannot unmap bytes that a view still points to (close() raises
            # BufferError and the mapping goes with the last view).
            unit = _Unit(buffer, torch.frombuffer(memoryview(buffer), dtype=torch.uint8), len(buffer))
        with self.cond:
            if not self.abandoned:
                self._units[i] = unit
                self.held_bytes += unit.nbytes
                self.cond.notify_all()
                return unit.nbytes
        unit.free()
        raise Abandoned(f"network {self.uid} was abandoned while unit {i} was loading")

    def execute(self, i: int) -> None:
        """Let the forward thread run unit ``i``; return when it has (holds the worker)."""
        with self.cond:
            self._granted.add(i)
            self.cond.notify_all()
            self.cond.wait_for(lambda: i in self._done or self.finished)
            if i in self._done:
                return
            if self.error is not None:
                raise self.error
            raise Abandoned(f"network {self.uid} stopped before unit {i} ran")

    def take_unit(self, i: int) -> _Unit | None:
        """Hand unit ``i``'s buffer over instead of freeing it (to the weight cache)."""
        with self.cond:
            unit = self._units.pop(i, None)
            if unit is not None:
                self.held_bytes -= unit.nbytes
            return unit

    def unload(self, i: int) -> int:
        """Free unit ``i``'s buffer; returns the bytes freed."""
        with self.cond:
            unit = self._units.pop(i, None)
            if unit is None:
                return 0
            self.held_bytes -= unit.nbytes
        unit.free()
        return unit.nbytes

    # --- the runtime ------------------------------------------------------------------

    def abandon(self) -> None:
        """The job is over without this network: wake everyone, stop the forward pass."""
        with self.cond:
            self.abandoned = True
            self.cond.notify_all()

    def free_all(self) -> int:
        """Free every buffer still held (after the forward thread has left the model)."""
        with self.cond:
            units = list(self._units.values())
            self._units.clear()
            self.held_bytes = 0
        for unit in units:
            unit.free()
        return sum(u.nbytes for u in units)


__all__ = ["Abandoned", "NetworkRun"]
