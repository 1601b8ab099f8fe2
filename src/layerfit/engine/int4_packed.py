"""Q4_0, Q4_1 and Q4_K weights computed packed, on PyTorch's CPU int4 kernel (issue #54).

PyTorch's weight-only int4 kernel, ``torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed,
group_size, scales_and_zeros)``, computes ``y = x @ w.T`` for an ``[N, K]`` weight kept as
4-bit codes ``q`` (0..15) with, for each output row ``n`` and each group ``g`` of
``group_size`` consecutive inputs, a scale and a zero (``scales_and_zeros[g, n] = (scale,
zero)``, bf16 when ``x`` is bf16)::

    w[n, k] = (q[n, k] - 8) * scale[k // group_size, n] + zero[k // group_size, n]

(the tinygemm convention torchao's int4 layouts quantize for; checked against the kernel in
``tests/engine/test_int4_packed.py`` with float32 operands, where it is exact, while
``w = q * scale + zero`` is off by far more than rounding). With ``group_size = 32`` the GGUF
block formulas map onto it exactly, per 32-value (sub-)block, with the same codes ``q``:

======  ==============================  ===========  ===============================
type    GGUF value (per 32 values)      scale        zero
======  ==============================  ===========  ===============================
Q4_0    ``d * (q - 8)``                 ``d``        ``0``
Q4_1    ``d * q + m``                   ``d``        ``m + 8 * d``
Q4_K    ``d * sc_j * q - dmin * m_j``   ``d * sc_j`` ``8 * d * sc_j - dmin * m_j``
======  ==============================  ===========  ===============================

``d``, ``m``, ``dmin`` are the blocks' f16 scalars, ``sc_j``, ``m_j`` Q4_K's 6-bit scale and
min of sub-block ``j``. Scale and zero are computed in float32 (exact for Q4_0, Q4_K's scale
and Q4_1's; one rounding for the zeros), then rounded to bf16 once: that rounding (relative
2**-9) and the bf16 activations are the only differences from the dequantized weight; the
bound is measured in the tests (and in bench/quant_kernels.py).

What is stored and what is converted when a unit is bound. The packed operand is *not* a
plain function of the codes: ``_convert_weight_to_int4pack_for_cpu`` lays out ``[N, K]``
codes as ``[N/B, K, B/2]`` bytes, byte ``(b, k, i)`` holding rows ``bB + i`` (low nibble) and
``bB + B/2 + i`` (high), with ``B`` the vector width of the CPU it runs on (64 with AVX512,
32 with AVX2, another layout again without either), and the ``_for_cpu`` ops exist only from torch 2.6
(pytorch#139611 split them out; 2.5's CPU path is ``_convert_weight_to_int4pack`` on uint8
``[N, K/2]`` with ``_weight_int4pack_mm``, not supported here: `operand` falls back to bf16). So a prepared
folder stores the GGUF blocks as published (the same bytes ``--dequantize`` reads: one
folder, both modes, any torch and CPU), and `pack` converts a weight when its unit is bound:
for a layout it recognises (probed once against torch's own op), the bytes are re-paired and
transposed in uint8 without unpacking; otherwise torch's op converts unpacked int32 codes.
Packing costs about what dequantizing the weight to bf16 does (about 2 ms for 576x1536, 120 ms
for 4096x11008 on one core, against 0.1 and 4 ms for the one-token product): cheap for a unit
kept resident (packed once), the larger part of a streamed unit's time.
`int4_packed_available` says whether this torch has the kernel at all.

Every other type (Q8_0 included) is dequantized per unit to bf16 and multiplied in bf16
(`operand`, `linear`): ``_weight_int8pack_mm`` takes one scale per output channel, and
re-quantizing Q8_0's block-32 scales to that was 10-30x the error of the bf16 weight (median
relative error of the product 1e-2 to 5e-2 against 3e-3) and slower to make per unit (a
re-quantization against a dequantization), see bench/results/quant_kernels.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from layerfit.engine.dequantize import TYPES, dequantize

GROUP_SIZE = 32
#: the GGUF types this module computes packed
PACKED_TYPES = ("Q4_0", "Q4_1", "Q4_K")


def int4_packed_available() -> bool:
    """Whether this torch has the CPU int4 kernel and its packing op (torch >= 2.6)."""
    return hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and hasattr(
        torch.ops.aten, "_convert_weight_to_int4pack_for_cpu"
    )


@dataclass(frozen=True)
class PackedInt4:
    """An ``[N, K]`` weight in the operands of ``_weight_int4pack_mm_for_cpu``."""

    packed: torch.Tensor  # uint8 [N, K/2], this CPU's layout
    scales_and_zeros: torch.Tensor  # bf16 [K/32, N, 2]
    shape: tuple[int, int]

    @property
    def nbytes(self) -> int:
        """Bytes the operands hold (what binding makes beside the read buffer)."""
        return self.packed.nbytes + self.scales_and_zeros.nbytes


def pack(blocks: torch.Tensor, type_name: str, shape: tuple[int, int]) -> PackedInt4:
    """The GGUF blocks (uint8) of an ``[N, K]`` weight of `type_name` as the kernel's operands."""
    if type_name not in PACKED_TYPES:
        raise ValueError(f"{type_name} is not packed (only {', '.join(PACKED_TYPES)})")
    n, k = shape
    spec = TYPES[type_name]
    if k % spec.elements or n % 16:
        raise ValueError(f"{type_name} [N, K] = {shape}: K must divide into blocks, N into 16 rows")
    if blocks.storage_offset() % 2:  # the f16 views need an even start: copy (rare)
        blocks = blocks.clone()
    rows = blocks.view(n, k // spec.elements, spec.nbytes)
    codes, width = _codes(rows, type_name)
    scale, zero = _scales_and_zeros(rows, type_name)
    # rounded to bf16 once, here; each (scale, zero) pair moved as one 4-byte item (a transpose
    # of int32 is 3x faster than of bf16 pairs)
    pairs = torch.stack((scale.to(torch.bfloat16), zero.to(torch.bfloat16)), dim=-1)
    moved = pairs.view(n, -1).view(torch.int32).T.contiguous()
    scales_and_zeros = moved.view(torch.bfloat16).view(k // GROUP_SIZE, n, 2)
    return PackedInt4(_layout(codes, width, n, k), scales_and_zeros, (n, k))


def _codes(rows: torch.Tensor, type_name: str) -> tuple[torch.Tensor, int]:
    """The code bytes ``[N, G, W]``: byte ``j`` of group ``g`` holds inputs ``2Wg + j`` (low
    nibble) and ``2Wg + W + j`` (high); W is 16 for Q4_0/Q4_1, 32 for Q4_K."""
    n = rows.shape[0]
    if type_name == "Q4_0":
        return rows[:, :, 2:18].reshape(n, -1, 16), 16
    if type_name == "Q4_1":
        return rows[:, :, 4:20].reshape(n, -1, 16), 16
    return rows[:, :, 16:144].reshape(n, -1, 32), 32


def _half(rows: torch.Tensor, start: int) -> torch.Tensor:
    """The f16 scalar at byte `start` of every block, float32 ``[N, blocks]``."""
    return rows[:, :, start : start + 2].contiguous().view(torch.float16).squeeze(-1).float()


def _scales_and_zeros(rows: torch.Tensor, type_name: str) -> tuple[torch.Tensor, torch.Tensor]:
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


@functools.cache
def _block_rows() -> int | None:
    """This CPU's ``B`` (rows per packed block), probed against torch's op; None if not B-form."""
    probe = torch.randint(
        0, 16, (128, 64), dtype=torch.int32, generator=torch.Generator().manual_seed(54)
    )
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(probe, 1)
    for b in (64, 32, 16):
        split = probe.view(128 // b, 2, b // 2, 64)
        mine = (split[:, 0] | (split[:, 1] << 4)).transpose(1, 2).to(torch.uint8).reshape(128, 32)
        if torch.equal(mine, packed):
            return b
    return None


def _layout(codes: torch.Tensor, width: int, n: int, k: int) -> torch.Tensor:
    """Code bytes ``[N, G, W]`` -> this CPU's packed ``[N, K/2]`` uint8."""
    b = _block_rows()
    if b is None or n % b:
        low, high = codes & 0xF, codes >> 4
        plain = torch.stack((low, high), dim=2).reshape(n, k).to(torch.int32)
        return torch.ops.aten._convert_weight_to_int4pack_for_cpu(plain, 1)
    half = b // 2
    groups = k // (2 * width)
    # rows bB+i and bB+B/2+i share a byte; inputs 2Wg+j and 2Wg+W+j share a code byte
    pairs = codes.view(n // b, 2, half, groups, width)
    first, second = pairs[:, 0], pairs[:, 1]
    out = torch.empty(n // b, groups, 2, width, half, dtype=torch.uint8)
    torch.bitwise_or(first & 0xF, second << 4, out=out[:, :, 0].permute(0, 3, 1, 2))
    torch.bitwise_or(first >> 4, second & 0xF0, out=out[:, :, 1].permute(0, 3, 1, 2))
    return out.view(n, k // 2)


def packed_linear(
    x: torch.Tensor, weight: PackedInt4, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear(x, w, bias)`` for the packed `weight`: bf16 activations on the int4 kernel,
    the result returned in ``x``'s dtype (and bias added in it)."""
    n, k = weight.shape
    flat = x.reshape(-1, k).to(torch.bfloat16).contiguous()
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(
        flat, weight.packed, GROUP_SIZE, weight.scales_and_zeros
    )
    y = y.to(x.dtype)
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], n)


def operand(
    blocks: torch.Tensor, type_name: str, shape: tuple[int, int], out: torch.Tensor | None = None
) -> PackedInt4 | torch.Tensor:
    """What a bound unit computes an ``[N, K]`` GGUF weight with in the packed mode: Q4_0, Q4_1
    and Q4_K packed for the int4 kernel (where this torch has it), any other type dequantized
    to bf16 (into `out` when given: the engine's buffer)."""
    if type_name in PACKED_TYPES and int4_packed_available() and shape[0] % 16 == 0:
        return pack(blocks, type_name, shape)
    return dequantize(blocks, type_name, shape, torch.bfloat16, out=out)


def linear(
    x: torch.Tensor, weight: PackedInt4 | torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear`` on an `operand`: bf16 activations either way, the result in ``x``'s dtype."""
    if isinstance(weight, PackedInt4):
        return packed_linear(x, weight, bias)
    y = F.linear(x.to(torch.bfloat16), weight).to(x.dtype)
    return y if bias is None else y + bias


class PackedWeight(torch.Tensor):
    """A Linear's weight that is an `operand`: ``F.linear`` on it runs `linear`.

    A wrapper tensor (shape and dtype of the model's weight, no storage) intercepting
    ``F.linear`` through ``__torch_function__``, as torchao's quantized tensors do, so the
    model's code is unchanged. Metadata (shape, dtype, device) reads as the model's weight;
    any other operation on it raises, since the dense values are not there to compute with.
    """

    operand: PackedInt4 | torch.Tensor

    @staticmethod
    def __new__(cls, weight: PackedInt4 | torch.Tensor, dtype: torch.dtype) -> PackedWeight:
        shape = weight.shape
        tensor = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device="cpu")
        tensor.operand = weight
        return tensor

    def __repr__(self) -> str:  # noqa: D105
        kind = "int4 packed" if isinstance(self.operand, PackedInt4) else "bf16"
        return f"PackedWeight(shape={tuple(self.shape)}, dtype={self.dtype}, {kind})"

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        """``F.linear`` with this as its weight -> `linear`; other calls go on to dispatch."""
        kwargs = kwargs or {}
        if func is F.linear:
            x, weight, *rest = (*args, *kwargs.values())
            return linear(x, weight.operand, rest[0] if rest else None)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(
        cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        """Reached by every operation but ``F.linear``: there are no dense values to give it."""
        raise NotImplementedError(f"{func} on a packed weight (only F.linear runs packed)")


def bind_packed(module: nn.Linear, weight: PackedInt4 | torch.Tensor) -> None:
    """Make `module` compute with `weight` (the engine binds through ``_parameters`` too)."""
    if (module.out_features, module.in_features) != tuple(weight.shape):
        raise ValueError(f"a {tuple(weight.shape)} weight for {module}")
    module._parameters["weight"] = PackedWeight(weight, module.weight.dtype)
