"""Hand-made captured graphs for the memory tests (no model needed)."""

from __future__ import annotations

from layerfit.capture.graph import ModelGraph, OpRecord, TensorRecord


def toy_graph(
    ops: list[tuple[tuple[int, ...], tuple[int, ...], bool]], tensors: list[tuple]
) -> ModelGraph:
    """ops: (inputs, outputs, inplace); tensors: (id, first_op, last_op, nbytes[, alias_of])."""
    return ModelGraph(
        model_type="toy",
        input_shape=(1,),
        input_dtype="float32",
        method="fx",
        units=[],
        ops=[
            OpRecord(i, f"op{i}", "call_function", "f", ins, outs, inp)
            for i, (ins, outs, inp) in enumerate(ops)
        ],
        tensors=[
            TensorRecord(t[0], t[1], t[2], t[3], alias_of=t[4] if len(t) > 4 else None)
            for t in tensors
        ],
    )
