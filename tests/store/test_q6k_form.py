"""`store/q6k_form.py`: a Q6_K weight re-expressed for the int4 kernel is its blocks' bytes,
gives them back, lays its codes out as torch's own packing op, and a manifest takes it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layerfit.errors import ManifestError
from layerfit.store import int4_form, q6k_form
from layerfit.store.ggml_types import QK_K
from layerfit.store.manifest import Encoding, TensorLayout, _check_encoding


def _blocks(shape: tuple[int, int], seed: int) -> torch.Tensor:
    """Random bytes as Q6_K blocks (any bytes are blocks; the f16 ``d`` kept finite)."""
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, 256, (shape[0] * shape[1] // QK_K, q6k_form.BLOCK_BYTES), dtype=np.uint8)
    rows[:, 208:210] = rng.uniform(1e-3, 1e-2, (len(rows), 1)).astype(np.float16).view(np.uint8)
    return torch.from_numpy(rows.reshape(-1))


@settings(max_examples=40, deadline=None)
@given(
    rows=st.sampled_from(int4_form.BLOCK_ROWS),
    n=st.integers(1, 200),
    row_blocks=st.integers(1, 3),
    stripe_elements=st.sampled_from([QK_K * 16, QK_K * 64, q6k_form.STRIPE_ELEMENTS]),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_form_is_the_blocks_bytes_and_gives_them_back(
    rows: int, n: int, row_blocks: int, stripe_elements: int, seed: int
):
    shape = (rows + n, QK_K * row_blocks)  # a tail of n mod rows rows where they do not divide
    blocks = _blocks(shape, seed)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(q6k_form, "STRIPE_ELEMENTS", stripe_elements)
        assert int4_form.eligible("Q6_K", shape, rows)
        form = int4_form.to_form(blocks, "Q6_K", shape, rows)
        assert form.numel() == blocks.numel() == int4_form.form_nbytes("Q6_K", shape)
        assert torch.equal(int4_form.to_blocks(form, "Q6_K", shape, rows), blocks)
        parts = list(q6k_form.stripes(shape, rows))
    # the stripes cover the rows and the bytes in order, only the last one a tail
    assert [p[0] for p in parts] == [0, *np.cumsum([p[1] for p in parts[:-1]]).tolist()]
    assert sum(p[1] for p in parts) == shape[0] and parts[-1][3] == form.numel()
    assert all(a[3] == b[2] for a, b in zip(parts, parts[1:], strict=False))
    assert [q6k_form.is_tail(p[1], rows) for p in parts] == [False] * (len(parts) - 1) + [shape[0] % rows != 0]


def test_a_stripe_holds_the_codes_scales_and_layout_torch_packs():
    """A stripe's arrays: the low and high codes in the layout torch's own op gives the
    doubled inputs (low half then high half of each 32), the scales and ``d`` input-major."""
    rows = int4_form.cpu_block_rows()
    if rows is None:
        pytest.skip("this torch has no int4 packing op of a known layout")
    shape = (2 * rows, 2 * QK_K)
    blocks = _blocks(shape, 6)
    form = q6k_form.to_form(blocks, shape, rows)
    (_, r, start, end), = q6k_form.stripes(shape, rows)
    lo, hi, sc, d = q6k_form.split(form[start:end], r, shape[1], rows)
    q, scales, d_bytes = q6k_form.codes(blocks, *shape)
    assert torch.equal(q6k_form.stripe_codes(lo, hi, rows), q)
    assert torch.equal(sc, scales.T) and torch.equal(d, d_bytes.reshape(-1).view(torch.float16).view(r, -1).T)
    doubled = torch.stack((q & 15, q >> 4), dim=1).view(r, 2, -1, 16).transpose(1, 2).reshape(r, -1)
    want = torch.ops.aten._convert_weight_to_int4pack_for_cpu(doubled.int(), 1).view(r // rows, -1, 2, 16, rows // 2)
    assert torch.equal(want[:, :, 0], lo)
    assert torch.equal(want[:, :, 1], torch.cat((hi & 0x33, (hi >> 2) & 0x33), dim=2))


def test_a_manifest_takes_the_form_and_refuses_one_that_does_not_fit():
    shape = [40, QK_K]
    nbytes = q6k_form.form_nbytes(tuple(shape))
    ok = TensorLayout("w", "param", "float32", shape, 0, nbytes, ("w",), encoding=Encoding("Q6_K", int4_rows=32))
    _check_encoding(ok, "unit 0")
    for bad in (
        TensorLayout("w", "param", "float32", [16, QK_K], 0, 16 * 210, ("w",), encoding=Encoding("Q6_K", int4_rows=32)),
        TensorLayout("w", "param", "float32", [40, 128], 0, 40 * 105, ("w",), encoding=Encoding("Q6_K", int4_rows=32)),
        TensorLayout("w", "param", "float32", shape, 0, nbytes - 1, ("w",), encoding=Encoding("Q6_K", int4_rows=32)),
    ):
        with pytest.raises(ManifestError, match="int4"):
            _check_encoding(bad, "unit 0")
