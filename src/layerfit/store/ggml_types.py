"""The GGML tensor types a GGUF file may name: id, block of elements, bytes per block.

A GGUF tensor names its encoding by a number (``F16`` is 1, ``Q4_K`` is 12); a quantized
type packs ``block_elems`` consecutive numbers of a row into ``block_bytes`` bytes, so a
row's length must be a whole number of blocks and its bytes follow from it. The table is
llama.cpp's ``ggml_type`` as the ``gguf`` package states it (``GGMLQuantizationType`` and
``GGML_QUANT_SIZES``); it is written out here, not imported, because reading or running a
prepared model must not need ``gguf`` (``tests/store/test_ggml_types.py`` checks the two
agree). ``SUPPORTED`` names the types ``prepare gguf:FILE`` converts; the other types are
known, so a file holding them is still read, and refused by name where it is prepared.
"""

from __future__ import annotations

from dataclasses import dataclass

QK_K = 256  # elements of a k-quant super-block
MAX_BYTES = 2**63  # a tensor's elements and bytes must stay below it (an int64 in llama.cpp)


@dataclass(frozen=True)
class GGMLType:
    """One GGML tensor type: ``block_elems`` numbers of a row stored in ``block_bytes``."""

    name: str
    type_id: int
    block_elems: int
    block_bytes: int


_TABLE: tuple[tuple[str, int, int, int], ...] = (
    ("F32", 0, 1, 4),
    ("F16", 1, 1, 2),
    ("Q4_0", 2, 32, 2 + 16),
    ("Q4_1", 3, 32, 2 + 2 + 16),
    ("Q5_0", 6, 32, 2 + 4 + 16),
    ("Q5_1", 7, 32, 2 + 2 + 4 + 16),
    ("Q8_0", 8, 32, 2 + 32),
    ("Q8_1", 9, 32, 4 + 4 + 32),
    ("Q2_K", 10, QK_K, 2 + 2 + QK_K // 16 + QK_K // 4),
    ("Q3_K", 11, QK_K, 2 + QK_K // 4 + QK_K // 8 + 12),
    ("Q4_K", 12, QK_K, 2 + 2 + QK_K // 2 + 12),
    ("Q5_K", 13, QK_K, 2 + 2 + QK_K // 2 + QK_K // 8 + 12),
    ("Q6_K", 14, QK_K, 2 + QK_K // 2 + QK_K // 4 + QK_K // 16),
    ("Q8_K", 15, QK_K, 4 + QK_K + QK_K // 8),
    ("IQ2_XXS", 16, QK_K, 2 + QK_K // 4),
    ("IQ2_XS", 17, QK_K, 2 + QK_K // 4 + QK_K // 32),
    ("IQ3_XXS", 18, QK_K, 2 + QK_K // 4 + QK_K // 8),
    ("IQ1_S", 19, QK_K, 2 + QK_K // 8 + QK_K // 16),
    ("IQ4_NL", 20, 32, 2 + 16),
    ("IQ3_S", 21, QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    ("IQ2_S", 22, QK_K, 2 + QK_K // 4 + QK_K // 16),
    ("IQ4_XS", 23, QK_K, 2 + 2 + QK_K // 2 + QK_K // 64),
    ("I8", 24, 1, 1),
    ("I16", 25, 1, 2),
    ("I32", 26, 1, 4),
    ("I64", 27, 1, 8),
    ("F64", 28, 1, 8),
    ("IQ1_M", 29, QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32),
    ("BF16", 30, 1, 2),
    ("TQ1_0", 34, QK_K, 2 + 4 * 13),
    ("TQ2_0", 35, QK_K, 2 + 64),
    ("MXFP4", 39, 32, 1 + 16),
    ("NVFP4", 40, 64, 4 + 32),
    ("Q1_0", 41, 128, 2 + 16),
)

TYPES: tuple[GGMLType, ...] = tuple(GGMLType(*row) for row in _TABLE)
BY_ID: dict[int, GGMLType] = {t.type_id: t for t in TYPES}
BY_NAME: dict[str, GGMLType] = {t.name: t for t in TYPES}

# Ids llama.cpp once wrote and no longer reads: named in the refusal so the user knows
# the file is old rather than corrupt.
REMOVED: dict[int, str] = {
    4: "Q4_2",
    5: "Q4_3",
    31: "Q4_0_4_4",
    32: "Q4_0_4_8",
    33: "Q4_0_8_8",
    36: "IQ4_NL_4_4",
    37: "IQ4_NL_4_8",
    38: "IQ4_NL_8_8",
}

# The types `prepare gguf:FILE` converts (dequantizes or keeps as they are).
SUPPORTED: frozenset[str] = frozenset(
    {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}
)


def ggml_type(name_or_id: str | int) -> GGMLType:
    """The type named ``"Q4_K"`` (any case) or numbered ``12``; ValueError for one GGUF
    does not define (a removed id says so)."""
    if isinstance(name_or_id, str):
        found = BY_NAME.get(name_or_id.upper())
        if found is None:
            raise ValueError(f"{name_or_id!r} is not a GGML tensor type ({', '.join(BY_NAME)})")
        return found
    if isinstance(name_or_id, bool) or not isinstance(name_or_id, int):
        raise ValueError(f"{name_or_id!r} is not a GGML tensor type name or id")
    found = BY_ID.get(name_or_id)
    if found is None:
        raise ValueError(f"{describe_unknown(name_or_id)} is not a GGML tensor type layerfit reads")
    return found


def describe_unknown(type_id: int) -> str:
    """An id that names no type, said so the reader knows why: ``type id 31 (Q4_0_4_4,
    which llama.cpp removed)``, or ``type id 99 (unknown to this layerfit)``."""
    if type_id in REMOVED:
        return f"type id {type_id} ({REMOVED[type_id]}, which llama.cpp removed)"
    return f"type id {type_id} (unknown to this layerfit)"


def row_nbytes(t: GGMLType, cols: int) -> int:
    """Bytes of one row of ``cols`` numbers of type ``t``; ValueError where ``cols`` is
    negative or not a whole number of ``t``'s blocks."""
    if cols < 0:
        raise ValueError(f"a row of {cols} numbers is negative")
    blocks, rest = divmod(cols, t.block_elems)
    if rest:
        raise ValueError(f"a row of {cols:,} numbers is not a whole number of {t.name} blocks of {t.block_elems}")
    return blocks * t.block_bytes


def tensor_nbytes(t: GGMLType, shape: tuple[int, ...] | list[int]) -> int:
    """Bytes of a tensor of ``shape`` (torch order: the last dimension is the row GGUF
    calls ``ne[0]``) stored as ``t``; ValueError where a dimension is negative, the row is
    not whole blocks, or the elements or bytes reach 2**63 (no int64 could count them).
    A shape of ``()`` is one number."""
    elements = 1
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise ValueError(f"shape {tuple(shape)} has a dimension that is not a whole number >= 0")
        elements *= d
        if elements >= MAX_BYTES:
            raise ValueError(f"shape {tuple(shape)} holds 2**63 numbers or more")
    cols = shape[-1] if len(shape) else 1
    rows = elements // cols if cols else 0
    nbytes = rows * row_nbytes(t, cols)
    if nbytes >= MAX_BYTES:
        raise ValueError(f"shape {tuple(shape)} of {t.name} needs 2**63 bytes or more")
    return nbytes
