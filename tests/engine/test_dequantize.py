"""`engine/dequantize.py` against both of transformers' GGUF dequantizers, bit for bit.

The references: `gguf.quants.dequantize` (numpy, float32; older transformers' loader) and
`transformers.integrations.gguf.dequant.dequantize` (torch, any dtype; transformers 5.x). Every
byte string is a valid block for these types, so Hypothesis draws the blocks' bytes freely and
then overwrites the f16 scales with the awkward values (subnormal, largest, +-0, +-inf, NaN)
that random bytes rarely hit. Values must be equal bit for bit; where both sides are NaN
only NaN-ness is compared: a NaN's sign and payload follow whichever SIMD or scalar loop
torch picks for the shapes at hand (transformers' and ours broadcast differently), and
gguf's numpy makes NaNs of its own sign for F16, Q4_1 and Q2_K.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerfit.engine.dequantize import TYPES, bytes_per_tensor, dequantize

gguf_quants = pytest.importorskip("gguf.quants")
gguf_types = pytest.importorskip("gguf").GGMLQuantizationType
tf_dequant = pytest.importorskip("transformers.integrations.gguf.dequant")

#: byte offsets of each type's f16 scales inside a block
SCALE_OFFSETS = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}
AWKWARD_F16 = (
    0x0001,
    0x03FF,
    0x0400,
    0x7BFF,
    0xFBFF,
    0x0000,
    0x8000,
    0x7C00,
    0xFC00,
    0x7E00,
    0xFE01,
)
#: the types transformers 5.x's torch dequantizer implements
TRANSFORMERS_TYPES = tuple(name for name in TYPES if hasattr(tf_dequant, f"GGML_{name}"))


def _same(mine: torch.Tensor, ref: torch.Tensor) -> bool:
    """Bit-equal, or both NaN."""
    if mine.dtype != ref.dtype or mine.shape != ref.shape:
        return False
    integer = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}[
        mine.dtype
    ]
    return bool(((mine.view(integer) == ref.view(integer)) | (mine.isnan() & ref.isnan())).all())


@st.composite
def blocks_of(draw, type_name: str) -> np.ndarray:
    """A few random blocks of `type_name`, some scales replaced by awkward f16 values."""
    spec = TYPES[type_name]
    n_blocks = draw(st.integers(1, 6 if spec.elements > 1 else 64))
    raw = np.frombuffer(
        draw(st.binary(min_size=n_blocks * spec.nbytes, max_size=n_blocks * spec.nbytes)), np.uint8
    )
    rows = raw.copy().reshape(n_blocks, spec.nbytes)
    for offset in SCALE_OFFSETS.get(type_name, ()):
        for block in draw(st.lists(st.integers(0, n_blocks - 1), max_size=n_blocks)):
            rows[block, offset : offset + 2] = np.array(
                [draw(st.sampled_from(AWKWARD_F16))], np.uint16
            ).view(np.uint8)
    return rows.reshape(-1)


def _shape(type_name: str, raw: np.ndarray) -> tuple[int, ...]:
    spec = TYPES[type_name]
    return (raw.size // spec.nbytes * spec.elements,)


@pytest.mark.parametrize("type_name", list(TYPES))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_equals_gguf_numpy(type_name: str, data) -> None:
    raw = data.draw(blocks_of(type_name))
    with np.errstate(all="ignore"):
        ref = torch.from_numpy(
            np.ascontiguousarray(gguf_quants.dequantize(raw, gguf_types[type_name])).reshape(-1)
        )
    mine = dequantize(torch.from_numpy(raw), type_name, _shape(type_name, raw))
    assert _same(mine, ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("type_name", TRANSFORMERS_TYPES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_equals_transformers(type_name: str, dtype: torch.dtype, data) -> None:
    raw = torch.from_numpy(data.draw(blocks_of(type_name)))
    ref = tf_dequant.dequantize(raw, getattr(tf_dequant, f"GGML_{type_name}"), dtype)
    assert _same(dequantize(raw, type_name, tuple(ref.shape), dtype), ref)


def _random_blocks(type_name: str, n_blocks: int) -> torch.Tensor:
    generator = np.random.default_rng(54)
    return torch.from_numpy(
        generator.integers(0, 256, n_blocks * TYPES[type_name].nbytes, dtype=np.uint8)
    )


def test_references_disagree_below_float32() -> None:
    """Which types the two references give different bf16/f16 values for (reported in #54).

    gguf's numpy value cast to the dtype (older transformers) against transformers 5.x's torch
    value in that dtype: they differ wherever 5.x rounds a scale or product to the dtype first.
    """
    differs = {}
    for type_name in TRANSFORMERS_TYPES:
        raw = _random_blocks(type_name, 2000)
        with np.errstate(all="ignore"):
            numpy_value = torch.from_numpy(
                gguf_quants.dequantize(raw.numpy(), gguf_types[type_name]).reshape(-1)
            )
        for dtype in (torch.bfloat16, torch.float16):
            torch_value = tf_dequant.dequantize(
                raw, getattr(tf_dequant, f"GGML_{type_name}"), dtype
            )
            differs[type_name, str(dtype)] = not _same(numpy_value.to(dtype), torch_value)
    assert {key for key, value in differs.items() if not value} == {
        ("Q4_0", "torch.float16"),
        ("Q8_0", "torch.float16"),
    }


def test_plain_floats_cast_once() -> None:
    values = torch.randn(3, 64)
    for type_name, stored in (("F32", values), ("F16", values.half()), ("BF16", values.bfloat16())):
        raw = stored.contiguous().view(torch.uint8).reshape(-1)
        for dtype in (torch.float32, torch.bfloat16):
            assert torch.equal(dequantize(raw, type_name, (3, 64), dtype), stored.to(dtype))


@pytest.mark.parametrize("type_name", ["Q4_K", "Q8_0", "Q6_K", "Q5_0"])
def test_writes_into_out_across_chunks(type_name: str, monkeypatch) -> None:
    """`out` is filled in place, and chunking does not change a value."""
    shape = (64, 512)
    raw = _random_blocks(type_name, bytes_per_tensor(type_name, shape) // TYPES[type_name].nbytes)
    whole = dequantize(raw, type_name, shape)
    monkeypatch.setattr("layerfit.engine.dequantize.CHUNK_ELEMENTS", 1000)
    out = torch.empty(shape)
    assert dequantize(raw, type_name, shape, out=out) is out
    assert _same(out, whole)


def test_rejects_wrong_sizes() -> None:
    raw = torch.zeros(18 * 4, dtype=torch.uint8)
    with pytest.raises(ValueError, match="blocks of 32"):
        dequantize(raw, "Q4_0", (100,))
    with pytest.raises(ValueError, match="bytes"):
        dequantize(raw, "Q4_0", (256,))
    with pytest.raises(ValueError, match="out must be"):
        dequantize(raw, "Q4_0", (128,), out=torch.empty(128, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="not supported"):
        dequantize(raw, "IQ2_XXS", (256,))


@pytest.mark.parametrize("offset", [1, 2, 3])
def test_blocks_at_any_byte_offset(offset: int) -> None:
    """A tensor's blocks may start anywhere in a buffer; the values do not depend on it."""
    for type_name in ("Q4_0", "Q6_K", "F32", "F16"):
        spec = TYPES[type_name]
        raw = _random_blocks(type_name, 512 // spec.elements)
        buffer = torch.zeros(raw.numel() + offset, dtype=torch.uint8)
        buffer[offset:] = raw
        shape = (512,)
        assert _same(
            dequantize(buffer[offset:], type_name, shape), dequantize(raw, type_name, shape)
        )
