"""The GGML type table against the ``gguf`` package's (ids, block sizes, type sizes), the
byte counts of rows and tensors, and that reading a GGUF file never imports ``gguf``."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerfit.store.ggml_types import (
    BY_ID,
    BY_NAME,
    REMOVED,
    SUPPORTED,
    TYPES,
    GGMLType,
    ggml_type,
    row_nbytes,
    tensor_nbytes,
)

gguf = pytest.importorskip("gguf")
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # noqa: E402
from gguf.quants import quant_shape_to_byte_shape  # noqa: E402


def test_the_table_is_ggufs() -> None:
    theirs = {q.name: (int(q), *GGML_QUANT_SIZES[q]) for q in GGMLQuantizationType}
    ours = {t.name: (t.type_id, t.block_elems, t.block_bytes) for t in TYPES}
    assert ours == theirs
    assert len(BY_ID) == len(BY_NAME) == len(TYPES)


def test_removed_ids_are_not_types_and_supported_ones_are() -> None:
    assert not set(REMOVED) & set(BY_ID)
    assert set(REMOVED.values()).isdisjoint(BY_NAME)
    expected = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}
    assert set(SUPPORTED) == expected and expected <= set(BY_NAME)


def test_ggml_type_by_name_or_id() -> None:
    assert ggml_type("Q4_K") == ggml_type(12) == ggml_type("q4_k") == GGMLType("Q4_K", 12, 256, 144)
    assert ggml_type(0).name == "F32" and ggml_type("BF16").type_id == 30
    with pytest.raises(ValueError, match="Q4_0_4_4, which llama.cpp removed"):
        ggml_type(31)
    with pytest.raises(ValueError, match="unknown to this layerfit"):
        ggml_type(99)
    with pytest.raises(ValueError, match="not a GGML tensor type"):
        ggml_type("Q9_Z")
    with pytest.raises(ValueError):
        ggml_type(True)  # type: ignore[arg-type]


def test_row_and_tensor_bytes() -> None:
    q4k, f16 = ggml_type("Q4_K"), ggml_type("F16")
    assert row_nbytes(q4k, 4096) == 16 * 144
    assert tensor_nbytes(q4k, (11008, 4096)) == 11008 * 16 * 144
    assert tensor_nbytes(f16, ()) == 2 and tensor_nbytes(f16, (3, 0)) == 0
    with pytest.raises(ValueError, match="whole number of Q4_K blocks"):
        tensor_nbytes(q4k, (4096, 100))  # the row is the last dimension
    with pytest.raises(ValueError, match="2\\*\\*63"):
        tensor_nbytes(f16, (2**32, 2**32))
    with pytest.raises(ValueError, match="2\\*\\*63"):
        tensor_nbytes(f16, (2**62, 1))  # 2**62 numbers fit, their 2**63 bytes do not
    with pytest.raises(ValueError):
        tensor_nbytes(f16, (-1, 2))
    with pytest.raises(ValueError):
        row_nbytes(f16, -2)


@given(t=st.sampled_from(TYPES), blocks=st.integers(1, 64), rows=st.lists(st.integers(1, 9), max_size=3))
@settings(max_examples=200, deadline=None, database=None)
def test_tensor_bytes_agree_with_gguf(t: GGMLType, blocks: int, rows: list[int]) -> None:
    shape = (*rows, blocks * t.block_elems)
    expected = math.prod(quant_shape_to_byte_shape(shape, GGMLQuantizationType(t.type_id)))
    if t.block_elems == 1:
        expected = math.prod(shape) * t.block_bytes
    assert tensor_nbytes(t, shape) == expected


def test_reading_gguf_files_never_imports_gguf() -> None:
    code = (
        "import sys; sys.modules['gguf'] = None\n"
        "import layerfit.store.gguf_file, layerfit.store.ggml_types\n"
        "assert sys.modules['gguf'] is None\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
