"""GGUF blocks -> dense values, bit-equal to transformers' GGUF loaders (issue #54, `--dequantize`).

A prepared GGUF model keeps each tensor as the blocks the file published; in `--dequantize`
mode every streamed unit is turned into dense values here, on every read, into a buffer the
engine owns (`out`). So this is vectorised torch over all blocks at once (no Python loop over
blocks, only over chunks of a fixed element count that keep the temporaries in cache) and it
never imports `gguf`.

What "the same values" means. Transformers has had two dequantizers:

- older releases call `gguf.quants.dequantize` (numpy), which computes every type in float32,
  and the loader casts the float32 result to the model's dtype afterwards;
- transformers 5.x (`transformers/integrations/gguf/dequant.py`) computes in torch and takes the
  target dtype, rounding some intermediate products to it (for Q4_0, Q4_1, Q8_0, Q2_K the block
  scale itself is rounded to the dtype first).

For `dtype=torch.float32` the two agree bit for bit on every type both implement (each value is
one rounding of an exact product: an f16 scale has 11 significant bits and the quants at most 8,
so every product before the last addition is exact in float32), and this module gives that value.
For another dtype this module follows transformers 5.x's order of operations in that dtype, so
it equals `transformers...dequant.dequantize(blocks, type, dtype)`; that is *not* always the
float32 result cast to the dtype (the older loaders' value), see `tests/engine/test_dequantize.py`
for which types differ. Q5_0 and Q5_1 are not in transformers 5.x's torch dequantizer: they are
computed in float32 (as gguf's numpy does) and cast. F32, F16 and BF16 are read and cast once.

NaN and infinity in an f16 scale propagate as IEEE arithmetic makes them, as in both
references: the same values are infinite and the same are NaN, but a NaN's sign and payload
are not promised (they follow the SIMD or scalar loop torch picks; gguf's numpy makes NaNs of
its own sign for F16, Q4_1 and Q2_K).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

#: elements per chunk: large enough that the per-op overhead is amortised, small enough that a
#: chunk's temporaries stay in the caches (measured in bench/quant_kernels.py)
CHUNK_ELEMENTS = 1 << 18


@dataclass(frozen=True)
class BlockType:
    """One GGML type: elements and bytes per block, and its kernel."""

    elements: int
    nbytes: int
    kernel: Callable[[torch.Tensor, torch.Tensor, torch.dtype], None]


def dequantize(
    blocks: torch.Tensor,
    type_name: str,
    shape: tuple[int, ...],
    dtype: torch.dtype = torch.float32,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The dense tensor of `shape` that `blocks` (a tensor's GGUF bytes, uint8) encode.

    `type_name` is GGML's name (`Q4_K`, `F16`, ...). With `out` (contiguous, `shape`, `dtype`)
    the values are written there and `out` is returned, so the engine's buffer is the only
    full-size allocation.
    """
    if type_name not in TYPES:
        raise ValueError(
            f"GGML type {type_name!r} is not supported (supported: {', '.join(TYPES)})"
        )
    spec = TYPES[type_name]
    count = math.prod(shape)
    if count % spec.elements:
        raise ValueError(
            f"{type_name} stores blocks of {spec.elements} values; {shape} has {count}"
        )
    n_blocks = count // spec.elements
    if blocks.dtype != torch.uint8 or not blocks.is_contiguous():
        raise ValueError("blocks must be contiguous uint8")
    if blocks.numel() != n_blocks * spec.nbytes:
        raise ValueError(
            f"{shape} of {type_name} is {n_blocks * spec.nbytes} bytes, not {blocks.numel()}"
        )
    if out is None:
        out = torch.empty(shape, dtype=dtype, device=blocks.device)
    elif tuple(out.shape) != tuple(shape) or out.dtype != dtype or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {dtype} tensor of shape {tuple(shape)}")
    if blocks.storage_offset() % 4:  # the f16/f32 views need an aligned start: copy (rare)
        blocks = blocks.clone()
    rows = blocks.view(n_blocks, spec.nbytes)
    values = out.view(n_blocks, spec.elements)
    step = max(1, CHUNK_ELEMENTS // spec.elements)
    for start in range(0, n_blocks, step):
        spec.kernel(rows[start : start + step], values[start : start + step], dtype)
    return out


def bytes_per_tensor(type_name: str, shape: tuple[int, ...]) -> int:
    """How many bytes a tensor of `shape` takes in `type_name`'s blocks."""
    spec = TYPES[type_name]
    return math.prod(shape) // spec.elements * spec.nbytes


# --- helpers ---------------------------------------------------------------------------------


def _half(rows: torch.Tensor, start: int) -> torch.Tensor:
    """The f16 scalar at byte `start` of each block, as float32 `(nb, 1)` (exact)."""
    return rows[:, start : start + 2].view(torch.float16).float()


def _nibbles(qs: torch.Tensor, width: int) -> torch.Tensor:
    """`(nb, n*width)` bytes -> `(nb, 2n, width)`: each run of `width` bytes' low then high nibbles."""
    packed = qs.reshape(qs.shape[0], -1, 1, width)
    both = torch.cat((packed & 0xF, packed >> 4), dim=2)
    return both.reshape(qs.shape[0], -1, width)


def _crumbs(qs: torch.Tensor, width: int) -> torch.Tensor:
    """`(nb, n*width)` bytes -> `(nb, 4n, width)`: each run's 2-bit fields, lowest first."""
    packed = qs.reshape(qs.shape[0], -1, 1, width)
    fields = torch.cat((packed & 3, (packed >> 2) & 3, (packed >> 4) & 3, packed >> 6), dim=2)
    return fields.reshape(qs.shape[0], -1, width)


def _scaled(view: torch.Tensor, q: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``view = factor * q``, one rounding, as ``factor * q`` in `view`'s dtype makes.

    In float32 the codes are cast into `view` (exact), then scaled in place, which keeps both
    steps vectorised (a product promoting integer codes is not). In a narrower dtype the
    product is formed in float32 and rounded once into `view`: it is exact there (`factor`
    is a value of that dtype, at most 11 significant bits, and the codes have at most 8), so
    the result is the same bits, and about 1.4x faster on CPU, where a bf16 or f16 product
    converts its operands to float32 anyway (a Q6_K output layer of 32000 x 2048 to bf16:
    192 -> 137 ms on two threads of an AVX2 EPYC)."""
    if view.dtype == torch.float32:
        view.copy_(q)
        return view.mul_(factor)
    view.copy_(q.float().mul_(factor.float()))
    return view


def _cast_into(values: torch.Tensor, out: torch.Tensor) -> None:
    """float32 `values` into `out` (a cast when `out` is another dtype)."""
    out.copy_(values.reshape(out.shape))


# --- plain floats ----------------------------------------------------------------------------


def _f32(rows: torch.Tensor, out: torch.Tensor, dtype: torch.dtype) -> None:
    out.copy_(rows.view(torch.float32).reshape(out.shape))


def _f16(rows: torch.Tensor, out: torch.Tensor, dtype: torch.dtype) -> None:
    out.copy_(rows.view(torch.float16).reshape(out.shape))


def _bf16(rows: torch.Tensor, out: torch.Tensor, dtype: torch.dtype) -> None:
    out.copy_(rows.view(torch.bfloat16).reshape(out.shape))


# --- 32-element blocks -----------------------------------------------------------------------


def _q4_0(rows: torch.Tensor, out: torch.Tensor, dtype: torch.dtype) -> None:
    """d*(q-8); transformers rounds d to `dtype` first."""
    q = _nibbles(rows[:, 2:18], 16).view(torch.int8) - 8
    d = _half(rows, 0).to(dtype).unsqueeze(2)
    _scaled(out.view(-1, 2, 16), q, d)


def _q4_1(rows: torch.Tensor, out: torch.Tensor, dtype: torch.dtype) -> None:
    """d*q + m, two roundings in `dtype` (one, exact product first, in float32)."""
    q = _nibbles(rows[:, 4:20], 16)
    view = out.view(-1, 2, 16)
    _scaled(view, q, _half(rows, 0).to(dtype).unsqueeze(2))
    view.add_(_half(rows, 2).to(dtype).unsqueeze(2))


def _bit_planes(mask: torch.Tensor) -> torch.Tensor:
    """`(nb, w)` bytes -> `(nb, 8, w)`: plane j holds bit j of each byte (Q5_K's and Q3_K's
    layout; a table lookup, as `_bits_of`, measured no faster there: it needs the transpose)."""
    shifts = torch.arange(8, dtype=torch.uint8, device=mask.device).reshape(1, 8, 1)
    return (mask.unsqueeze(1) >> shifts) & 1


@functools.cache
def _spread_bits(device: torch.device, if_set: int, if_clear: int) -> torch.Tensor:
    """A byte -> its eight bits, lowest first, as `if_set` or `if_clear`: ``[256, 8]`` uint8."""
    bits = (torch.arange(256, device=device).unsqueeze(1) >> torch.arange(8, device=device)) & 1
    return torch.where(bits == 1, if_set, if_clear).to(torch.uint8)


def _bits_of(mask: torch.Tensor, if_set: int, if_clear: int = 0) -> torch.Tensor:
    """`(nb, w)` bytes -> `(nb, w, 8)`: bit j of each byte as `if_set` or `if_clear`.

    Each byte looks its eight values up in a table (`F.embedding`, a row gather: several times
    faster than shifting out bit planes)."""
    return F.embedding(mask.long(), _spread_bits(mask.device, if_set, if_clear))


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """Q5_0/Q5_1's 4 bytes of high bits -> `(nb, 2, 16)` of each element's bit 4 (as 16 or 0).

    Bit j of byte b is element 8b+j."""
    return _bits_of(qh, 16).reshape(-1, 2, 16)


def _q5_0(rows: torch.Tensor, out: torch.Tensor, dtype: torch.dtype) -> None:
    """d*(q-16) in float32 (gguf's numpy), cast."""
    q = (_nibbles(rows[:, 6:22], 16) | _fifth_bits(rows[:, 2:6])).view(torch.int8) - 16
    d = _half(rows, 0).unsqueeze(2)
    if dtype == torch.float32:
        _scaled(out.view(-1, 2, 16), q, d)
    else:
        _cast_into(d * q, out)


def _q5_1(rows: torch.Tensor, out: torch.Tensor, dtype: torch.dtype) -> None:
    """d*q + m in float32 (gguf's numpy), cast."""
    q = _nibbles(rows[:, 8:24], 16) | _fifth_bits(rows[:, 4:8])
    d, m = _half(rows, 0).unsqueeze(2), _half(rows, 2).unsqueeze(2)
    if dtype == torch.float32:
        view = out.view(-1, 2, 16)
        _scaled(view, q, d)
        view.add_(m)
    else:
        _cast_into(d * q + m, out)


def _q8_0(rows: torch.Tensor, out: torch.Tensor, dtype: torch.dtype) -> None:
    """d*q; transformers rounds d to `dtype` first."""
    _scaled(out, rows[:, 2:34].view(torch.int8), _half(rows, 0).to(dtype))


# --- 256-element super-blocks ----------------------------------------------------------------


def _k_scales(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 bytes -> eight 6-bit scales and mins as float32 (ggml's get_scale_min_k4)."""
    low, mid, high = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scale = torch.cat((low & 63, (high & 0xF) | ((low >> 6) << 4)), dim=1)
    minimum = torch.cat((mid & 63, (high >> 4) | ((mid >> 6) << 4)), dim=1)
    return scale.float(), minimum.float()


def _scaled_minus(
    q: torch.Tensor, rows: torch.Tensor, out: torch.Tensor, dtype: torch.dtype
) -> None:
    """Q4_K/Q5_K: (d*sc)*q - dmin*m per 32 values; the two factors rounded to `dtype`, then 2 ops."""
    scale, minimum = _k_scales(rows[:, 4:16])
    factor = (_half(rows, 0) * scale).to(dtype).unsqueeze(2)
    offset = (_half(rows, 2) * minimum).to(dtype).unsqueeze(2)
    _scaled(out.view(-1, 8, 32), q, factor).sub_(offset)


def _q4_k(rows: torch.Tensor, out: torch.Tensor, dtype: torch.dtype) -> None:
    _scaled_minus(_nibbles(rows[:, 16:144], 32), rows, out, dtype)


def _q5_k(rows: torch.Tensor, out: torch.Tensor, dtype: torch.dtype) -> None:
    high = _bit_planes(rows[:, 16:48]) << 4  # (nb, 8, 32): sub-block j's fifth bit is bit j
    _scaled_minus(_nibbles(rows[:, 48:176], 32) | high, rows, out, dtype)


def _q6_k(rows: torch.Tensor, out: torch.Tensor, dtype: torch.dtype) -> None:
    """(d*sc) rounded to `dtype`, times q-32, per 16 values."""
    low = _nibbles(rows[:, 0:128], 64).reshape(-1, 8, 32)
    high = _crumbs(rows[:, 128:192], 32)
    q = (low | (high << 4)).view(torch.int8) - 32
    scale = (_half(rows, 208) * rows[:, 192:208].view(torch.int8).float()).to(dtype)
    _scaled(out.view(-1, 16, 16), q.reshape(-1, 16, 16), scale.unsqueeze(2))


def _q2_k(rows: torch.Tensor, out: torch.Tensor, dtype: torch.dtype) -> None:
    """(d*sc)*q - dmin*m per 16 values; d and dmin rounded to `dtype` first (transformers)."""
    scales = rows[:, 0:16]
    d, dmin = _half(rows, 80).to(dtype), _half(rows, 82).to(dtype)
    factor = (d * (scales & 0xF).to(dtype)).unsqueeze(2)
    offset = (dmin * (scales >> 4).to(dtype)).unsqueeze(2)
    view = out.view(-1, 16, 16)
    _scaled(view, _crumbs(rows[:, 16:80], 32).reshape(-1, 16, 16), factor)
    view.sub_(offset)


def _q3_k(rows: torch.Tensor, out: torch.Tensor, dtype: torch.dtype) -> None:
    """d*(sc-32)*q per 16 values, q in -4..3; the factor rounded to `dtype` (transformers)."""
    packed = rows[:, 96:108]
    low = _nibbles(packed[:, :8], 8).reshape(-1, 16)
    high = _crumbs(packed[:, 8:12], 4).reshape(-1, 16)
    scale = ((low | (high << 4)).view(torch.int8).float() - 32).to(dtype)
    factor = (_half(rows, 108).to(dtype) * scale).unsqueeze(2)
    ql = _crumbs(rows[:, 32:96], 32).reshape(-1, 16, 16)
    borrow = ((_bit_planes(rows[:, 0:32]) ^ 1) << 2).reshape(-1, 16, 16)
    q = ql.view(torch.int8) - borrow.view(torch.int8)
    _scaled(out.view(-1, 16, 16), q, factor)


TYPES: dict[str, BlockType] = {
    "F32": BlockType(1, 4, _f32),
    "F16": BlockType(1, 2, _f16),
    "BF16": BlockType(1, 2, _bf16),
    "Q4_0": BlockType(32, 18, _q4_0),
    "Q4_1": BlockType(32, 20, _q4_1),
    "Q5_0": BlockType(32, 22, _q5_0),
    "Q5_1": BlockType(32, 24, _q5_1),
    "Q8_0": BlockType(32, 34, _q8_0),
    "Q2_K": BlockType(256, 84, _q2_k),
    "Q3_K": BlockType(256, 110, _q3_k),
    "Q4_K": BlockType(256, 144, _q4_k),
    "Q5_K": BlockType(256, 176, _q5_k),
    "Q6_K": BlockType(256, 210, _q6_k),
}
