"""`store/int4_form.py`: a Q4 weight re-expressed for the int4 kernel gives its blocks back,
its operands are torch's, and a manifest refuses a form that does not fit its tensor."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layerfit.errors import ManifestError
from layerfit.store import int4_form
from layerfit.store.ggml_types import ggml_type
from layerfit.store.manifest import Encoding, TensorLayout, _check_encoding


def _blocks(type_name: str, shape: tuple[int, int], seed: int) -> torch.Tensor:
    """Random bytes as blocks, with finite f16 scalars (any bytes are blocks; the f16 values
    matter only to the scales and zeros)."""
    t = ggml_type(type_name)
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 256, (shape[0] * shape[1] // t.block_elems, t.block_bytes), dtype=np.uint8)
    rows[:, 0:4] = rng.uniform(1e-3, 1e-2, (len(rows), 2)).astype(np.float16).view(np.uint8)
    return torch.from_numpy(rows.reshape(-1))


@settings(max_examples=40, deadline=None)
@given(
    type_name=st.sampled_from(int4_form.INT4_TYPES),
    rows=st.sampled_from(int4_form.BLOCK_ROWS),
    blocks_of_rows=st.integers(1, 3),
    row_blocks=st.integers(1, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_form_gives_the_blocks_back(type_name: str, rows: int, blocks_of_rows: int, row_blocks: int, seed: int):
    shape = (rows * blocks_of_rows, ggml_type(type_name).block_elems * row_blocks * (2 if type_name != "Q4_K" else 1))
    blocks = _blocks(type_name, shape, seed)
    assert int4_form.eligible(type_name, shape, rows)
    form = int4_form.to_form(blocks, type_name, shape, rows)
    assert form.numel() == int4_form.form_nbytes(type_name, shape)
    assert torch.equal(int4_form.to_blocks(form, type_name, shape, rows), blocks)
    by_row = int4_form.blocks_by_row(blocks, type_name, shape)
    codes, width = int4_form.code_bytes(by_row, type_name)
    packed = int4_form.layout(codes, width, *shape, rows)
    assert torch.equal(int4_form.unlayout(packed, width, *shape, rows), codes)


@pytest.mark.parametrize("type_name", int4_form.INT4_TYPES)
def test_the_form_holds_torchs_operands(type_name: str):
    """On this CPU's layout the form's first two arrays are what torch's op packs and what
    the mapping computes: binding them converts nothing."""
    rows = int4_form.cpu_block_rows()
    if rows is None:
        pytest.skip("this torch has no int4 packing op of a known layout")
    shape = (2 * rows, 512)
    blocks = _blocks(type_name, shape, 54)
    codes, pairs = int4_form.operands(int4_form.to_form(blocks, type_name, shape, rows), type_name, shape)
    by_row = int4_form.blocks_by_row(blocks, type_name, shape)
    code_bytes, _ = int4_form.code_bytes(by_row, type_name)
    plain = torch.stack((code_bytes & 0xF, code_bytes >> 4), dim=2).reshape(shape).to(torch.int32)
    assert torch.equal(codes, torch.ops.aten._convert_weight_to_int4pack_for_cpu(plain, 1))
    assert torch.equal(pairs, int4_form.scales_and_zeros(by_row, type_name))


def test_the_form_is_at_most_1_22_times_the_blocks():
    for type_name in int4_form.INT4_TYPES:
        shape = (4096, 11008 // 256 * 256)
        ratio = int4_form.form_nbytes(type_name, shape) / (
            shape[0] * shape[1] // ggml_type(type_name).block_elems * ggml_type(type_name).block_bytes
        )
        assert 1.19 < ratio < 1.23


def _layout(encoding: Encoding, shape: tuple[int, ...], nbytes: int) -> TensorLayout:
    return TensorLayout("w", "param", "float32", shape, 0, nbytes, ("m.weight",), encoding=encoding)


def test_a_manifest_states_the_form_and_refuses_one_that_does_not_fit():
    enc = Encoding("Q4_0", int4_rows=64)
    assert Encoding.from_dict(enc.to_dict()) == enc
    assert Encoding.from_dict({"ggml": "Q4_0"}) == Encoding("Q4_0")
    for bad in ({"ggml": "Q4_0", "int4_rows": "64"}, {"ggml": "Q4_0", "packed": True}, {"ggml": "Q4_0", "int4_rows": True}):
        with pytest.raises(ValueError, match="encoding"):
            Encoding.from_dict(bad)
    shape = (128, 256)
    _check_encoding(_layout(enc, shape, int4_form.form_nbytes("Q4_0", shape)), "the test")
    refused = [
        _layout(enc, shape, int4_form.form_nbytes("Q4_0", shape) - 1),  # a byte short
        _layout(Encoding("Q8_0", int4_rows=64), shape, 100),  # not a Q4 type
        _layout(Encoding("Q4_0", int4_rows=64), (96, 256), int4_form.form_nbytes("Q4_0", (96, 256))),  # rows
        _layout(Encoding("Q4_0", int4_rows=48), shape, int4_form.form_nbytes("Q4_0", shape)),  # no such layout
        _layout(Encoding("Q4_0", True, 64), shape, int4_form.form_nbytes("Q4_0", shape)),  # transposed
        _layout(enc, (2, 64, 256), 1000),  # experts
    ]
    for layout in refused:
        with pytest.raises(ManifestError, match="'w' in the test"):
            _check_encoding(layout, "the test")
