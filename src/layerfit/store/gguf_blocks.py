"""Which GGUF blocks hold each weight of the model transformers built from the file.

transformers' GGUF loader dequantizes every tensor and then, per architecture, renames,
reorders rows (Llama's query and key heads), stacks (a MoE's experts, gate beside up),
transposes (GPT-2's ``Conv1D``) or computes (Gemma's norms) to make its own weights. To
store the *quantized* bytes instead, without restating those rules per architecture,
:func:`find_blocks` finds each weight's rows among the file's dequantized rows: a GGML
block never spans two rows, so any weight made of whole rows of the file (in any order,
from any of its tensors) is exactly those rows' blocks, gathered. The match is checked,
not trusted: the gathered blocks are dequantized again and compared with the weight bit
for bit. A weight whose rows are not the file's (computed, or a float tensor) is stored
as transformers made it.

The dequantizer is transformers' own where it has one (5.x,
``transformers.integrations.gguf.dequant``), else ``gguf``'s, the one transformers 4.x
loads with: the values matched are the values of transformers' model.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from layerfit.store.gguf_file import GGUFFile, GGUFTensor, tensor_bytes
from layerfit.store.manifest import Encoding

FLOAT_TYPES = ("F32",)  # stored as transformers makes them: blocks would save nothing
Dequantizer = Callable[[np.ndarray, GGUFTensor], torch.Tensor]


@dataclass(frozen=True)
class StoredBlocks:
    """A weight's bytes as GGML blocks: its rows' blocks in the model's order."""

    data: torch.Tensor  # uint8, one dimension
    encoding: Encoding


def find_blocks(module: nn.Module, gguf: GGUFFile) -> dict[int, StoredBlocks]:
    """``id(tensor) -> blocks`` for each weight of ``module`` made of whole rows of
    ``gguf``'s quantized (or half-precision) tensors, checked bit for bit."""
    dequantize = _dequantizer()
    weights = _weights(module)
    if not weights:
        return {}
    index = _RowIndex(gguf, dequantize, {t.dtype for t in weights.values()})
    found: dict[int, StoredBlocks] = {}
    for key, weight in weights.items():
        for transposed in (False, True):
            value = weight.transpose(-1, -2) if transposed else weight
            stored = index.gather(value, transposed)
            if stored is not None:
                found[key] = stored
                break
    return found


def _weights(module: nn.Module) -> dict[int, torch.Tensor]:
    """The module's floating tensors of two or more dimensions, once each (tied ones once)."""
    out: dict[int, torch.Tensor] = {}
    for t in [*module.parameters(), *module.buffers()]:
        if t.dim() >= 2 and t.is_floating_point() and t.numel() and id(t) not in out:
            out[id(t)] = t.detach()
    return out


class _RowIndex:
    """Every row of the file's non-float tensors by a digest of its dequantized bytes (at
    each dtype the model holds), read one tensor at a time."""

    def __init__(self, gguf: GGUFFile, dequantize: Dequantizer, dtypes: set[torch.dtype]) -> None:
        self.gguf = gguf
        self.dequantize = dequantize
        self.tensors = [t for t in gguf.tensors if t.ggml_type.name not in FLOAT_TYPES and len(t.shape) >= 1]
        self.rows: dict[bytes, list[tuple[int, int]]] = {}
        for i, t in enumerate(self.tensors):
            values = dequantize(self._raw(t), t).reshape(-1, t.shape[-1])
            for dtype in dtypes:
                for row, digest in enumerate(_digests(values.to(dtype))):
                    self.rows.setdefault(digest, []).append((i, row))

    def _raw(self, t: GGUFTensor) -> np.ndarray:
        return np.frombuffer(bytearray(tensor_bytes(self.gguf, t)), dtype=np.uint8)  # writable: torch views it

    def gather(self, weight: torch.Tensor, transposed: bool) -> StoredBlocks | None:
        """``weight``'s rows as blocks of the file, or None where some row is none of its
        rows, the rows come from tensors of two types, or the gathered blocks do not
        dequantize to ``weight`` exactly."""
        rows = weight.reshape(-1, weight.shape[-1])
        sources: list[tuple[int, int]] = []
        previous = -1
        for digest in _digests(rows):
            candidates = self.rows.get(digest)
            if not candidates:
                return None
            # a row found in several places (zeros, a tied table): the tensor of the previous row first
            sources.append(next((c for c in candidates if c[0] == previous), candidates[0]))
            previous = sources[-1][0]
        kinds = {self.tensors[i].ggml_type.name for i, _ in sources}
        if len(kinds) != 1:
            return None
        first = self.tensors[sources[0][0]]
        data = torch.from_numpy(np.concatenate(list(self._rows_of(sources))).copy())
        again = self.dequantize(data.numpy(), GGUFTensor(first.name, first.ggml_type, tuple(rows.shape), 0, data.numel()))
        if not torch.equal(again.to(weight.dtype), rows):
            return None
        return StoredBlocks(data, Encoding(first.ggml_type.name, transposed))

    def _rows_of(self, sources: list[tuple[int, int]]) -> Iterator[np.ndarray]:
        """The raw bytes of each source row, runs of consecutive rows of one tensor at once
        (each source tensor read once: a permutation makes many short runs)."""
        raws: dict[int, np.ndarray] = {}
        start = 0
        while start < len(sources):
            tensor, row = sources[start]
            stop = start + 1
            while stop < len(sources) and sources[stop] == (tensor, row + stop - start):
                stop += 1
            if tensor not in raws:
                t = self.tensors[tensor]
                raws[tensor] = self._raw(t).reshape(-1, t.nbytes // max(1, math.prod(t.shape[:-1])))
            yield raws[tensor][row : row + stop - start].reshape(-1)
            start = stop


def _digests(rows: torch.Tensor) -> list[bytes]:
    """A 16-byte BLAKE2 digest of each row's bytes."""
    flat = rows.contiguous().flatten()  # one dimension of stride 1 (a size-1 row may carry any stride)
    raw = flat.view(torch.uint8).reshape(rows.shape[0], -1).numpy()
    return [hashlib.blake2b(r.tobytes(), digest_size=16).digest() for r in raw]


def _dequantizer() -> Dequantizer:
    """Float32 values of a tensor's raw blocks, by transformers' dequantizer (5.x) or gguf's (4.x)."""
    try:
        from transformers.integrations.gguf.dequant import GGML_BLOCK
        from transformers.integrations.gguf.dequant import dequantize as transformers_dequantize
    except ImportError:
        GGML_BLOCK, transformers_dequantize = {}, None

    def dequantize(raw: np.ndarray, t: GGUFTensor) -> torch.Tensor:
        if transformers_dequantize is not None and t.ggml_type.type_id in GGML_BLOCK:
            values = transformers_dequantize(torch.from_numpy(raw), t.ggml_type.type_id, torch.float32)
        else:
            from gguf import GGMLQuantizationType
            from gguf.quants import dequantize as gguf_dequantize

            values = torch.from_numpy(np.ascontiguousarray(gguf_dequantize(raw, GGMLQuantizationType(t.ggml_type.type_id))))
        return values.to(torch.float32).reshape(t.shape)

    return dequantize


__all__ = ["StoredBlocks", "find_blocks"]
