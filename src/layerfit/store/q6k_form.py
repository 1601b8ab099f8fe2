"""Q6_K weights re-expressed at prepare for PyTorch's CPU int4 kernel, in their own bytes (#54).

Q6_K is the type llama.cpp's quantizer gives the output layer of a Q4 file (and some
layers of a ``Q4_K_M`` one). Its values are ``d * sc_j * (q - 32)``: a 6-bit code ``q``,
an int8 scale ``sc_j`` per 16 inputs and an f16 ``d`` per 256. Dequantized to bf16 by
torch's elementwise operations, the output layer of a 1.1 B model's Q4 file (32000 x
2048) took ~100 ms a token on two AVX2 cores, 3-4x the time reading its 54 MB takes.

The int4 kernel, ``w = (code - 8) * scale + zero`` per group of 32 inputs
(:mod:`.int4_form`), computes it exactly but for the rounding of ``s_j = d * sc_j`` to bf16
(as Q4_K's scale is rounded), with the inputs doubled: ``K' = 2K``, group ``j`` holding
sub-block ``j``'s low four bits ``lo = q & 15`` (codes ``lo``, inputs ``x_j``) then its
high two ``hi = q >> 4`` (codes ``hi + 2``, inputs ``16 x_j``), scale ``s_j``, zero
``4 s_j`` (exact). Then ``x_j s_j (lo - 4) + 16 x_j s_j (hi - 2) = s_j x_j (q - 32) - 4 s_j
x_j``, so::

    y = kernel(x', codes, scales and zeros) + 4 * sum_j s_j * X_j,    X_j = sum of x over sub-block j

the last term a ``[M, K/16] x [K/16, N]`` product in float32. (No zero that bf16 holds
exactly leaves no such term: ``17 * zero = 104 * s`` would be needed; ``4 s`` leaves the
smallest, a quarter of the product's size on that head, so the bf16 rounding of the
kernel's result stays near that of the product itself.) On the same head, alternated in
one process: 22-29 ms a token against 96-137 ms, the product's mean error against float32
0.23 % against bf16's 0.27 %.

**The stored form** (``Encoding.int4_rows == B``, B the kernel's rows per packed block on
the preparing CPU, :func:`.int4_form.form_rows`): the weight in stripes of
:func:`stripe_rows` rows (the last may be shorter; every one a multiple of ``B``), each
stripe's bytes after the last's, then the ``N mod B`` rows left (the *tail*, a vocabulary
of 50257 leaves one) as their Q6_K blocks. A stripe of ``r`` rows holds, in this order:

1. ``lo``: ``[r/B, K/16, 16, B/2]`` bytes, byte ``(b, j, t, i)`` holding ``lo`` of rows
   ``bB+i`` (low nibble) and ``bB+B/2+i`` (high) at input ``16j+t``: the kernel's layout
   of the low half of each group;
2. ``hi``: ``[r/B, K/16, 8, B/2]`` bytes, byte ``(b, j, t, i)`` holding, in bits 0-1 and
   4-5, ``hi`` in the layout of 1. at input ``16j+t``, and in bits 2-3 and 6-7 that of
   input ``16j+t+8``: two ``&``/``>>`` and an add of ``0x22`` give the high half's codes;
3. ``sc``: int8 ``[K/16, r]``, the sub-blocks' scales, input-major;
4. ``d``: f16 ``[K/256, r]``, the super-blocks' scales.

That is 210 bytes per 256 values, the Q6_K blocks' own size, re-paired: :func:`to_blocks`
rebuilds the file's blocks byte for byte (checked at prepare), which is what
``--dequantize`` computes from. A stripe is itself the form of its rows, so a product
reads and multiplies the weight stripe by stripe as it arrives.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from layerfit.store.ggml_types import QK_K

TYPE = "Q6_K"
#: bytes of one Q6_K block: 128 of low nibbles, 64 of high bit pairs, 16 scales, an f16
BLOCK_BYTES = 210
#: elements of a stripe, about: large enough that the kernel's call costs little beside its
#: work, small enough that a product of a weight still being read waits little for a stripe.
#: Part of the format (a folder's forms are read by the value they were written with):
#: changing it needs a new manifest version.
STRIPE_ELEMENTS = 1 << 21


def eligible(shape: tuple[int, ...], rows: int) -> bool:
    """Whether a Q6_K ``[N, K]`` weight can be stored in the form of `rows` rows per block:
    at least one stripe, rows a whole number of blocks."""
    return len(shape) == 2 and shape[0] >= rows and shape[1] > 0 and shape[1] % QK_K == 0


def form_nbytes(shape: tuple[int, ...]) -> int:
    """Bytes of the form of an ``[N, K]`` weight: those of its Q6_K blocks."""
    return shape[0] * shape[1] // QK_K * BLOCK_BYTES


def stripe_rows(k: int, rows: int) -> int:
    """Rows of a stripe (but the last) of a weight of `k` inputs in the layout of `rows`."""
    return max(rows, STRIPE_ELEMENTS // k // rows * rows)


def stripes(shape: tuple[int, int], rows: int) -> Iterator[tuple[int, int, int, int]]:
    """``(first row, rows, first byte, end byte)`` of each stripe of the form, in order; the
    tail, if any, last (its rows not a multiple of `rows`: :func:`is_tail`)."""
    n, k = shape
    step, whole = stripe_rows(k, rows), n - n % rows
    for a in range(0, whole, step):
        r = min(step, whole - a)
        yield a, r, form_nbytes((a, k)), form_nbytes((a + r, k))
    if whole < n:
        yield whole, n - whole, form_nbytes((whole, k)), form_nbytes(shape)


def is_tail(r: int, rows: int) -> bool:
    """Whether a part of `r` rows (:func:`stripes`) is the tail, stored as Q6_K blocks."""
    return r % rows != 0


def split(stripe: torch.Tensor, r: int, k: int, rows: int) -> tuple[torch.Tensor, ...]:
    """A stripe's four arrays as views: lo ``[r/B, K/16, 16, B/2]``, hi ``[r/B, K/16, 8, B/2]``
    (uint8), sc int8 ``[K/16, r]``, d f16 ``[K/256, r]`` (a copy where it starts at an odd byte)."""
    lo_end, hi_end, sc_end = r * k // 2, r * k * 3 // 4, r * k * 3 // 4 + r * k // 16
    lo = stripe[:lo_end].view(r // rows, k // 16, 16, rows // 2)
    hi = stripe[lo_end:hi_end].view(r // rows, k // 16, 8, rows // 2)
    sc = stripe[hi_end:sc_end].view(torch.int8).view(k // 16, r)
    d = stripe[sc_end : form_nbytes((r, k))]
    if d.storage_offset() % 2:
        d = d.clone()
    return lo, hi, sc, d.view(torch.float16).view(k // QK_K, r)


def codes(blocks: torch.Tensor, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The 6-bit codes ``q`` uint8 ``[N, K]``, scales int8 ``[N, K/16]`` and the f16 scalars'
    bytes uint8 ``[N, K/256, 2]`` of Q6_K `blocks` (uint8, one dimension)."""
    b = blocks.view(n * k // QK_K, BLOCK_BYTES)
    ql = b[:, :128].reshape(-1, 2, 1, 2, 32)  # half, -, quarter pair a, l: bytes 64n + 32a + l
    qh = b[:, 128:192].reshape(-1, 2, 1, 32)  # half, -, l
    lo = torch.cat((ql & 15, ql >> 4), dim=2).reshape(-1, 2, 4, 32)  # quarter 2c + a <- (c, a)
    hi = torch.cat([(qh >> s) & 3 for s in (0, 2, 4, 6)], dim=2)  # quarter i <- bits 2i
    q = (lo | (hi << 4)).reshape(n, k)
    return q, b[:, 192:208].view(torch.int8).reshape(n, k // 16), b[:, 208:210].reshape(n, k // QK_K, 2)


def blocks_of(q: torch.Tensor, sc: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`codes`: Q6_K blocks (uint8, one dimension)."""
    y = q.reshape(-1, 2, 4, 32)
    lo, hi = y & 15, y >> 4
    ql = lo[:, :, 0:2] | (lo[:, :, 2:4] << 4)  # [nb, half, a, l]
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)
    nb = y.shape[0]
    out = torch.cat((ql.reshape(nb, 128), qh.reshape(nb, 64), sc.reshape(nb, 16).view(torch.uint8), d.reshape(nb, 2)), dim=1)
    return out.reshape(-1)


def _layout(c: torch.Tensor, rows: int) -> torch.Tensor:
    """Codes ``[r, K]`` (0..15) -> the kernel's layout ``[r/B, K/16, 16, B/2]``."""
    r, k = c.shape
    pair = c.view(r // rows, 2, rows // 2, k // 16, 16)
    return (pair[:, 0] | (pair[:, 1] << 4)).permute(0, 2, 3, 1)


def _unlayout(packed: torch.Tensor, rows: int) -> torch.Tensor:
    """The inverse of :func:`_layout`: ``[r/B, K/16, 16, B/2]`` -> codes ``[r, K]``."""
    nb, groups, width, half = packed.shape
    c = torch.stack((packed & 15, packed >> 4), dim=1)  # [r/B, 2, K/16, 16, B/2]
    return c.permute(0, 1, 4, 2, 3).reshape(nb * rows, groups * width)


def stripe_codes(lo: torch.Tensor, hi: torch.Tensor, rows: int) -> torch.Tensor:
    """A stripe's 6-bit codes ``q``, uint8 ``[r, K]``, from its `lo` and `hi` arrays (:func:`split`)."""
    high = torch.cat((hi & 0x33, (hi >> 2) & 0x33), dim=2)
    return _unlayout(lo, rows) | (_unlayout(high, rows) << 4)


def to_form(blocks: torch.Tensor, shape: tuple[int, int], rows: int) -> torch.Tensor:
    """The stored form (uint8, one dimension) of an ``[N, K]`` weight's Q6_K `blocks`,
    checked to give the blocks back."""
    n, k = shape
    q, sc, d = codes(blocks.contiguous(), n, k)
    parts = []
    for a, r, start, end in stripes(shape, rows):
        if is_tail(r, rows):
            parts.append(blocks.reshape(-1)[start:end])
            continue
        lo = _layout(q[a : a + r] & 15, rows)
        hi = _layout(q[a : a + r] >> 4, rows)
        parts += [
            lo.reshape(-1),
            (hi[:, :, :8] | (hi[:, :, 8:] << 2)).reshape(-1),
            sc[a : a + r].T.contiguous().view(torch.uint8).reshape(-1),
            d[a : a + r].transpose(0, 1).reshape(-1),
        ]
    form = torch.cat(parts)
    if not torch.equal(to_blocks(form, shape, rows), blocks.reshape(-1)):
        raise AssertionError(f"the int4 form of a Q6_K {list(shape)} weight does not give its blocks back")
    return form


def to_blocks(form: torch.Tensor, shape: tuple[int, int], rows: int) -> torch.Tensor:
    """The Q6_K blocks (uint8, one dimension) that `form` re-expresses, byte for byte."""
    n, k = shape
    out = []
    for _, r, start, end in stripes(shape, rows):
        if is_tail(r, rows):
            out.append(form[start:end])
            continue
        lo, hi, sc, d = split(form[start:end], r, k, rows)
        q = stripe_codes(lo, hi, rows)
        d_bytes = d.T.contiguous().reshape(-1).view(torch.uint8).view(r, k // QK_K, 2)
        out.append(blocks_of(q, sc.T.contiguous(), d_bytes))
    return torch.cat(out)


__all__ = ["BLOCK_BYTES", "STRIPE_ELEMENTS", "TYPE", "eligible", "form_nbytes", "is_tail", "split", "stripe_codes", "stripe_rows", "stripes",
           "to_blocks", "to_form"]
