"""`engine/int4_packed.py`: the kernel's semantics, the GGUF mapping, the layout, the tolerance."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from layerfit.engine import int4_packed
from layerfit.engine.dequantize import TYPES, dequantize
from layerfit.engine.int4_packed import PACKED_TYPES, bind_packed, pack, packed_linear
from layerfit.store import int4_form

pytestmark = pytest.mark.skipif(not int4_packed.int4_packed_available(), reason="torch < 2.6")


def _blocks(type_name: str, shape: tuple[int, int], seed: int = 54) -> torch.Tensor:
    """Random blocks with scales a real file has (d ~ 1e-3..1e-2, Q4_1's min ~ -0.1)."""
    spec = TYPES[type_name]
    rng = np.random.default_rng(seed)
    n_blocks = shape[0] * shape[1] // spec.elements
    rows = rng.integers(0, 256, (n_blocks, spec.nbytes), dtype=np.uint8)
    rows[:, 0:2] = rng.uniform(1e-3, 1e-2, (n_blocks, 1)).astype(np.float16).view(np.uint8)
    if type_name in ("Q4_1", "Q4_K"):
        second = (
            rng.uniform(-0.1, 0, n_blocks)
            if type_name == "Q4_1"
            else rng.uniform(1e-3, 1e-2, n_blocks)
        )
        rows[:, 2:4] = second.astype(np.float16).reshape(-1, 1).view(np.uint8)
    return torch.from_numpy(rows.reshape(-1))


def _codes(blocks: torch.Tensor, type_name: str, shape: tuple[int, int]) -> torch.Tensor:
    """The 0..15 codes ``[N, K]`` of the blocks."""
    n, k = shape
    spec = TYPES[type_name]
    code_bytes, width = int4_form.code_bytes(
        blocks.view(n, k // spec.elements, spec.nbytes), type_name
    )
    return torch.stack((code_bytes & 0xF, code_bytes >> 4), dim=2).reshape(n, k).long()


def test_kernel_is_q_minus_8_times_scale_plus_zero() -> None:
    """ATen's reading of the operands, with float32 activations and scales (no rounding
    of the operands; the kernel sums in another order than ``@``, hence float32's
    tolerance for a sum of 128 products)."""
    torch.manual_seed(0)
    n, k = 64, 128
    codes = torch.randint(0, 16, (n, k), dtype=torch.int32)
    scale, zero = torch.rand(k // 32, n) + 0.5, torch.randn(k // 32, n)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    x = torch.randn(3, k)
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 32, torch.stack((scale, zero), -1))
    per_input = scale.repeat_interleave(32, 0).T, zero.repeat_interleave(32, 0).T
    expected = x @ ((codes - 8) * per_input[0] + per_input[1]).T
    torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-4)
    assert (y - x @ (codes * per_input[0] + per_input[1]).T).abs().max() > 1


@pytest.mark.parametrize("type_name", PACKED_TYPES)
def test_mapping_gives_the_gguf_values(type_name: str) -> None:
    """(q - 8) * scale + zero, in float32 before bf16, is the dequantized weight."""
    shape = (32, 512)
    blocks = _blocks(type_name, shape)
    spec = TYPES[type_name]
    scale, zero = int4_form.float_scales_and_zeros(blocks.view(32, -1, spec.nbytes), type_name)
    codes = _codes(blocks, type_name, shape)
    mapped = (codes - 8) * scale.repeat_interleave(32, 1) + zero.repeat_interleave(32, 1)
    reference = dequantize(blocks, type_name, shape)
    if type_name == "Q4_0":
        assert torch.equal(mapped, reference)
    else:  # the zero is one float32 rounding away
        torch.testing.assert_close(mapped, reference, rtol=0, atol=2e-7)


@pytest.mark.parametrize("type_name", PACKED_TYPES)
@pytest.mark.parametrize("n", [64, 96, 48])
def test_layout_is_torchs(type_name: str, n: int, monkeypatch) -> None:
    """The uint8 re-pairing gives the bytes torch's own op packs from int32 codes."""
    shape = (n, 512)
    blocks = _blocks(type_name, shape)
    packed = pack(blocks, type_name, shape).packed
    monkeypatch.setattr(int4_packed, "cpu_block_rows", lambda: None)
    assert torch.equal(packed, pack(blocks, type_name, shape).packed)


@pytest.mark.parametrize("type_name", PACKED_TYPES)
def test_tolerance_against_the_dequantized_linear(type_name: str) -> None:
    """Packed (bf16 activations, bf16 scales) against F.linear on the float32 dequantized weight.

    Measured at 576x1536, 8 tokens: the largest error is under 1% of the largest output, the
    same order as the dense bf16 product of the same weight (the bound asserted is 2x that).
    """
    shape = (576, 1536)
    blocks = _blocks(type_name, shape)
    weight = dequantize(blocks, type_name, shape)
    x = torch.randn(8, shape[1], generator=torch.Generator().manual_seed(1))
    reference = x @ weight.T
    packed = packed_linear(x, pack(blocks, type_name, shape))
    dense_bf16 = (x.bfloat16() @ weight.bfloat16().T).float()
    scale = reference.abs().max()
    assert packed.dtype == torch.float32
    assert (packed - reference).abs().max() / scale < 1e-2
    assert (packed - reference).abs().max() < 2 * (
        dense_bf16 - reference
    ).abs().max() + 1e-3 * scale


def test_a_linear_runs_packed_unchanged() -> None:
    shape = (64, 256)
    blocks = _blocks("Q4_K", shape)
    weight = pack(blocks, "Q4_K", shape)
    linear = nn.Linear(256, 64)
    bind_packed(linear, weight)
    assert linear.weight.shape == (64, 256) and linear.weight.dtype == torch.float32
    x = torch.randn(2, 5, 256)
    assert torch.equal(linear(x), packed_linear(x, weight, linear.bias))
    assert linear(x).shape == (2, 5, 64)
    with pytest.raises(NotImplementedError, match="only F.linear"):
        linear.weight.sum()


def test_a_linear_bound_packed_calls_its_operand_as_f_linear_on_it_does() -> None:
    """The direct call (:class:`PackedLinear`) and ``F.linear``'s override give the same bits;
    a subclass of Linear keeps its class, and a dense weight put back runs as a plain Linear."""
    shape = (64, 256)
    weight = pack(_blocks("Q4_1", shape), "Q4_1", shape)
    linear = nn.Linear(256, 64)
    bind_packed(linear, weight)
    assert type(linear) is int4_packed.PackedLinear and isinstance(linear, nn.Linear)
    x = torch.randn(3, 1, 256)
    assert torch.equal(linear(x), torch.nn.functional.linear(x, linear.weight, linear.bias))
    dense = torch.randn(64, 256)
    linear._parameters["weight"] = nn.Parameter(dense)
    assert torch.equal(linear(x), torch.nn.functional.linear(x, dense, linear.bias))

    class Scaled(nn.Linear):
        def forward(self, input: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(input)

    scaled = Scaled(256, 64)
    bind_packed(scaled, weight)
    assert type(scaled) is Scaled
    assert torch.equal(scaled(x), 2 * packed_linear(x, weight, scaled.bias))


def test_rejects_what_it_cannot_pack() -> None:
    with pytest.raises(ValueError, match="not packed"):
        pack(torch.zeros(34 * 16, dtype=torch.uint8), "Q8_0", (16, 32))
    with pytest.raises(ValueError, match="16 rows"):
        pack(torch.zeros(18 * 8, dtype=torch.uint8), "Q4_0", (8, 32))


def test_other_types_run_dequantized_to_bf16() -> None:
    """Q8_0 (and every type but Q4_0/Q4_1/Q4_K) is a bf16 weight: transformers' bf16 values."""
    shape = (64, 256)
    blocks = _blocks("Q8_0", shape)
    weight = int4_packed.operand(blocks, "Q8_0", shape)
    assert weight.dtype == torch.bfloat16
    assert torch.equal(weight, dequantize(blocks, "Q8_0", shape, torch.bfloat16))
    assert isinstance(
        int4_packed.operand(_blocks("Q4_1", shape), "Q4_1", shape), int4_packed.PackedInt4
    )
    module = nn.Linear(256, 64)
    bind_packed(module, weight)
    x = torch.randn(3, 256)
    expected = (x.bfloat16() @ weight.T).float() + module.bias
    assert torch.equal(module(x), expected)


def test_rows_the_kernel_cannot_take_run_as_bf16() -> None:
    """N not a multiple of 16: the int4 packing refuses it, so the operand is bf16."""
    shape = (40, 256)
    blocks = _blocks("Q4_K", shape)
    weight = int4_packed.operand(blocks, "Q4_K", shape)
    assert isinstance(weight, torch.Tensor) and weight.dtype == torch.bfloat16
    assert torch.equal(weight, dequantize(blocks, "Q4_K", shape, torch.bfloat16))


def test_blocks_at_an_odd_byte_offset() -> None:
    shape = (64, 256)
    blocks = _blocks("Q4_K", shape)
    buffer = torch.zeros(blocks.numel() + 1, dtype=torch.uint8)
    buffer[1:] = blocks
    moved, packed = pack(buffer[1:], "Q4_K", shape), pack(blocks, "Q4_K", shape)
    assert torch.equal(moved.packed, packed.packed)
    assert torch.equal(moved.scales_and_zeros, packed.scales_and_zeros)


@pytest.mark.parametrize("type_name, shape", [("Q4_0", (64, 256)), ("Q4_K", (40, 256)), ("Q8_0", (64, 256))])
def test_the_bytes_an_operand_makes_are_counted_as_made(type_name: str, shape: tuple[int, int]) -> None:
    """`operand_nbytes` is what `operand` makes (a Q4 weight whose rows the kernel cannot
    take is bf16); a stored int4 form in this CPU's layout makes nothing, in another the
    operand of its rebuilt blocks."""
    made = int4_packed.operand(_blocks(type_name, shape), type_name, shape)
    nbytes = made.nbytes if isinstance(made, int4_packed.PackedInt4) else made.numel() * made.element_size()
    assert int4_packed.operand_nbytes(type_name, shape) == nbytes
    rows = int4_form.cpu_block_rows()
    if type_name == "Q4_0" and rows is not None:
        assert int4_packed.made_nbytes(type_name, shape, rows) == 0
        other = 32 if rows != 32 else 64
        assert int4_packed.made_nbytes(type_name, shape, other) == nbytes


@pytest.mark.parametrize("type_name, shape", [("Q8_0", (3000, 256)), ("Q4_K", (40, 256))])
@pytest.mark.parametrize("tokens", [1, 7])
def test_a_streamed_unit_keeps_its_blocks_and_multiplies_them_by_rows(
    type_name: str, shape: tuple[int, int], tokens: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bound for one pass, a weight computed in bf16 stays its blocks (nothing made beside the
    read buffer) and each product dequantizes a few rows at a time: the same bits as the
    product with the whole weight dequantized (each output is the same dot product). A Q4
    weight the kernel takes is packed either way."""
    monkeypatch.setattr(int4_packed, "ROWS_ELEMENTS", 256 * 7)  # several steps, the last one short
    blocks = _blocks(type_name, shape)
    rows = int4_packed.operand(blocks, type_name, shape, streamed=True)
    assert isinstance(rows, int4_packed.BlockRows)
    assert int4_packed.operand_nbytes(type_name, shape, streamed=True) == 0
    module = nn.Linear(shape[1], shape[0])
    bind_packed(module, rows)
    x = torch.randn(2, tokens, shape[1])
    want = int4_packed.linear(x, int4_packed.operand(blocks, type_name, shape), module.bias)
    assert torch.equal(module(x), want)
    assert isinstance(int4_packed.operand(_blocks("Q4_0", (64, 256)), "Q4_0", (64, 256), streamed=True),
                      int4_packed.PackedInt4)
