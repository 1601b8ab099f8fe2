"""The whole process within a memory limit: the footprint measured, the rest spent on weights.

A user thinks "this process may use 800 MB", not "the weights may use 300 MB". A memory
limit (``--memory-limit``, ``memory_limit=``) is the process's memory as a memory cgroup
counts it: anonymous memory and the file pages it charges (the interpreter, PyTorch and
transformers, their libraries' code, activations, KV caches, and the weight buffers). The
engine spends on weights what its own footprint leaves:

    weight budget = limit − (anonymous + file pages beside the weights)
                          − activations − KV cache reserved − headroom

The footprint is measured, never a constant: the library pages the imports left resident
are paged out (most never run again), the engine is configured at its minimum budget and
runs its folder's example call twice (:func:`~layerfit.store.examples.example_call`). The
first pass brings back what a pass needs (the library pages it runs, kernels' code and
caches, the ring's pages); the second is measured: its peak resident set above the
resident set it began from is the pass's activations and scratch, and what the process
holds beside the weight buffers before it is the base (its anonymous memory and its
mapped file pages, the libraries a step runs included, so a limit never starves them:
bench/vs_mmap.py found 32 MB of room for library pages livelocked). What the process
grew from the first pass to the second is added again as headroom, beside
:data:`MIN_HEADROOM` for the allocator's slack. A decoder's KV cache grows with each token
beyond the example's: ``kv_positions`` positions of it are reserved
(:func:`kv_bytes_per_token`). A GGUF model's units held for good make values beside their
stored blocks (``made_bytes``), which the weight budget leaves room for.

Where the process already runs in a memory cgroup whose limit is lower than the one
asked, that lower limit is the one that holds, and is used (the caller is told).
Only Linux says all of this (``/proc/self/status``, the cgroup files); elsewhere a memory
limit is refused.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerfit.errors import BudgetError
from layerfit.sizes import format_bytes, parse_bytes

MIN_HEADROOM = 16 * 1024 * 1024
"""Room left beyond the measured footprint for the C allocator's slack (fragmentation,
per-thread arenas) and a pass that allocates a little differently from the measured one."""

_STATUS = Path("/proc/self/status")
_PROC_CGROUP = Path("/proc/self/cgroup")
_CGROUP_ROOT = Path("/sys/fs/cgroup")
_UNITS_EXAMPLE = "e.g. 800MB, 1.5GiB"


@dataclass(frozen=True)
class ProcessMemory:
    """What this process holds now, as the kernel counts it (``/proc/self/status``):
    anonymous pages, mapped file and shared pages, and the resident set's peak."""

    anon_bytes: int
    file_bytes: int
    peak_bytes: int

    @property
    def resident_bytes(self) -> int:
        return self.anon_bytes + self.file_bytes


def process_memory() -> ProcessMemory:
    """This process's memory now (0s where the kernel does not say)."""
    fields: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in _STATUS.read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssFile", "RssShmem", "VmHWM"):
                fields[key] = int(value.split()[0]) * 1024
    return ProcessMemory(
        fields.get("RssAnon", 0), fields.get("RssFile", 0) + fields.get("RssShmem", 0), fields.get("VmHWM", 0)
    )


def machine_memory_bytes() -> int:
    """The machine's physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cgroup_limit_bytes() -> tuple[int, Path] | None:
    """The lowest memory limit of this process's memory cgroup and its ancestors (v1's
    ``memory.limit_in_bytes`` or v2's ``memory.max``) and where it is set; None where no
    limit below the machine's memory holds."""
    machine = machine_memory_bytes()
    best: tuple[int, Path] | None = None
    for limit_file in _cgroup_limit_files():
        with contextlib.suppress(OSError, ValueError):
            text = limit_file.read_text().strip()
            if text != "max" and int(text) < machine and (best is None or int(text) < best[0]):
                best = (int(text), limit_file)
    return best


def cgroup_room_bytes() -> int | None:
    """What this process's memory cgroups still allow: the least, over its cgroup and its
    ancestors that set a limit, of the limit less the usage (v1's ``memory.usage_in_bytes``,
    v2's ``memory.current``); None where none sets one."""
    rooms = []
    for limit_file in _cgroup_limit_files():
        usage = limit_file.with_name("memory.current" if limit_file.name == "memory.max" else "memory.usage_in_bytes")
        with contextlib.suppress(OSError, ValueError):
            text = limit_file.read_text().strip()
            if text != "max" and int(text) < machine_memory_bytes():
                rooms.append(max(int(text) - int(usage.read_text()), 0))
    return min(rooms, default=None)


def _cgroup_limit_files() -> list[Path]:
    """The limit files of this process's memory cgroup (v1 or v2) and of its ancestors."""
    files: list[Path] = []
    with contextlib.suppress(OSError):
        for line in _PROC_CGROUP.read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "":  # v2's unified hierarchy
                base, name = _CGROUP_ROOT, "memory.max"
            elif "memory" in controllers.split(","):
                base, name = _CGROUP_ROOT / "memory", "memory.limit_in_bytes"
            else:
                continue
            directory = base / path.lstrip("/")
            while True:
                files.append(directory / name)
                if directory == base:
                    break
                directory = directory.parent
    return files


def parse_memory_limit(value: str | int) -> int:
    """A memory limit in bytes: a size with its unit (``800MB``; a bare number is refused,
    since a limit of 800 bytes is never meant), at most the machine's memory."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise BudgetError(f"a memory limit is a size, {_UNITS_EXAMPLE}, not {value!r}")
    if isinstance(value, str):
        text = value.strip()
        if text.replace(".", "", 1).isdigit():
            raise BudgetError(f"memory limit {text} has no unit: write a size, {_UNITS_EXAMPLE}")
        if text.endswith("%"):
            raise BudgetError(
                f"memory limit {text} is a share: the limit is this process's memory, {_UNITS_EXAMPLE} "
                "(a share of the model's weights is --budget's)"
            )
    limit = parse_bytes(value)
    machine = machine_memory_bytes()
    if limit > machine:
        raise BudgetError(
            f"memory limit {format_bytes(limit)} is more than this machine's memory ({format_bytes(machine)})"
        )
    if limit == 0:
        raise BudgetError(f"a memory limit of 0 holds nothing: write a size, {_UNITS_EXAMPLE}")
    return limit


def effective_limit(asked: int) -> tuple[int, str | None]:
    """The limit that holds for this process: ``asked``, or the lower limit of the memory
    cgroup it runs in, with a line saying so. Where the kernel does not say what the
    process holds (no ``/proc/self/status``: not Linux), a limit cannot be kept: refused."""
    if not _STATUS.is_file():
        raise BudgetError(
            "a memory limit needs Linux's /proc/self/status to measure this process: give a weight budget "
            "(--budget) instead"
        )
    held = cgroup_limit_bytes()
    if held is None or held[0] >= asked:
        return asked, None
    limit, where = held
    return limit, (
        f"this process runs in a memory cgroup limited to {format_bytes(limit)} ({where}), below the "
        f"{format_bytes(asked)} asked: using {format_bytes(limit)}"
    )


def kv_bytes_per_token(config: Any, itemsize: int) -> int:
    """Bytes of KV cache one position of one sequence takes: layers × 2 (keys, values) ×
    KV heads × head dimension × ``itemsize``, from a Hugging Face config; 0 for a config
    that states no attention layers (a model without a KV cache)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = getattr(text, "num_hidden_layers", None)
    heads = getattr(text, "num_attention_heads", None)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    hidden = getattr(text, "hidden_size", None)
    head_dim = getattr(text, "head_dim", None) or (hidden // heads if heads and hidden else None)
    if not (layers and kv_heads and head_dim):
        return 0
    return int(layers) * 2 * int(kv_heads) * int(head_dim) * itemsize


@dataclass(frozen=True)
class Footprint:
    """The process's memory beside its weights, measured, and the weight budget the limit
    leaves: ``limit_bytes`` (what holds), the base ``anon_bytes`` and ``file_bytes``
    beside the weight buffers, a pass's ``activation_bytes``, the ``kv_bytes`` reserved,
    the ``headroom_bytes`` and the ``weight_budget_bytes`` left."""

    limit_bytes: int
    anon_bytes: int
    file_bytes: int
    activation_bytes: int
    kv_bytes: int
    headroom_bytes: int
    minimum_weight_bytes: int
    requests_bytes: int = 0  # a server's request memory (bodies and their decoding)
    made_bytes: int = 0  # what the weights held for good make beside their stored bytes (GGUF values)

    @property
    def beside_weights_bytes(self) -> int:
        """Everything the limit holds that is not weights."""
        return (self.anon_bytes + self.file_bytes + self.activation_bytes + self.kv_bytes + self.headroom_bytes
                + self.requests_bytes)

    @property
    def weight_budget_bytes(self) -> int:
        """The weights' stored bytes the limit leaves room for (with what they make)."""
        return self.limit_bytes - self.beside_weights_bytes - self.made_bytes

    @property
    def needed_bytes(self) -> int:
        """The least limit that runs the model: the footprint and its minimum weight budget."""
        return self.beside_weights_bytes + self.minimum_weight_bytes

    def check(self, asked_budget: int | None, notice: str | None = None) -> int:
        """The weight budget to run with: what the limit leaves, or ``asked_budget`` (the
        user's ``--budget``) where it fits in that; a limit below what the model needs, or a
        budget the limit cannot hold, is one line saying what it needs."""
        where = "" if notice is None else " (the cgroup's)"
        if self.weight_budget_bytes < self.minimum_weight_bytes:
            raise BudgetError(
                f"memory limit {format_bytes(self.limit_bytes)}{where} cannot run this model: it needs at least "
                f"{format_bytes(self.needed_bytes)} ({self.describe()}, and its minimum weight budget "
                f"{format_bytes(self.minimum_weight_bytes)}); give {suggested_limit(self.needed_bytes)} or more "
                "(the footprint measured varies by a few MB from one run to the next)"
            )
        if asked_budget is not None and asked_budget > self.weight_budget_bytes:
            raise BudgetError(
                f"budget {format_bytes(asked_budget)} does not fit memory limit {format_bytes(self.limit_bytes)}{where}: "
                f"beside this process's {self.describe()}, the limit leaves {format_bytes(self.weight_budget_bytes)} "
                "for weights (give a smaller budget, a larger limit, or either alone)"
            )
        return self.weight_budget_bytes if asked_budget is None else asked_budget

    def describe(self) -> str:
        """The footprint as one phrase (:func:`describe_footprint`)."""
        return describe_footprint(self.to_dict())

    def to_dict(self) -> dict[str, int]:
        """The report's fields (``--json``, metrics), in bytes."""
        return {
            "memory_limit_bytes": self.limit_bytes,
            "footprint_bytes": self.beside_weights_bytes,
            "footprint_anon_bytes": self.anon_bytes,
            "footprint_file_bytes": self.file_bytes,
            "activation_bytes": self.activation_bytes,
            "kv_reserved_bytes": self.kv_bytes,
            "headroom_bytes": self.headroom_bytes,
            "request_memory_bytes": self.requests_bytes,
            "weight_budget_bytes": self.weight_budget_bytes,
            "minimum_weight_bytes": self.minimum_weight_bytes,
            "made_bytes": self.made_bytes,
        }


def describe_footprint(memory: dict[str, int]) -> str:
    """A footprint as one phrase, from its report (:meth:`Footprint.to_dict`, as ``--json``
    and the server's stats carry it): the one wording of the messages and summaries."""
    parts = [
        f"{format_bytes(memory['footprint_anon_bytes'])} anonymous",
        f"{format_bytes(memory['footprint_file_bytes'])} of files",
        f"{format_bytes(memory['activation_bytes'])} for activations",
        f"{format_bytes(memory['kv_reserved_bytes'])} of KV cache",
        *([f"{format_bytes(memory['request_memory_bytes'])} of request memory"] if memory["request_memory_bytes"] else []),
        f"{format_bytes(memory['headroom_bytes'])} headroom",
    ]
    return f"footprint {format_bytes(memory['footprint_bytes'])} ({', '.join(parts)})"


def suggested_limit(needed: int) -> str:
    """A limit to suggest for a measured need: 3 % above it, up to a whole MB."""
    return f"{-(-int(needed * 1.03) // 1_000_000)}MB"


def measured_footprint(
    limit: int, before: ProcessMemory, during_peak: int, weights_bytes: int, grown_bytes: int, kv_bytes: int,
    minimum_weight_bytes: int,
) -> Footprint:
    """The :class:`Footprint` of a measured pass: ``before`` it began (the process's memory,
    ``weights_bytes`` of it the weight buffers), the resident set's peak ``during_peak`` while
    it ran, and what the process ``grown_bytes`` from the pass before it."""
    anon = max(0, before.anon_bytes - weights_bytes)
    return Footprint(
        limit_bytes=limit,
        anon_bytes=anon,
        file_bytes=before.file_bytes,
        activation_bytes=max(0, during_peak - before.resident_bytes),
        kv_bytes=kv_bytes,
        headroom_bytes=MIN_HEADROOM + max(0, grown_bytes),
        minimum_weight_bytes=minimum_weight_bytes,
    )


__all__ = [
    "MIN_HEADROOM",
    "Footprint",
    "ProcessMemory",
    "cgroup_limit_bytes",
    "cgroup_room_bytes",
    "describe_footprint",
    "effective_limit",
    "kv_bytes_per_token",
    "machine_memory_bytes",
    "measured_footprint",
    "parse_memory_limit",
    "process_memory",
    "suggested_limit",
]
