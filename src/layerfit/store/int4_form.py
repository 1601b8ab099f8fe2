"""Q4_0, Q4_1 and Q4_K weights re-expressed at prepare for PyTorch's CPU int4 kernel (#54).

PyTorch's weight-only int4 kernel, ``torch.ops.aten._weight_int4pack_mm_for_cpu(x, codes,
group_size, scales_and_zeros)``, computes ``y = x @ w.T`` for an ``[N, K]`` weight kept as
4-bit codes ``q`` (0..15) with, for each output row ``n`` and each group ``g`` of 32
consecutive inputs, a scale and a zero (``scales_and_zeros[g, n] = (scale, zero)``, bf16
for bf16 activations)::

    w[n, k] = (q[n, k] - 8) * scale[k // 32, n] + zero[k // 32, n]

(the tinygemm convention; checked against the kernel in ``tests/engine/test_int4_packed.py``).
With groups of 32 the GGUF block formulas map onto it exactly, per 32-value (sub-)block,
with the same codes ``q``:

======  ==============================  ===========  ===============================
type    GGUF value (per 32 values)      scale        zero
======  ==============================  ===========  ===============================
Q4_0    ``d * (q - 8)``                 ``d``        ``0``
Q4_1    ``d * q + m``                   ``d``        ``m + 8 * d``
Q4_K    ``d * sc_j * q - dmin * m_j``   ``d * sc_j`` ``8 * d * sc_j - dmin * m_j``
======  ==============================  ===========  ===============================

``d``, ``m``, ``dmin`` are the blocks' f16 scalars, ``sc_j``, ``m_j`` Q4_K's 6-bit scale and
min of sub-block ``j``. Scale and zero are computed in float32 (exact but for one rounding
of the zeros) and rounded to bf16 once: that rounding (relative 2**-9) and the bf16
activations are the packed mode's only differences from the dequantized weight.

**The stored form** (a tensor whose ``Encoding.int4_rows`` is ``B``): three arrays back to
back, so that binding a unit on a CPU of that layout converts nothing:

1. the codes, uint8 ``[N, K/2]``, in the layout ``_convert_weight_to_int4pack_for_cpu``
   gives on a CPU whose vectors hold ``B`` rows: ``[N/B, K, B/2]`` bytes, byte ``(b, k, i)``
   holding rows ``bB + i`` (low nibble) and ``bB + B/2 + i`` (high). ``B`` is 64 with
   AVX512, 32 with AVX2 (:func:`cpu_block_rows` probes torch's own op); the form is
   written in the preparing CPU's layout (64 where it has none);
2. the scales and zeros, bf16 ``[K/32, N, 2]``, the kernel's second operand;
3. the blocks' heads, uint8 ``[N, K/E, H]``: each block's bytes before its codes (Q4_0:
   ``d``; Q4_1: ``d, m``; Q4_K: ``d, dmin`` and the 12 scale bytes).

Codes and heads are the GGUF blocks re-paired: :func:`to_blocks` rebuilds the file's
bytes exactly (checked at prepare), which is what ``--dequantize`` computes from (so it
stays bit-equal to transformers) and what a CPU of another layout packs from. The form is
``N*K/2 + N*K/8 +`` the heads: 1.22x Q4_0's blocks, 1.20x Q4_1's, 1.22x Q4_K's.

A Q6_K weight has a form of its own, in its blocks' bytes (:mod:`.q6k_form`); the functions
here that take a type name (`eligible`, `form_nbytes`, `to_form`, `to_blocks`) take it too.
"""

from __future__ import annotations

import functools

import torch

from layerfit.store import q6k_form
from layerfit.store.ggml_types import ggml_type

GROUP_SIZE = 32
#: bytes of each block before its codes (the f16 scalars, Q4_K's scale bytes), per type
HEAD_BYTES = {"Q4_0": 2, "Q4_1": 4, "Q4_K": 16}
#: the GGUF types re-expressed for the int4 kernel with their own codes, 4 bits a value
#: (Q6_K has a form of its own, :mod:`.q6k_form`)
INT4_TYPES = tuple(HEAD_BYTES)
#: the layouts (rows per packed block) a stored form may have
BLOCK_ROWS = (16, 32, 64)


def form_nbytes(type_name: str, shape: tuple[int, ...]) -> int:
    """Bytes of the stored form of an ``[N, K]`` weight of `type_name`."""
    if type_name == q6k_form.TYPE:
        return q6k_form.form_nbytes(shape)
    n, k = shape
    t = ggml_type(type_name)
    return n * k // 2 + n * (k // GROUP_SIZE) * 4 + n * (k // t.block_elems) * HEAD_BYTES[type_name]


def operands_nbytes(shape: tuple[int, ...]) -> int:
    """Bytes of the form's first two arrays (codes, scales and zeros): what the kernel reads,
    the heads after them being what only rebuilding the blocks needs."""
    n, k = shape
    return n * k // 2 + n * (k // GROUP_SIZE) * 4


def eligible(type_name: str, shape: tuple[int, ...], rows: int) -> bool:
    """Whether an ``[N, K]`` weight of `type_name` can be stored in the form of `rows`."""
    if type_name == q6k_form.TYPE:
        return rows in BLOCK_ROWS and q6k_form.eligible(shape, rows)
    return (
        type_name in INT4_TYPES
        and len(shape) == 2
        and rows in BLOCK_ROWS
        and shape[0] % rows == 0
        and shape[1] % ggml_type(type_name).block_elems == 0
        and shape[0] * shape[1] > 0
    )


def to_form(blocks: torch.Tensor, type_name: str, shape: tuple[int, int], rows: int) -> torch.Tensor:
    """The stored form (uint8, one dimension) of an ``[N, K]`` weight's GGUF `blocks`,
    codes in the layout of `rows` rows per packed block; checked to give the blocks back."""
    if type_name == q6k_form.TYPE:
        return q6k_form.to_form(blocks, shape, rows)
    n, k = shape
    block_rows = blocks_by_row(blocks, type_name, shape)
    codes, width = code_bytes(block_rows, type_name)
    head = HEAD_BYTES[type_name]
    form = torch.cat(
        (
            layout(codes, width, n, k, rows).reshape(-1),
            scales_and_zeros(block_rows, type_name).reshape(-1).view(torch.uint8),
            block_rows[:, :, :head].reshape(-1),
        )
    )
    if not torch.equal(to_blocks(form, type_name, shape, rows), blocks.reshape(-1)):
        raise AssertionError(f"the int4 form of a {type_name} {list(shape)} weight does not give its blocks back")
    return form


def operands(form: torch.Tensor, type_name: str, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's operands as views of `form`: codes uint8 ``[N, K/2]`` and scales and
    zeros bf16 ``[K/32, N, 2]`` (a copy of the latter where `form` starts at an odd byte)."""
    n, k = shape
    codes = form[: n * k // 2].view(n, k // 2)
    pairs = form[n * k // 2 : operands_nbytes(shape)]
    if pairs.storage_offset() % 2:
        pairs = pairs.clone()
    return codes, pairs.view(torch.bfloat16).view(k // GROUP_SIZE, n, 2)


def to_blocks(form: torch.Tensor, type_name: str, shape: tuple[int, int], rows: int) -> torch.Tensor:
    """The GGUF blocks (uint8, one dimension) that `form` re-expresses, byte for byte."""
    if type_name == q6k_form.TYPE:
        return q6k_form.to_blocks(form, shape, rows)
    n, k = shape
    t = ggml_type(type_name)
    head = HEAD_BYTES[type_name]
    width = _code_width(type_name)
    codes = unlayout(form[: n * k // 2], width, n, k, rows)
    heads = form[operands_nbytes(shape) :].view(n, k // t.block_elems, head)
    return torch.cat((heads, codes.view(n, k // t.block_elems, t.block_bytes - head)), dim=2).view(-1)


@functools.cache
def cpu_block_rows() -> int | None:
    """This CPU's ``B`` (rows per packed block of torch's int4 layout), probed against
    torch's own op; None where torch has no such op or its layout is not of this form."""
    if not hasattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu"):
        return None
    probe = torch.randint(0, 16, (128, 64), dtype=torch.int32, generator=torch.Generator().manual_seed(54))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(probe, 1)
    for b in reversed(BLOCK_ROWS):
        split = probe.view(128 // b, 2, b // 2, 64)
        mine = (split[:, 0] | (split[:, 1] << 4)).transpose(1, 2).to(torch.uint8).reshape(128, 32)
        if torch.equal(mine, packed):
            return b
    return None


def form_rows() -> int:
    """The layout a form is written in here: this CPU's, or 64 (AVX512's) where it has none."""
    return cpu_block_rows() or 64


def _code_width(type_name: str) -> int:
    """Bytes of codes per 32-value group pair: 16 for Q4_0/Q4_1, 32 for Q4_K."""
    return 32 if type_name == "Q4_K" else 16


def blocks_by_row(blocks: torch.Tensor, type_name: str, shape: tuple[int, int]) -> torch.Tensor:
    """`blocks` as ``[N, K/E, block bytes]`` (a copy where they start at an odd byte)."""
    n, k = shape
    t = ggml_type(type_name)
    if blocks.storage_offset() % 2:  # the f16 views need an even start
        blocks = blocks.clone()
    return blocks.reshape(n, k // t.block_elems, t.block_bytes)


def code_bytes(rows: torch.Tensor, type_name: str) -> tuple[torch.Tensor, int]:
    """The code bytes ``[N, G, W]``: byte ``j`` of group ``g`` holds inputs ``2Wg + j`` (low
    nibble) and ``2Wg + W + j`` (high); W is 16 for Q4_0/Q4_1, 32 for Q4_K."""
    n = rows.shape[0]
    width = _code_width(type_name)
    return rows[:, :, HEAD_BYTES[type_name] :].reshape(n, -1, width), width


def _half(rows: torch.Tensor, start: int) -> torch.Tensor:
    """The f16 scalar at byte `start` of every block, float32 ``[N, blocks]``."""
    return rows[:, :, start : start + 2].contiguous().view(torch.float16).squeeze(-1).float()


def float_scales_and_zeros(rows: torch.Tensor, type_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 ``[N, K/32]`` scale and zero of each 32-value group (the table above)."""
    d = _half(rows, 0)
    if type_name == "Q4_0":
        return d, torch.zeros_like(d)
    if type_name == "Q4_1":
        return d, _half(rows, 2) + 8 * d
    n, blocks = d.shape
    packed = rows[:, :, 4:16].reshape(n * blocks, 12)
    low, mid, high = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = torch.cat((low & 63, (high & 0xF) | ((low >> 6) << 4)), dim=1).float().view(n, blocks, 8)
    mins = torch.cat((mid & 63, (high >> 4) | ((mid >> 6) << 4)), dim=1).float().view(n, blocks, 8)
    scale = d.unsqueeze(2) * sc
    zero = 8 * scale - _half(rows, 2).unsqueeze(2) * mins
    return scale.reshape(n, -1), zero.reshape(n, -1)


def scales_and_zeros(rows: torch.Tensor, type_name: str) -> torch.Tensor:
    """The kernel's bf16 ``[K/32, N, 2]`` scales and zeros of blocks ``[N, K/E, bytes]``,
    rounded to bf16 once."""
    scale, zero = float_scales_and_zeros(rows, type_name)
    n, groups = scale.shape
    pairs = torch.stack((scale.to(torch.bfloat16), zero.to(torch.bfloat16)), dim=-1)
    # each (scale, zero) pair moved as one 4-byte item (a transpose of int32 is 3x faster
    # than of bf16 pairs)
    moved = pairs.view(n, -1).view(torch.int32).T.contiguous()
    return moved.view(torch.bfloat16).view(groups, n, 2)


def layout(codes: torch.Tensor, width: int, n: int, k: int, rows: int) -> torch.Tensor:
    """Code bytes ``[N, G, W]`` -> the packed ``[N, K/2]`` uint8 of `rows` rows per block."""
    half = rows // 2
    groups = k // (2 * width)
    # rows bB+i and bB+B/2+i share a byte; inputs 2Wg+j and 2Wg+W+j share a code byte
    pairs = codes.view(n // rows, 2, half, groups, width)
    first, second = pairs[:, 0], pairs[:, 1]
    out = torch.empty(n // rows, groups, 2, width, half, dtype=torch.uint8)
    torch.bitwise_or(first & 0xF, second << 4, out=out[:, :, 0].permute(0, 3, 1, 2))
    torch.bitwise_or(first >> 4, second & 0xF0, out=out[:, :, 1].permute(0, 3, 1, 2))
    return out.view(n, k // 2)


def unlayout(packed: torch.Tensor, width: int, n: int, k: int, rows: int) -> torch.Tensor:
    """The inverse of :func:`layout`: packed bytes -> code bytes ``[N, G, W]``."""
    half = rows // 2
    groups = k // (2 * width)
    out = packed.reshape(n // rows, groups, 2, width, half)
    low, high = out[:, :, 0], out[:, :, 1]  # [N/B, G, W, B/2]
    codes = torch.empty(n // rows, 2, half, groups, width, dtype=torch.uint8)
    torch.bitwise_or(low & 0xF, high << 4, out=codes[:, 0].permute(0, 2, 3, 1))
    torch.bitwise_or(low >> 4, high & 0xF0, out=codes[:, 1].permute(0, 2, 3, 1))
    return codes.view(n, groups, width)


__all__ = [
    "GROUP_SIZE",
    "INT4_TYPES",
    "cpu_block_rows",
    "eligible",
    "form_nbytes",
    "form_rows",
    "layout",
    "operands",
    "scales_and_zeros",
    "to_blocks",
    "to_form",
    "unlayout",
]
