"""Q6_K weights computed packed, stripe by stripe, on PyTorch's CPU int4 kernel (issue #54).

:mod:`layerfit.store.q6k_form` states the form a prepared folder keeps a linear layer's
Q6_K weight in (the blocks' own bytes, re-paired for the kernel) and how the kernel computes
``d * sc_j * (q - 32)`` from it. Binding such a weight makes nothing: the operand is the
form as it lies in the read buffer (:class:`Q6KStripes`), and each product goes over it a
stripe at a time, building the stripe's codes and scales for the kernel in a few MB of
scratch. So, like :class:`~layerfit.engine.int4_packed.BlockRows`, it can be multiplied
while its stripes are still being read (``arrived``) and give back each stripe once used
(``used``): the engine does both for the pass's last streamed unit, the output layer of a
Q4 file. It is what a streamed unit binds; a held one binds the dense bf16 weight, whose
product is faster once made (:func:`~layerfit.engine.int4_packed.operand_of_form`).

Where this torch has no int4 kernel (before 2.6), or packs it in another layout than the
form's, each stripe is dequantized to bf16 instead (what the packed mode does with other
types). The kernel is used for any number of input rows: its doubled inputs make its GEMM
twice the dequantized weight's, yet it stayed 2x faster at 1 to 512 rows (a 32000 x 2048
head on two AVX2 cores, 512 rows: 1.7 s against 3.4 s).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from layerfit.engine.dequantize import dequantize
from layerfit.engine.row_products import begin_product
from layerfit.store import q6k_form
from layerfit.store.int4_form import GROUP_SIZE


@dataclass
class Q6KStripes:
    """An ``[N, K]`` Q6_K weight in its stored form (:mod:`~layerfit.store.q6k_form`, codes in
    the layout of `rows` rows per block), multiplied stripe by stripe
    (:func:`q6k_linear`). `kernel`: whether this torch's int4 kernel runs it (else each
    stripe is dequantized to bf16). ``used``, ``spent`` and ``arrived`` are as for
    :class:`~layerfit.engine.int4_packed.BlockRows`: told after each stripe how many bytes
    of `form` the product has used, a second product refused once they were, asked before
    each stripe to wait until the bytes it needs have been read."""

    form: torch.Tensor
    shape: tuple[int, int]
    rows: int
    kernel: bool
    used: Callable[[int], None] | None = None
    spent: bool = False
    arrived: Callable[[int], None] | None = None
    type_name: ClassVar[str] = q6k_form.TYPE


@dataclass
class _Scratch:
    """What a product builds a stripe's kernel operands in: codes ``[R/B, K/16, 2, 16, B/2]``
    and scales and zeros ``[K/16, R, 2]``."""

    codes: torch.Tensor
    pairs: torch.Tensor


def q6k_linear(x: torch.Tensor, weight: Q6KStripes) -> torch.Tensor:
    """``x`` (``[M, K]`` bf16) times `weight` transposed: ``[M, N]`` float32."""
    begin_product(weight)
    y = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32, device=x.device)
    on_kernel = weight.kernel and x.device.type == "cpu"  # the kernel is the CPU's
    (_kernel_stripes if on_kernel else _dequantized_stripes)(x, weight, y)
    return y


def _arriving(weight: Q6KStripes) -> Iterator[tuple[int, int, torch.Tensor]]:
    """``(first row, rows, bytes)`` of each stripe of `weight` (:func:`~layerfit.store.q6k_form.stripes`,
    the tail last), each once its bytes have been read (``arrived``); once the caller asks
    for the next, the engine is told the stripe was used (``used``)."""
    for a, r, start, end in q6k_form.stripes(weight.shape, weight.rows):
        if weight.arrived is not None:
            weight.arrived(end)
        yield a, r, weight.form[start:end]
        if weight.used is not None:
            weight.used(end)


def _kernel_stripes(x: torch.Tensor, weight: Q6KStripes, y: torch.Tensor) -> None:
    """Each stripe on the int4 kernel (the module docstring of :mod:`~layerfit.store.q6k_form`)."""
    k = weight.shape[1]
    m, rows = x.shape[0], weight.rows
    doubled = torch.empty(m, k // 16, 2, 16, dtype=torch.bfloat16, device=x.device)
    doubled[:, :, 0] = x.reshape(m, k // 16, 16)
    torch.mul(x.reshape(m, k // 16, 16), 16, out=doubled[:, :, 1])
    doubled = doubled.view(m, 2 * k)
    sums = x.float().view(m, k // 16, 16).sum(-1)  # X_j
    scratch: _Scratch | None = None
    for a, r, stripe in _arriving(weight):
        if q6k_form.is_tail(r, rows):
            _tail(x, stripe, r, k, y[:, a:])
        else:
            scratch = _kernel_stripe(x, (doubled, sums), stripe, r, rows, scratch, y[:, a : a + r])


def _kernel_stripe(
    x: torch.Tensor, inputs: tuple[torch.Tensor, torch.Tensor], stripe: torch.Tensor, r: int, rows: int,
    scratch: _Scratch | None, into: torch.Tensor,
) -> _Scratch:
    """One stripe of `r` rows on the kernel, into `into`; `inputs`: the doubled inputs and
    the sub-blocks' sums. Returns the scratch it used (made where `scratch` does not fit)."""
    k = x.shape[1]
    lo, hi, sc, d = q6k_form.split(stripe, r, k, rows)
    if scratch is None or scratch.pairs.shape[1] != r:
        scratch = _Scratch(torch.empty(r // rows, k // 16, 2, 16, rows // 2, dtype=torch.uint8, device=x.device),
                           torch.empty(k // 16, r, 2, dtype=torch.bfloat16, device=x.device))
    codes, pairs = scratch.codes, scratch.pairs
    codes[:, :, 0] = lo
    high = codes[:, :, 1]
    torch.bitwise_and(hi, 0x33, out=high[:, :, :8])
    torch.bitwise_right_shift(hi, 2, out=high[:, :, 8:])
    high[:, :, 8:].bitwise_and_(0x33)
    high.add_(0x22)  # codes hi + 2: the stored pairs of bits hold hi
    scale = _scales(sc, d, pairs[:, :, 0])
    torch.mul(scale, 4, out=pairs[:, :, 1])
    doubled, sums = inputs
    product = torch.ops.aten._weight_int4pack_mm_for_cpu(doubled, codes.view(r, k), GROUP_SIZE, pairs)
    torch.add(product, sums @ scale.float(), alpha=4, out=into)
    return scratch


def _tail(x: torch.Tensor, blocks: torch.Tensor, r: int, k: int, into: torch.Tensor) -> None:
    """The form's last ``N mod B`` rows, stored as Q6_K blocks: dequantized to bf16 and
    multiplied into `into`."""
    into.copy_(F.linear(x, dequantize(blocks, q6k_form.TYPE, (r, k), torch.bfloat16)))


def _scales(sc: torch.Tensor, d: torch.Tensor, into: torch.Tensor) -> torch.Tensor:
    """``d * sc_j`` of a stripe's sub-blocks (``[K/16, r]``), rounded once into `into`."""
    k16, r = sc.shape
    return into.copy_(sc.float().view(k16 // 16, 16, r).mul_(d.float().unsqueeze(1)).view(k16, r))


#: elements dequantized at a time: a few MB of temporaries, in the caches
_VALUES_ELEMENTS = 1 << 18


def _values(stripe: torch.Tensor, r: int, k: int, rows: int) -> Iterator[tuple[int, torch.Tensor]]:
    """A stripe (not the tail) dequantized to bf16 a few rows at a time: ``(first row,
    values [rows, K])`` each, ``bf16(d sc_j)`` times ``q - 32`` rounded to bf16 once, as
    :mod:`~layerfit.engine.dequantize` does (so the same bits)."""
    lo, hi, sc, d = q6k_form.split(stripe, r, k, rows)
    step = max(rows, _VALUES_ELEMENTS // k // rows * rows)
    for a in range(0, r, step):
        b = min(r, a + step)
        blocks = slice(a // rows, b // rows)
        scale = _scales(sc[:, a:b], d[:, a:b], torch.empty(k // 16, b - a, dtype=torch.bfloat16, device=stripe.device))
        q = q6k_form.stripe_codes(lo[blocks], hi[blocks], rows).view(torch.int8).view(b - a, k // 16, 16)
        yield a, (q - 32).float().mul_(scale.float().T.unsqueeze(2)).to(torch.bfloat16).view(b - a, k)


def _dequantized_stripes(x: torch.Tensor, weight: Q6KStripes, y: torch.Tensor) -> None:
    """Each stripe dequantized to bf16 a few rows at a time (:func:`_values`), multiplied."""
    k = weight.shape[1]
    for a, r, stripe in _arriving(weight):
        if q6k_form.is_tail(r, weight.rows):
            _tail(x, stripe, r, k, y[:, a:])
        else:
            for first, values in _values(stripe, r, k, weight.rows):
                y[:, a + first : a + first + values.shape[0]] = F.linear(x, values)


def dequantized(form: torch.Tensor, shape: tuple[int, int], rows: int) -> torch.Tensor:
    """The bf16 weight a Q6_K form holds, ``[N, K]``: the values its blocks dequantize to,
    made a few rows at a time (no copy of the blocks, a few MB of temporaries beside it)."""
    n, k = shape
    out = torch.empty(n, k, dtype=torch.bfloat16, device=form.device)
    for a, r, start, end in q6k_form.stripes(shape, rows):
        if q6k_form.is_tail(r, rows):
            dequantize(form[start:end], q6k_form.TYPE, (r, k), torch.bfloat16, out=out[a:])
            continue
        for first, values in _values(form[start:end], r, k, rows):
            out[a + first : a + first + values.shape[0]] = values
    return out


__all__ = ["Q6KStripes", "dequantized", "q6k_linear"]
