"""Q4_0, Q4_1 and Q4_K weights computed packed, on PyTorch's CPU int4 kernel (issue #54).

The GGUF block formulas map exactly onto the kernel's ``(q - 8) * scale + zero`` per 32
inputs; :mod:`layerfit.store.int4_form` states the mapping and the form a prepared folder
stores such a weight in: the kernel's operands as they lie in the read buffer (codes in
the preparing CPU's layout, bf16 scales and zeros), then the blocks' heads. Binding it on
a CPU of that layout converts nothing (:func:`operand_of_form` returns views); on a CPU of
another layout the blocks are rebuilt and packed for it (:func:`pack`: the bytes re-paired
and transposed in uint8 where the layout is of the known form, torch's own op on unpacked
int32 codes otherwise), about what dequantizing the weight to bf16 costs (2 ms for
576x1536 on one core, against 0.1 ms for the one-token product). The ``_for_cpu`` ops
exist from torch 2.6 (pytorch#139611); without them the weight runs dequantized to bf16.
`int4_packed_available` says whether this torch has the kernel at all.

A Q6_K weight in its own form runs on the same kernel (:mod:`layerfit.engine.q6k_packed`).
Every other type (Q8_0 included), and a Q4 or Q6_K weight stored as plain blocks (a GGUF weight
whose rows are not a multiple of the layout's), is dequantized per unit to bf16 and
multiplied in bf16 (`operand`, `linear`); in a streamed unit, bound for one pass, it stays
its blocks and each product dequantizes a few rows at a time (:class:`BlockRows`), so the
unit makes no dense copy of itself beside the read buffer. ``_weight_int8pack_mm`` takes
one scale per output channel, and re-quantizing Q8_0's block-32 scales to that was 10-30x
the error of the bf16 weight (median relative error of the product 1e-2 to 5e-2 against
3e-3) and slower to make per unit (a re-quantization against a dequantization), see
bench/results/quant_kernels.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from layerfit.engine.dequantize import TYPES, dequantize
from layerfit.engine.q6k_packed import Q6KStripes, q6k_linear
from layerfit.engine.q6k_packed import dequantized as q6k_dequantized
from layerfit.engine.row_products import begin_product
from layerfit.store import int4_form, q6k_form
from layerfit.store.int4_form import GROUP_SIZE, INT4_TYPES, cpu_block_rows

#: the GGUF types this module computes packed
PACKED_TYPES = INT4_TYPES


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
        """Bytes the operands hold."""
        return self.packed.nbytes + self.scales_and_zeros.nbytes


def pack(blocks: torch.Tensor, type_name: str, shape: tuple[int, int]) -> PackedInt4:
    """The GGUF blocks (uint8) of an ``[N, K]`` weight of `type_name` as the kernel's
    operands, in this CPU's layout."""
    if type_name not in PACKED_TYPES:
        raise ValueError(f"{type_name} is not packed (only {', '.join(PACKED_TYPES)})")
    n, k = shape
    spec = TYPES[type_name]
    if k % spec.elements or n % 16:
        raise ValueError(f"{type_name} [N, K] = {shape}: K must divide into blocks, N into 16 rows")
    rows = int4_form.blocks_by_row(blocks, type_name, shape)
    codes, width = int4_form.code_bytes(rows, type_name)
    return PackedInt4(_layout(codes, width, n, k), int4_form.scales_and_zeros(rows, type_name), (n, k))


def _layout(codes: torch.Tensor, width: int, n: int, k: int) -> torch.Tensor:
    """Code bytes ``[N, G, W]`` -> this CPU's packed ``[N, K/2]`` uint8."""
    b = cpu_block_rows()
    if b is None or n % b:
        low, high = codes & 0xF, codes >> 4
        plain = torch.stack((low, high), dim=2).reshape(n, k).to(torch.int32)
        return torch.ops.aten._convert_weight_to_int4pack_for_cpu(plain, 1)
    return int4_form.layout(codes, width, n, k, b)


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


@dataclass
class BlockRows:
    """An ``[N, K]`` weight of GGML blocks (uint8, a row's blocks after another's), multiplied
    by dequantizing `ROWS_ELEMENTS` of it at a time to bf16 (:func:`block_rows_linear`).

    What a streamed unit binds for a weight the packed mode computes in bf16: dequantized
    whole, the unit would make ``N * K * 2`` bytes beside the read buffer for the one pass it
    is bound for (131 MB for the Q6_K output layer of a 1.1 B model's Q4 file, which a
    memory limit must leave room for), and the dense values would be read again from memory
    by the product. The work per pass is the same dequantization either way.

    ``used``, when set, is told after each step how many bytes of `blocks` (from their start)
    the product has used: the engine gives them back to the read buffer while the rest is
    multiplied (:meth:`~layerfit.engine.stream.UnitStream.release_rows_as_used`). They are
    not there to multiply again, so such a weight refuses a second product (``spent``).

    ``arrived``, when set, is asked before each step to wait until the first bytes of
    `blocks` it names have been read: the engine hands such a unit over while the rest of
    it is still being read, so the product runs as its rows arrive
    (:meth:`~layerfit.engine.stream.UnitStream.compute_rows_as_read`)."""

    blocks: torch.Tensor
    type_name: str
    shape: tuple[int, int]
    used: Callable[[int], None] | None = None
    spent: bool = False
    arrived: Callable[[int], None] | None = None


#: elements dequantized per step of a `BlockRows` product: a few MB of bf16, in the caches
ROWS_ELEMENTS = 1 << 20


def block_rows_linear(x: torch.Tensor, weight: BlockRows) -> torch.Tensor:
    """``x`` (``[M, K]`` bf16) times `weight` transposed: ``[M, N]`` bf16."""
    begin_product(weight)
    n, k = weight.shape
    row_bytes = weight.blocks.numel() // n
    step = max(1, ROWS_ELEMENTS // k)
    scratch = torch.empty(min(step, n), k, dtype=torch.bfloat16, device=weight.blocks.device)
    y = torch.empty(x.shape[0], n, dtype=torch.bfloat16, device=x.device)
    used, arrived = weight.used, weight.arrived
    for a in range(0, n, step):
        b = min(n, a + step)
        if arrived is not None:
            arrived(b * row_bytes)
        rows = dequantize(weight.blocks[a * row_bytes : b * row_bytes], weight.type_name, (b - a, k),
                          torch.bfloat16, out=scratch[: b - a])
        y[:, a:b] = F.linear(x, rows)
        if used is not None:
            used(b * row_bytes)
    return y


def operand(
    blocks: torch.Tensor, type_name: str, shape: tuple[int, int], out: torch.Tensor | None = None,
    *, streamed: bool = False,
) -> PackedInt4 | BlockRows | torch.Tensor:
    """What a bound unit computes an ``[N, K]`` GGUF weight with in the packed mode: Q4_0, Q4_1
    and Q4_K packed for the int4 kernel (where this torch has it), any other type dequantized
    to bf16 (into `out` when given: the engine's buffer), or, in a `streamed` unit, left as
    its blocks (:class:`BlockRows`)."""
    if _runs_int4(type_name, shape):
        return pack(blocks, type_name, shape)
    if streamed:
        return BlockRows(blocks, type_name, shape)
    return dequantize(blocks, type_name, shape, torch.bfloat16, out=out)


def streams_as_rows(type_name: str, shape: tuple[int, ...], rows: int = 0) -> bool:
    """Whether a streamed unit binds such a weight (stored as its blocks, or in the form of
    `rows` rows per block where `rows` is set) as an operand multiplied part by part from
    its start: a :class:`BlockRows` (`operand`) or a :class:`Q6KStripes` (`operand_of_form`)."""
    if rows:
        return type_name == q6k_form.TYPE
    return len(shape) == 2 and not _runs_int4(type_name, shape)


#: the operands a product goes over from their start, part by part (see `streams_as_rows`)
ROWS_OPERANDS = (BlockRows, Q6KStripes)


def _runs_int4(type_name: str, shape: tuple[int, ...]) -> bool:
    """Whether `operand` packs a weight for the int4 kernel (else it is bf16)."""
    return type_name in PACKED_TYPES and int4_packed_available() and shape[0] % 16 == 0


def operand_nbytes(type_name: str, shape: tuple[int, ...], *, streamed: bool = False) -> int:
    """Bytes `operand` makes: int4 codes and a bf16 scale and zero per 32, or bf16 values
    (none in a `streamed` unit, which keeps the blocks)."""
    count = shape[0] * shape[1]
    if _runs_int4(type_name, shape):
        return count // 2 + count // 8
    return 0 if streamed else count * 2


def operand_of_form(
    form: torch.Tensor, type_name: str, shape: tuple[int, int], rows: int, *, streamed: bool = False
) -> PackedInt4 | Q6KStripes | torch.Tensor:
    """What a bound unit computes with from a weight stored in :mod:`~layerfit.store.int4_form`'s
    form of `rows` rows per block: views of `form` where this CPU packs in that layout,
    else the rebuilt blocks packed for this CPU (or dequantized to bf16 without the kernel).

    A Q6_K form in a `streamed` unit is its views (:class:`Q6KStripes`: nothing made, the
    product about as fast as the weight is read); held, it is dequantized to bf16 once, as
    a Q6_K weight stored as blocks is: the dense product is 4x faster than the stripes'
    (a 32000 x 2048 output layer on two AVX2 cores: 7 ms against 29 ms a token), for
    ``N * K * 2`` bytes made against none."""
    if type_name == q6k_form.TYPE:
        if streamed:
            return Q6KStripes(form, shape, rows, kernel=form_binds_views(rows))
        return q6k_dequantized(form, shape, rows)
    if form_binds_views(rows):
        codes, pairs = int4_form.operands(form, type_name, shape)
        return PackedInt4(codes, pairs, shape)
    return operand(int4_form.to_blocks(form, type_name, shape, rows), type_name, shape)


def form_binds_views(rows: int) -> bool:
    """Whether `operand_of_form` binds a form of `rows` rows per block as views of its codes
    and scales (so the heads stored after them are never read) on this CPU and torch."""
    return int4_packed_available() and cpu_block_rows() == rows


def read_nbytes(type_name: str, shape: tuple[int, int], rows: int) -> int:
    """Bytes of a stored form `operand_of_form` reads: its codes and scales where it binds
    views of them, else all of it (the blocks are rebuilt from codes and heads; a Q6_K
    form's product uses every byte)."""
    if form_binds_views(rows) and type_name != q6k_form.TYPE:
        return int4_form.operands_nbytes(shape)
    return int4_form.form_nbytes(type_name, shape)


def made_nbytes(type_name: str, shape: tuple[int, int], rows: int, *, streamed: bool = False) -> int:
    """Bytes `operand_of_form` makes beside the read buffer: none where it returns views (a
    Q6_K form in a `streamed` unit), else the operand made from the rebuilt blocks (the
    blocks themselves are transient)."""
    if type_name == q6k_form.TYPE:  # the dense bf16 weight where held, as for its blocks
        return operand_nbytes(type_name, shape, streamed=streamed)
    if form_binds_views(rows):
        return 0
    return operand_nbytes(type_name, shape)


def linear(
    x: torch.Tensor, weight: PackedInt4 | BlockRows | Q6KStripes | torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear`` on an `operand`: bf16 activations either way, the result in ``x``'s dtype."""
    if isinstance(weight, PackedInt4):
        return packed_linear(x, weight, bias)
    # As 2-D rows: a 3-D input PyTorch does not fold into one matrix product (a decode step's
    # [1, 1, K] slice) goes through bmm, which copies the whole weight contiguous each call.
    flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
    if isinstance(weight, Q6KStripes):
        product = q6k_linear(flat, weight)
    elif isinstance(weight, BlockRows):
        product = block_rows_linear(flat, weight)
    else:
        product = F.linear(flat, weight)
    y = product.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])
    return y if bias is None else y + bias


class PackedWeight(torch.Tensor):
    """A Linear's weight that is an `operand`: ``F.linear`` on it runs `linear`.

    A wrapper tensor (shape and dtype of the model's weight, no storage) intercepting
    ``F.linear`` through ``__torch_function__``, as torchao's quantized tensors do, so the
    model's code is unchanged. Metadata (shape, dtype, device) reads as the model's weight;
    any other operation on it raises, since the dense values are not there to compute with.
    """

    operand: PackedInt4 | BlockRows | Q6KStripes | torch.Tensor

    @staticmethod
    def __new__(cls, weight: PackedInt4 | BlockRows | Q6KStripes | torch.Tensor, dtype: torch.dtype) -> PackedWeight:
        shape = weight.shape
        tensor = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device="cpu")
        tensor.operand = weight
        return tensor

    def __repr__(self) -> str:  # noqa: D105
        kind = ("int4 packed" if isinstance(self.operand, PackedInt4)
                else "Q6_K stripes" if isinstance(self.operand, Q6KStripes)
                else f"{self.operand.type_name} rows to bf16" if isinstance(self.operand, BlockRows) else "bf16")
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


class PackedLinear(nn.Linear):
    """An ``nn.Linear`` whose call runs `linear` on a :class:`PackedWeight`'s operand itself.

    ``F.linear`` on a packed weight gets there too, through ``__torch_function__``, but
    PyTorch's search for the override costs about what the int4 product of a small layer
    does (10-20 us): a 135 M model's decode step (211 linear layers) took 4-6% less time
    with its layers so called (alternated in one process, 1 and 2 threads). With any other
    weight (a dense one, or the skeleton's meta tensor between passes) the call is
    ``nn.Linear``'s own.
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: D102
        weight = self._parameters["weight"]
        if type(weight) is PackedWeight:
            return linear(input, weight.operand, self._parameters["bias"])
        return F.linear(input, weight, self.bias)


def call_packed(module: nn.Module) -> None:
    """Let a plain ``nn.Linear`` call its packed weight directly (:class:`PackedLinear`);
    a subclass of it, with a forward of its own, keeps it and goes through ``F.linear``."""
    if type(module) is nn.Linear:
        module.__class__ = PackedLinear


def bind_packed(module: nn.Linear, weight: PackedInt4 | torch.Tensor) -> None:
    """Make `module` compute with `weight` (the engine binds through ``_parameters`` too)."""
    if (module.out_features, module.in_features) != tuple(weight.shape):
        raise ValueError(f"a {tuple(weight.shape)} weight for {module}")
    module._parameters["weight"] = PackedWeight(weight, module.weight.dtype)
    call_packed(module)
