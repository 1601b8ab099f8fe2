"""A run in row stripes on the engine: its row buffers, which units are bound as one
over which steps, and the kernel stage binding them as one under a streaming policy.
(Outputs equal to the module's, by parts, are tested with the schedules that decide
them, in ``tests/tradeoff/parts``.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from layerfit.engine.engine import Engine
from layerfit.engine.stripes import RowBuffer, held_spans, holds_for
from layerfit.errors import BudgetError, LayerfitError


def test_a_chain_by_parts_is_held_from_its_first_phase_to_its_last() -> None:
    # nodes: 0 input, 1 conv (unit 0), 2 relu (no unit), 3 conv (unit 1), 4 fc (unit 2, whole)
    steps = [(0, 0, 3), (1, 0, 0), (2, 0, 0), (1, 1, 1), (2, 1, 1), (3, 0, 0), (1, 2, 3), (2, 2, 3), (3, 1, 1), (4, 0, 0)]
    by_parts = [False, True, True, True, False]
    unit_of = [None, 0, None, 1, 2]
    assert held_spans(steps, by_parts, unit_of) == [(1, 8, range(0, 2))]
    # Nothing by parts: every unit is bound by its hooks.
    assert held_spans(steps, [False] * 5, unit_of) == []


def test_a_whole_layer_inside_a_span_joins_it_and_spans_that_overlap_merge() -> None:
    # unit 1 runs whole between two phases of unit 0's layer; unit 2's span overlaps.
    steps = [(0, 0, 0), (1, 0, 0), (2, 0, 0), (0, 1, 1), (3, 0, 0), (1, 1, 1), (3, 1, 1)]
    by_parts = [True, False, False, True]
    unit_of = [0, 1, None, 2]
    assert held_spans(steps, by_parts, unit_of) == [(0, 6, range(0, 3))]
    # two chains apart: two spans
    steps = [(0, 0, 0), (0, 1, 1), (1, 0, 1), (2, 0, 0), (2, 1, 1)]
    assert held_spans(steps, [True, False, True], [0, 1, 2]) == [(0, 1, range(0, 1)), (3, 4, range(2, 3))]


def test_units_held_as_one_are_bound_together_under_a_streaming_policy(tiny: Path) -> None:
    """The kernel stage waits for and binds each unit of the chain in order, all bound at
    once, then releases them in order; the pass ends where they end."""
    with Engine(tiny, pipeline="async", budget="100%") as engine:
        assert not engine.policy.resident
        kernels = engine.stream.kernels
        seen = []

        def forward(x: torch.Tensor) -> torch.Tensor:
            kernels.hold(range(0, 3))
            seen.append(sorted(kernels.bound))
            conv = engine.model.conv1  # bound by reference: its weights are real now
            y = torch.nn.functional.conv2d(x, conv.weight, conv.bias, padding=1)
            kernels.let_go()
            seen.append(sorted(kernels.bound))
            return y

        x = torch.randn(1, 3, 16, 16)
        out = engine.run_pass(None, forward, (x,), {}, range(0, 3))
        assert seen == [[0, 1, 2], []]
        assert out.shape == (1, 16, 16, 16)
        assert engine.model.conv1.weight.device.type == "meta"  # released after the pass


def test_a_pass_failing_while_units_are_held_leaves_the_engine_usable(tiny: Path, reference) -> None:
    x, expected = reference
    with Engine(tiny, pipeline="async", budget="100%") as engine:
        kernels = engine.stream.kernels

        def forward(_x: torch.Tensor) -> torch.Tensor:
            kernels.hold(range(0, 3))
            raise RuntimeError("a stripe kernel failed")

        with pytest.raises(RuntimeError, match="stripe kernel failed"):
            engine.run_pass(None, forward, (x,), {}, range(0, 3))
        assert torch.equal(engine(x), expected)
        assert not kernels.held and not kernels.bound


def test_a_policy_or_a_ring_that_cannot_hold_a_chain_is_refused(tiny: Path) -> None:
    spans = [(0, 9, range(0, 5))]
    with Engine(tiny, pipeline="sequential") as engine, pytest.raises(LayerfitError, match="sequential"):
        holds_for(engine.stream, spans)
    with Engine(tiny, pipeline="async", budget="50%") as engine:  # a ring of 24 kB, units 0-4 take 44 kB
        assert sum(engine.blocks[i].nbytes for i in range(5)) > engine.stream.ring.capacity
        with pytest.raises(BudgetError, match="bound at once"):
            holds_for(engine.stream, spans)
    with Engine(tiny, pipeline="preload") as engine:
        assert holds_for(engine.stream, spans).begin == {0: range(0, 5)}


def test_row_buffer_keeps_a_contiguous_window():
    like = torch.zeros(1, 2, 1, 3)
    buf = RowBuffer(3, like)
    for r in range(8):
        buf.release(r - 1)  # a 2-row window slides down; the buffer shifts it to the front
        buf.write(r, torch.full((1, 2, 1, 3), float(r)))
        view = buf.view(max(r - 1, 0), r)
        assert view[0, 0, :, 0].tolist() == [float(i) for i in range(max(r - 1, 0), r + 1)]
    assert buf.high_water == 2
    with pytest.raises(RuntimeError, match="not held"):
        buf.view(0, 7)
    buf.skip_to(10)
    buf.write(10, torch.zeros(1, 2, 3, 3))
    with pytest.raises(RuntimeError, match="overflow"):
        buf.write(13, torch.zeros(1, 2, 1, 3))
