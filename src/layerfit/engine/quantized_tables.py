"""An embedding table stored as GGML blocks, bound as its blocks: a lookup dequantizes its rows.

A language model's embedding is its largest matrix (49152 x 576 in a 135 M chat model:
113 MB of float32 from 30 MB of Q8_0 blocks). Dequantized whole when bound, it would
cost four times its blocks for a pass that reads a few rows. :class:`QuantizedTable` is
bound in its place instead: a wrapper tensor with the table's shape and dtype over the
blocks in the read buffer (no copy) that answers ``F.embedding`` by dequantizing only the
distinct rows its ids look up. The values are the rows of the whole table dequantized,
bit for bit (a row is whole blocks, dequantized by the same function), so the output is
what the dequantized table gives.

Only ``F.embedding`` runs on it; any other use of its values (a tied head reading it as a
matrix is bound through its own place, :mod:`.int4_packed` or dequantized) raises, so a
wrong use is loud rather than wrong.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from layerfit.engine.dequantize import dequantize


class QuantizedTable(torch.Tensor):
    """An embedding table of ``shape`` and ``dtype`` whose rows are ``ggml`` blocks in
    ``blocks`` (uint8, one row's blocks after another)."""

    blocks: torch.Tensor
    ggml: str

    @staticmethod
    def __new__(cls, blocks: torch.Tensor, ggml: str, shape: tuple[int, int], dtype: torch.dtype) -> QuantizedTable:
        table = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device=blocks.device)
        table.blocks = blocks
        table.ggml = ggml
        return table

    def __repr__(self) -> str:  # noqa: D105
        return f"QuantizedTable(shape={tuple(self.shape)}, dtype={self.dtype}, {self.ggml})"

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The table's rows ``ids`` (any shape), dequantized: only the distinct ones are."""
        count, width = self.shape
        flat = ids.reshape(-1)
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= count):
            raise IndexError("index out of range in self")  # what F.embedding raises
        distinct, where = torch.unique(flat, return_inverse=True)
        picked = self.blocks.view(count, -1)[distinct].reshape(-1)
        values = dequantize(picked, self.ggml, (distinct.numel(), width), torch.float32)
        if self.dtype != torch.float32:
            values = values.to(self.dtype)
        return values[where].view(*ids.shape, width)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        """``F.embedding`` with this as its weight -> :meth:`rows`; other calls go on to dispatch."""
        kwargs = kwargs or {}
        if func is F.embedding:
            ids, table = args[0], args[1] if len(args) > 1 else kwargs["weight"]
            extra = {**dict(zip(("padding_idx", "max_norm"), args[2:4], strict=False)), **kwargs}
            if extra.get("max_norm") is not None:
                raise NotImplementedError("an embedding with max_norm renormalises its table: bind it dequantized")
            return table.rows(ids)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        """Reached by every operation but ``F.embedding``: there are no dense values to give it."""
        raise NotImplementedError(f"{func} on a quantized embedding table (only F.embedding reads it)")


__all__ = ["QuantizedTable"]
