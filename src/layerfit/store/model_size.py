"""The size rule: a Hugging Face config's model counted before anything is built.

A ``config.json`` is data from someone else, and transformers allocates whatever it
describes: ``num_hidden_layers: 100000, hidden_size: 65536`` would allocate until the
process is killed. So ``prepare hf:`` counts the model the config describes, cheapest
count first, against what the folder and the machine hold (:func:`check_size`), and
refuses in one line, before the model is built, one that

1. has more layers than the weights present store tensors, or more parameters (a lower
   bound from the config's fields, :func:`config_lower_bound`, then the exact count of a
   build on the meta device, :func:`meta_parameters`) than :data:`SIZE_FACTOR` x the
   elements of the weights present (+ :data:`SIZE_SLACK`): the config does not belong
   to these weights;
2. at the chosen dtype has more bytes of weights than the output's file system has free;
3. converting the dtype (a copy of every weight in memory), has more than the memory
   available to the process (:func:`available_memory`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from layerfit.errors import InputError
from layerfit.memory_limit import cgroup_room_bytes
from layerfit.sizes import format_bytes
from layerfit.store.manifest import HF_CONFIG as CONFIG
from layerfit.store.mapped_safetensors import Checkpoint
from layerfit.store.transformers_calls import dtype_keyword, quiet_transformers

SIZE_FACTOR = 2
"""How many times the elements of the weights present a config's model may have (tied
tensors stored twice, a head's few extra parameters): a model needing more cannot get its
weights from the folder, and building it allocates what the folder does not hold."""
SIZE_SLACK = 2**20  # elements: a tiny model's config may add a small head's worth


def config_lower_bound(config: Any) -> tuple[int, int, str]:
    """A lower bound of the parameters the config's model has, from its fields alone (no
    build): a layer holds at least one hidden x hidden matrix and the embedding vocab x
    hidden; ``(count, layers, how)``, 0 for what the config does not state."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config

    def whole(name: str) -> int:
        value = getattr(text, name, None)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    hidden, layers, vocab = whole("hidden_size"), whole("num_hidden_layers"), whole("vocab_size")
    how = f"num_hidden_layers {layers:,}, hidden_size {hidden:,}, vocab_size {vocab:,}"
    return layers * hidden * hidden + vocab * hidden, layers, how


def meta_parameters(cls: type[nn.Module], config: Any, dtype: torch.dtype) -> int | None:
    """The parameters (shared ones once) of ``cls`` built from ``config`` on the meta
    device: exact, and nothing allocated; None where transformers cannot build it so
    (its load then says why)."""
    try:
        with quiet_transformers(), torch.device("meta"):
            model = cls._from_config(config, **{dtype_keyword(): dtype})  # type: ignore[attr-defined]
    except Exception:  # the real build reports the config's fault in its own words
        return None
    return sum(p.numel() for p in model.parameters())


def available_memory() -> int | None:
    """Bytes this process may still allocate: MemAvailable, or less where one of its memory
    cgroups leaves less (:func:`~layerfit.memory_limit.cgroup_room_bytes`); None where
    neither can be read."""
    found: list[int] = []
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    room = cgroup_room_bytes()  # the process's own cgroups, v1 or v2, ancestors included
    if room is not None:
        found.append(room)
    return min(found) if found else None


def check_size(
    folder: Path, config: Any, cls: type[nn.Module], checkpoint: Checkpoint, dtype: torch.dtype, free_disk: int | None,
    *, described: str | None = None, converts: bool = False,
) -> None:
    """Refuse, in one line and before anything is built, a model the config describes
    that this folder or machine cannot hold. The rule:

    1. its layers are at most the tensors stored, and its parameters (a lower bound from
       the config's fields first, then the exact count of a build on the meta device) at
       most :data:`SIZE_FACTOR` x the elements of the weights present (+ :data:`SIZE_SLACK`):
       more cannot come from the folder (and the meta build is bounded by the weights);
    2. its weights at the chosen dtype fit ``free_disk``, the output's free space;
    3. converting the dtype (a copy of every weight in memory), they fit the memory
       available to the process (always where ``converts``: a GGUF file's weights are
       dequantized to build the model).

    ``described`` names what holds the config in a refusal (a GGUF file), by default the
    folder's ``config.json``.
    """
    present = checkpoint.elements
    allowed = SIZE_FACTOR * present + SIZE_SLACK
    bound, layers, how = config_lower_bound(config)
    stored = f"the weights present hold {present:,} ({format_bytes(checkpoint.nbytes)})"
    if bound > allowed:
        raise InputError(
            f"{described or folder / CONFIG} describes a model of at least {bound:,} parameters ({how}); {stored}: the config "
            "does not belong to these weights"
        )
    tensors = len(checkpoint.names())
    if layers > tensors:  # every layer stores at least one tensor
        raise InputError(
            f"{described or folder / CONFIG} describes {layers:,} layers and the weights present hold {tensors:,} tensors: "
            "the config does not belong to these weights"
        )
    exact = meta_parameters(cls, config, dtype)
    if exact is None:
        exact = bound
    elif exact > allowed:
        raise InputError(
            f"{described or folder / CONFIG} describes a model of {exact:,} parameters; {stored}: the config does not belong "
            "to these weights"
        )
    need = exact * dtype.itemsize
    if free_disk is not None and need > free_disk:
        raise InputError(
            f"preparing {folder} writes {format_bytes(need)} of weights and the output's file system has "
            f"{format_bytes(free_disk)} free: free some space or choose another output folder"
        )
    memory = available_memory()
    if (converts or checkpoint.stored_dtype() not in (None, dtype)) and memory is not None and need > memory:
        if converts:
            raise InputError(
                f"building {folder}'s model dequantizes its weights to {format_bytes(need)} of "
                f"{str(dtype).removeprefix('torch.')} in memory and {format_bytes(memory)} is available: prepare it "
                "on a machine with more memory (the prepared folder runs within any budget)"
            )
        raise InputError(
            f"converting {folder}'s weights to {str(dtype).removeprefix('torch.')} holds {format_bytes(need)} in "
            f"memory and {format_bytes(memory)} is available: prepare without --dtype (as stored), or on a "
            "machine with more memory"
        )
