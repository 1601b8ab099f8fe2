"""Which input rows an output row needs: the geometry of processing by parts.

Minakova & Stefanov (Section 2.5, Table 2) process a layer in *phases*: each phase
reads a horizontal stripe of the input and writes a stripe of the output. A convolution
or pooling window of kernel ``k``, dilation ``d``, stride ``s`` and top padding ``p``
makes output row ``o`` read input rows ``o*s - p .. o*s - p + d*(k-1)`` (the *extent*
``K = d*(k-1)+1`` is Table 2's ``H_min^in``; the paper writes ``ks`` for ``d = 1``).
Activations, batch norm and elementwise operators read the same row (``K = 1``);
operators with a full-height receptive field (global pooling, fully connected) read all
rows and cannot be processed by parts.

:class:`RowMap` captures one such dependency; its :meth:`RowMap.slot` is what the
engine's stripes read it as (:data:`~layerfit.engine.stripes.Slot`), which answers
"which input rows does a phase producing output rows ``a..b`` read?" and "which rows will
it read no more?"; every later analysis builds on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from layerfit.engine.stripes import Slot

RowMapKind = Literal["window", "all", "broadcast"]


@dataclass(frozen=True)
class RowMap:
    """How the rows of one input are read to produce output rows.

    ``window``: output row ``o`` reads rows ``[o*stride - pad_top, o*stride - pad_top +
    extent - 1]`` clipped to ``[0, in_rows)``; rows outside the input are padding.
    ``all``: every output row reads every input row (full-height receptive field).
    ``broadcast``: the input has one row that every output row reads (a per-channel
    gate ``[N, C, 1, 1]`` multiplied into a feature map).
    """

    kind: RowMapKind
    in_rows: int
    extent: int = 1
    stride: int = 1
    pad_top: int = 0

    def __post_init__(self) -> None:
        if self.in_rows < 1 or self.extent < 1 or self.stride < 1 or self.pad_top < 0:
            raise ValueError(f"invalid row map {self}")

    @classmethod
    def identity(cls, in_rows: int) -> RowMap:
        """Pointwise operators: output row ``o`` reads input row ``o``."""
        return cls("window", in_rows)

    def slot(self, source: int, by_parts: bool) -> Slot:
        """How a phase of its reader reads this input, node ``source``
        (:data:`~layerfit.engine.stripes.Slot`): a reader run whole reads a window input
        at once, every row, even rows its outputs do not depend on."""
        code = 2 if self.kind == "broadcast" else (1 if by_parts and self.kind == "window" else 0)
        first = -(-(self.pad_top - self.extent + 1) // self.stride)
        return (source, code, self.extent, self.stride, self.pad_top, self.in_rows, first)
