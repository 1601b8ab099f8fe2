"""`engine/q6k_packed.py`: a Q6_K weight's stripes multiplied on the int4 kernel, or
dequantized by stripes without it, give the float32 product within bf16's error, and tell
the engine the bytes each stripe needs and has used."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from layerfit.engine.dequantize import dequantize
from layerfit.engine.int4_packed import form_binds_views, int4_packed_available, linear
from layerfit.engine.q6k_packed import Q6KStripes, q6k_linear
from layerfit.errors import LayerfitError
from layerfit.store import int4_form, q6k_form
from layerfit.store.ggml_types import QK_K


def _weight(shape: tuple[int, int], rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Q6_K blocks of random codes and scales (``d`` near what a quantizer gives a weight of
    rows of unit norm) and their form."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (shape[0] * shape[1] // QK_K, q6k_form.BLOCK_BYTES), dtype=np.uint8)
    blocks[:, 208:210] = rng.uniform(1e-4, 1e-3, (len(blocks), 1)).astype(np.float16).view(np.uint8)
    flat = torch.from_numpy(blocks.reshape(-1))
    return flat, q6k_form.to_form(flat, shape, rows)


def _kernel_rows() -> int:
    rows = int4_form.cpu_block_rows()
    if rows is None or not int4_packed_available():
        pytest.skip("this torch has no int4 kernel of a known layout")
    return rows


@pytest.mark.parametrize("m", [1, 5])
@pytest.mark.parametrize("tail", [0, 7])
@pytest.mark.parametrize("kernel", [True, False])
def test_the_product_is_the_float32_products_within_bf16s_error(
    m: int, tail: int, kernel: bool, monkeypatch: pytest.MonkeyPatch
):
    """Against the float32 product of the dequantized weight (bf16 inputs): within what the
    bf16 product of the bf16 weight (the packed mode's other types) errs, over several
    stripes and a tail of rows stored as blocks."""
    rows = _kernel_rows() if kernel else 32
    monkeypatch.setattr(q6k_form, "STRIPE_ELEMENTS", 4 * rows * 2 * QK_K)  # 4 blocks of rows a stripe
    shape = (9 * rows + tail, 2 * QK_K)
    blocks, form = _weight(shape, rows, 57)
    x = torch.randn(m, shape[1], generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    want = x.float() @ dequantize(blocks, "Q6_K", shape, torch.float32).T
    bf16 = (x @ dequantize(blocks, "Q6_K", shape, torch.bfloat16).T).float()
    got = q6k_linear(x, Q6KStripes(form, shape, rows, kernel=kernel))
    assert got.dtype == torch.float32 and got.shape == (m, shape[0])
    assert (got - want).abs().max() <= 2 * (bf16 - want).abs().max()
    assert (got - want).abs().mean() <= 1.5 * (bf16 - want).abs().mean()
    # through the packed mode's entry point: the model's dtype, any leading dimensions
    assert torch.equal(linear(x.float().view(m, 1, -1), Q6KStripes(form, shape, rows, kernel=kernel)), got.view(m, 1, -1))


@pytest.mark.parametrize("kernel", [True, False])
def test_each_stripe_waits_for_its_bytes_and_says_what_it_used(kernel: bool, monkeypatch: pytest.MonkeyPatch):
    """``arrived`` is asked, before each stripe, for the form's bytes up to that stripe's end,
    and ``used`` told them after: the engine reads and gives back the weight by these. A
    weight whose bytes were given back refuses a second product."""
    rows = _kernel_rows() if kernel else 32
    monkeypatch.setattr(q6k_form, "STRIPE_ELEMENTS", 2 * rows * QK_K)
    shape = (6 * rows + 3, QK_K)
    _, form = _weight(shape, rows, 58)
    events: list[tuple[str, int]] = []
    weight = Q6KStripes(form, shape, rows, kernel=kernel, used=lambda n: events.append(("used", n)),
                        arrived=lambda n: events.append(("arrived", n)))
    q6k_linear(torch.ones(1, QK_K, dtype=torch.bfloat16), weight)
    ends = [end for _, _, _, end in q6k_form.stripes(shape, rows)]
    assert len(ends) == 4 and ends[-1] == form.numel()  # three stripes and the tail
    assert events == [(kind, end) for end in ends for kind in ("arrived", "used")]
    with pytest.raises(LayerfitError, match="second product"):
        q6k_linear(torch.ones(1, QK_K, dtype=torch.bfloat16), weight)


def test_a_streamed_form_binds_as_its_stripes_and_a_held_one_dense():
    """In a streamed unit a Q6_K form makes nothing (its stripes are views of the read
    buffer): on the kernel where this torch packs in the form's layout, dequantized by
    stripes elsewhere. Held, it is the bf16 weight, what its blocks dequantize to."""
    from layerfit.engine.int4_packed import made_nbytes, operand_of_form, read_nbytes

    shape = (64, QK_K)
    for rows in int4_form.BLOCK_ROWS:
        blocks, form = _weight(shape, rows, 59)
        operand = operand_of_form(form, "Q6_K", shape, rows, streamed=True)
        assert isinstance(operand, Q6KStripes) and operand.form.data_ptr() == form.data_ptr()
        assert operand.kernel == form_binds_views(rows)
        assert made_nbytes("Q6_K", shape, rows, streamed=True) == 0 and read_nbytes("Q6_K", shape, rows) == form.numel()
        held = operand_of_form(form, "Q6_K", shape, rows)
        assert torch.equal(held, dequantize(blocks, "Q6_K", shape, torch.bfloat16))
        assert made_nbytes("Q6_K", shape, rows) == held.numel() * 2
