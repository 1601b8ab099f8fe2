"""One decode step for every sequence in flight: one engine pass, each unit read once.

Sequences of a batch differ in length and in what they feed this step: a sequence that
joined feeds its whole prompt (its prefill), the others their last token. The step
left-pads both to a common width: each row's cached keys and values to the longest
cache ``P``, its new tokens to the widest feed ``W``, with an attention mask of ``P + W``
that is 1 on the row's real positions only and position ids counted over them. The
model (through the engine: the units streamed once for the whole batch) returns the
logits of each row's last position and the batch's cache, from which each row keeps
its real positions — so a sequence's cache is always its own, unpadded, and sequences
join and leave between any two steps.

A row may also feed tokens to be verified (prompt lookup,
:mod:`~layerfit.schedule.decoding.lookup`): its last token and ``k`` proposals, so the step
keeps the logits of the last ``k + 1`` positions of every row (rows end aligned: the
padding is on the left), and :meth:`BatchStep.verify_run` gives each row the ones it fed;
:func:`crop` then drops the positions of the proposals the model did not accept from
that row's cache (its own tensors: any model the loop serves can crop).

Equality: the padded positions are masked out of attention, so each row's logits are
the model's for that sequence alone up to the order in which longer, padded reductions
add; on the test models that is within a few ulp (about 1e-7 of float32 logits) and the
greedy tokens are the same as alone (``tests/serve/test_generate_batching.py``).

Memory: :func:`kv_bytes_per_token` is what one position of one sequence costs (every
layer's keys and values); a step holds the sequences' own caches, the padded batch
cache it feeds and the one the model returns (:func:`step_kv_bytes`).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from layerfit.errors import LayerfitError
from layerfit.memory_limit import kv_bytes_per_token as counted_kv_bytes
from layerfit.store.manifest import DTYPES


def kv_bytes_per_token(config: Any, dtype: torch.dtype | str = "float32") -> int:
    """Bytes of KV cache one position of one sequence takes (the engine's one rule,
    :func:`layerfit.memory_limit.kv_bytes_per_token`); a config that states no
    layers, heads and head size is refused: the runtime cannot admit what it cannot count."""
    per_token = counted_kv_bytes(config, DTYPES[str(dtype).removeprefix("torch.")].itemsize)
    if not per_token:
        raise LayerfitError(f"{type(config).__name__} states no layers, heads and head size: its KV cache cannot be counted")
    return per_token


def cache_dtype(model: nn.Module) -> torch.dtype:
    """The dtype the model's cache is kept in: its first floating-point parameter's (the
    skeleton's tensors carry their dtype without their bytes)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def step_kv_bytes(lengths: list[int], per_token: int) -> int:
    """What a step of sequences that may grow to ``lengths`` positions holds at most:
    their own caches, and the padded batch cache in and out (rows × the longest, twice)."""
    if not lengths:
        return 0
    return per_token * (sum(lengths) + 2 * len(lengths) * max(lengths))


Layers = list[tuple[torch.Tensor, torch.Tensor]]


class StepEngine(Protocol):
    """What a step needs of an engine (a :class:`~layerfit.Engine`): the skeleton it
    streams, and a call like the model's that streams the units for it."""

    @property
    def model(self) -> nn.Module: ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


@dataclass
class Row:
    """One sequence's part of a step: its cache so far (None before its prefill) and the
    tokens it feeds now, the last ``proposals`` of them to be verified."""

    cache: Layers | None
    length: int  # positions in ``cache``
    feed: list[int]
    proposals: int = 0


class BatchStep:
    """Runs steps of a causal language model through ``engine`` (called like the model)."""

    def __init__(self, engine: StepEngine) -> None:
        self.engine = engine
        model = engine.model
        self.config = model.config
        parameters = inspect.signature(model.forward).parameters
        # transformers 5 names the cache ``cache``; 4 named it ``past_key_values``
        self.cache_keyword = "cache" if "cache" in parameters else "past_key_values"
        self.keep_last = "logits_to_keep" in parameters
        self.steps = 0

    def run(self, rows: list[Row]) -> tuple[torch.Tensor, list[Layers]]:
        """The last position's logits of each row (``[rows, vocab]``) and each row's cache
        after the step (its real positions only)."""
        logits, caches = self.verify_run(rows)
        return torch.stack([row[-1] for row in logits]), caches

    def verify_run(self, rows: list[Row]) -> tuple[list[torch.Tensor], list[Layers]]:
        """Each row's logits of its last ``proposals + 1`` positions (``[proposals + 1,
        vocab]``) and its cache after the step (its real positions, proposals included)."""
        from transformers import DynamicCache

        width = max(len(r.feed) for r in rows)
        past = max(r.length for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), past + width, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, width - len(row.feed):] = torch.tensor(row.feed)
            mask[i, past - row.length:past] = 1
            mask[i, past + width - len(row.feed):] = 1
        cache = DynamicCache(ddp_cache_data=_padded(rows, past) if past else None, config=self.config)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, past:]
        kwargs: dict[str, Any] = {
            "input_ids": ids, "attention_mask": mask, "position_ids": positions,
            self.cache_keyword: cache, "use_cache": True,
        }
        keep = 1 + max(r.proposals for r in rows)
        if self.keep_last:
            kwargs["logits_to_keep"] = keep
        out = self.engine(**kwargs)
        self.steps += 1
        returned = out.get(self.cache_keyword) if hasattr(out, "get") else None
        returned = returned if returned is not None else out.past_key_values
        layers = getattr(returned, "layers", None)
        if layers is None or any(type(layer).__name__ != "DynamicLayer" for layer in layers):
            raise LayerfitError(
                f"{type(self.engine.model).__name__} keeps a cache other than one growing tensor per layer "
                "(sliding windows, recurrent state): the batched decoder cannot split it by sequence"
            )
        real = mask.bool()
        caches = [
            [(layer.keys[i:i + 1, :, real[i]], layer.values[i:i + 1, :, real[i]]) for layer in layers]
            for i in range(len(rows))
        ]
        logits = out.logits[:, -keep:, :]
        return [logits[i, keep - 1 - row.proposals:] for i, row in enumerate(rows)], caches


def crop(cache: Layers, length: int) -> Layers:
    """``cache`` cut to its first ``length`` positions (a sequence's rejected proposals
    dropped: views, copied into the next step's padded cache)."""
    return [(keys[:, :, :length], values[:, :, :length]) for keys, values in cache]


def _padded(rows: list[Row], past: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's keys and values of every row, left-padded with zeros to ``past``."""
    template = next(r.cache for r in rows if r.cache is not None)
    layers = []
    for index, (k0, v0) in enumerate(template):
        keys = k0.new_zeros(len(rows), k0.shape[1], past, k0.shape[3])
        values = v0.new_zeros(len(rows), v0.shape[1], past, v0.shape[3])
        for i, row in enumerate(rows):
            if row.cache is not None and row.length:
                keys[i, :, past - row.length:] = row.cache[index][0][0]
                values[i, :, past - row.length:] = row.cache[index][1][0]
        layers.append((keys, values))
    return layers


__all__ = ["BatchStep", "Row", "StepEngine", "cache_dtype", "crop", "kv_bytes_per_token", "step_kv_bytes"]
