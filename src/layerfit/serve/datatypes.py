"""Tensor datatypes of the Open Inference Protocol and their torch counterparts.

The protocol names element types ``BOOL``, ``UINT8`` … ``FP64`` (plus ``BF16``, as Triton
does); the prepared-model manifest names them as torch does (``float32``). This module is
the one place that translates between the two, so the codecs and the model metadata
cannot disagree. ``BYTES`` (length-prefixed strings) has no tensor counterpart and is
refused with a clear message.
"""

from __future__ import annotations

import torch

from layerfit.serve.errors import BadRequestError

#: protocol datatype -> torch dtype, for every fixed-size element type.
TORCH_DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "UINT8": torch.uint8,
    "UINT16": torch.uint16,
    "UINT32": torch.uint32,
    "UINT64": torch.uint64,
    "INT8": torch.int8,
    "INT16": torch.int16,
    "INT32": torch.int32,
    "INT64": torch.int64,
    "FP16": torch.float16,
    "BF16": torch.bfloat16,
    "FP32": torch.float32,
    "FP64": torch.float64,
}

_DATATYPES: dict[torch.dtype, str] = {dtype: name for name, dtype in TORCH_DTYPES.items()}


def datatype_of(dtype: torch.dtype | str) -> str:
    """The protocol datatype of a torch dtype or a manifest dtype name (``"float32"``)."""
    if isinstance(dtype, str):
        resolved = getattr(torch, dtype, None)
        if not isinstance(resolved, torch.dtype):
            raise BadRequestError(f"dtype {dtype!r} has no Open Inference Protocol datatype")
        dtype = resolved
    try:
        return _DATATYPES[dtype]
    except KeyError:
        raise BadRequestError(f"dtype {dtype} has no Open Inference Protocol datatype") from None


def torch_dtype(datatype: str, *, tensor: str) -> torch.dtype:
    """The torch dtype of protocol ``datatype``; the error names the ``tensor`` it was for."""
    if datatype == "BYTES":
        raise BadRequestError(
            f"input {tensor!r}: datatype BYTES is not supported; layerfit models take "
            f"numeric tensors ({', '.join(TORCH_DTYPES)})"
        )
    try:
        return TORCH_DTYPES[datatype]
    except KeyError:
        raise BadRequestError(
            f"input {tensor!r}: unknown datatype {datatype!r}; use one of {', '.join(TORCH_DTYPES)}"
        ) from None


def itemsize(datatype: str) -> int:
    """Bytes per element of a fixed-size protocol datatype."""
    return TORCH_DTYPES[datatype].itemsize
