"""Tensor usage records of zoo models at the resolution their papers use.

The model is built with PyTorch's default initialisation (weights do not change the
records, so the zoo's calibrated initialisation is skipped), captured once on a zero
input of the entry's ``input_shape``, and converted by :mod:`layerfit.memory.from_graph`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from layerfit.memory.from_graph import GraphRecords, records_from_graph
from layerfit.memory.records import DEFAULT_ALIGNMENT

if TYPE_CHECKING:
    from layerfit.capture.graph import ModelGraph


def capture_zoo_model(name: str, input_shape: tuple[int, ...] | None = None) -> ModelGraph:
    """The captured graph of zoo model ``name`` (UnknownModelError for other names)."""
    import torch

    from layerfit.capture import capture
    from layerfit.zoo import get

    entry = get(name)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = entry.factory(**entry.kwargs).eval()
    shape = tuple(input_shape or entry.input_shape)
    return capture(model, torch.zeros(shape))


def zoo_records(
    name: str,
    *,
    inplace: bool = True,
    alignment: int = DEFAULT_ALIGNMENT,
    input_shape: tuple[int, ...] | None = None,
) -> GraphRecords:
    """Buffer records of zoo model ``name`` in its captured operator order."""
    return records_from_graph(
        capture_zoo_model(name, input_shape), inplace=inplace, alignment=alignment
    )
