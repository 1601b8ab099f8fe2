"""How an engine runs a prepared model: every setting, typed and checked once.

:class:`EngineConfig` is what the boundary (command line, HTTP settings, the Python
API's keyword arguments) turns its text into; below it code passes this value and
never re-reads a string. Each default is stated here, once. Importing this module
imports no PyTorch, so the command line reads its defaults at start-up for free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from layerfit.engine.policies import AUTO, resolve_pipeline
from layerfit.errors import LayerfitError
from layerfit.sizes import Budget, parse_bytes

ACTIVATION_MODES = ("default", "planned")
"""PyTorch allocates activations, or one arena planned for them (:mod:`layerfit.engine.arena`)."""

DEFAULT_COALESCE_BYTES = 4 * 1024 * 1024
"""Bytes one read may gather of adjacent units (``4MiB``; see :class:`EngineConfig`)."""

Units = str | tuple[int, ...]
"""``layers``, ``blocks:N``, ``merge:SIZE`` or the partition points."""


@dataclass(frozen=True)
class EngineConfig:
    """An engine's settings.

    ``budget`` bounds the weight buffers (resident tensors plus the unit buffers; None:
    the pipeline's own size). ``pipeline`` is ``auto`` (``preload`` when the budget holds
    every weight or none is given, else ``async`` keeping units resident with the room
    beyond its buffer), ``preload``, ``sequential``, ``sync``, ``async`` or ``external``.
    ``units`` groups layers into streamed units. ``direct_io`` reads with O_DIRECT.
    ``trace`` records a timeline of each pass. ``binding`` is ``reference`` (zero-copy)
    or an ablation mode of :mod:`layerfit.engine.binding`. ``activations`` is
    ``default`` or ``planned`` (:mod:`layerfit.engine.arena`). ``coalesce_bytes`` lets
    the reader read adjacent units in one request of up to that many bytes (0: one unit
    per request, as the paper). ``device`` is ``cpu``, ``cuda`` or ``cuda:N``; ``stages``
    2 or 3 (None: the device's default). ``gather_rows`` reads an embedding table by
    the rows its ids look up (and a module of routed experts by the experts its router
    chose). ``read_ahead``: when a streamed pass ends (from its last unit not kept on),
    the next one's first units are read into the read buffer while the caller works
    (:mod:`layerfit.engine.read_ahead`; two stages, async and ``auto``; on by default: a
    decode step of a 2.1 GB Llama 3-5 % faster at three of four budgets, and none slower
    beyond the noise; off, every read of a pass is its own). ``expert_cache``: under
    ``auto``, what the budget leaves beyond the read buffer holds single experts as they
    are used (:mod:`layerfit.engine.expert_cache`); off, the read buffer takes it.
    ``expert_prefetch``: the next MoE layer's experts are guessed by its router from the
    input of the router before it (kept in memory for it) and read ahead by the reader
    into that layer's compact place (:mod:`layerfit.engine.expert_guess`).
    ``verify`` says when a unit's SHA-256 is checked. ``dequantize`` (a model prepared
    from a GGUF file, its weights stored as GGML blocks): each is dequantized when bound
    to the values transformers' GGUF loader gives, so outputs are bit-equal to its model;
    off (default), a linear layer's weight runs packed (Q4_0, Q4_1, Q4_K on PyTorch's int4
    kernels, other types in bfloat16: :mod:`layerfit.engine.int4_packed`), faster, within
    the tolerance that module states. ``memory_limit`` (bytes) bounds the whole process,
    not the weights alone: the engine measures its footprint at load and spends what the
    limit leaves on weights, ``budget`` then at most that (:mod:`layerfit.memory_limit`);
    ``kv_positions`` positions of KV cache are reserved in it for a decoder's generation,
    and ``kv_beside_bytes`` more for a model that generates beside it (``generate
    --draft``'s draft, whose cache grows with the same positions).
    """

    budget: Budget | None = None
    pipeline: str = AUTO
    units: Units = "layers"
    direct_io: bool = True
    trace: bool = False
    binding: str = "reference"
    activations: str = "default"
    coalesce_bytes: int = DEFAULT_COALESCE_BYTES
    device: str = "cpu"
    stages: int | None = None
    gather_rows: bool = True
    read_ahead: bool = True
    expert_cache: bool = True
    expert_prefetch: bool = True
    verify: str = "first"
    dequantize: bool = False
    memory_limit: int | None = None
    kv_positions: int = 0
    kv_beside_bytes: int = 0

    def __post_init__(self) -> None:
        # (imported here: the command line reads the defaults without importing torch)
        from layerfit.engine.binding import get_binder
        from layerfit.engine.units import check_units_spec
        from layerfit.store.verify import VERIFY_MODES

        if self.verify not in VERIFY_MODES:
            raise LayerfitError(f"verify must be one of {', '.join(VERIFY_MODES)}, not {self.verify!r}")
        if self.activations not in ACTIVATION_MODES:
            raise LayerfitError(
                f"unknown activations mode {self.activations!r}; choose one of {', '.join(ACTIVATION_MODES)}"
            )
        if self.device != "cpu" and self.activations != "default":
            raise LayerfitError("planned activations are laid out in host memory: use activations='default' on cuda")
        if self.memory_limit is not None and self.device != "cpu":
            raise LayerfitError("a memory limit bounds this process's host memory: it runs on device cpu")
        if isinstance(self.kv_positions, bool) or not isinstance(self.kv_positions, int) or self.kv_positions < 0:
            raise LayerfitError(f"kv_positions must be a whole number of positions, 0 or more, not {self.kv_positions!r}")
        if isinstance(self.kv_beside_bytes, bool) or not isinstance(self.kv_beside_bytes, int) or self.kv_beside_bytes < 0:
            raise LayerfitError(f"kv_beside_bytes must be a whole number of bytes, 0 or more, not {self.kv_beside_bytes!r}")
        resolve_pipeline(self.pipeline, 0, None)  # an unknown name is refused here
        get_binder(self.binding)
        check_units_spec(self.units)

    @classmethod
    def parse(
        cls,
        *,
        budget: Budget | int | str | None = None,
        units: str | Sequence[int] = "layers",
        coalesce: int | str = DEFAULT_COALESCE_BYTES,
        memory_limit: int | str | None = None,
        **settings: Any,
    ) -> EngineConfig:
        """The config the Python API's keyword arguments denote: ``budget`` as
        :meth:`Budget.parse` reads it, ``units`` a spec or partition points,
        ``coalesce`` bytes or a size (``0``: none), ``memory_limit`` bytes or a size with
        its unit; the rest as the fields."""
        from layerfit.memory_limit import parse_memory_limit

        return cls(
            memory_limit=None if memory_limit is None else parse_memory_limit(memory_limit),
            budget=None if budget is None else Budget.parse(budget),
            units=units if isinstance(units, str) else tuple(units),
            coalesce_bytes=0 if coalesce in (0, "0") else parse_bytes(coalesce),
            **settings,
        )

    def replace(self, **changes: Any) -> EngineConfig:
        """This config with ``changes`` (checked as a new one)."""
        return dataclasses.replace(self, **changes)


__all__ = ["ACTIVATION_MODES", "DEFAULT_COALESCE_BYTES", "EngineConfig", "Units"]
