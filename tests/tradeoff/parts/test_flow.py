"""Row-level analysis: minimum buffers and schedules vs. an exhaustive search."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerfit.engine.stripes import release_point, slot_reads, window_extent
from layerfit.tradeoff.parts.flow import FlowGraph, FlowNode, RowPlan, plan_rows
from layerfit.tradeoff.parts.rows import RowMap

from .bruteforce import brute_force_min_windows


def chain(height: int, *layers: tuple[str, int, int, int]) -> FlowGraph:
    """An input of ``height`` rows followed by (name, extent, stride, pad) window layers."""
    nodes = [FlowNode("in", (), (), height, True)]
    for name, extent, stride, pad in layers:
        h_in = nodes[-1].rows
        h_out = (h_in + 2 * pad - extent) // stride + 1
        rmap = RowMap("window", h_in, extent, stride, pad)
        nodes.append(FlowNode(name, (len(nodes) - 1,), (rmap,), h_out, True))
    return FlowGraph(tuple(nodes), (len(nodes) - 1,))


def step_names(plan: RowPlan) -> list[str]:
    return [plan.graph.nodes[n].name for n, _, _ in plan.steps]


def test_row_map_window_with_padding_and_dilation():
    rmap = RowMap("window", 10, window_extent(3, 2), 2, 2)  # k=3, d=2 -> extent 5
    slot = rmap.slot(0, by_parts=True)
    assert slot_reads(slot, 0, 0) == (0, 2)  # rows -2..2, the top two are padding
    assert slot_reads(slot, 1, 1) == (0, 4)
    assert slot_reads(slot, 4, 4) == (6, 9)  # 6..10 clipped at the bottom
    assert release_point(slot, 3, 5) == 4
    assert release_point(slot, 5, 5) == 10  # done: reads nothing more
    whole = rmap.slot(0, by_parts=False)  # read at once: every row, until done
    assert (slot_reads(whole, 4, 4), release_point(whole, 3, 5)) == ((0, 9), 0)


def test_row_map_oldest_skips_padding_only_rows():
    rmap = RowMap("window", 8, 1, 3, 1)  # 1x1 conv, stride 3, pad 1: row 0 reads only padding
    slot = rmap.slot(0, by_parts=True)
    lo, hi = slot_reads(slot, 0, 0)
    assert lo > hi
    assert release_point(slot, 0, 3) == 2


def test_paper_figure3_two_conv_layers():
    """l1 produces rows one by one, l2 is a 5x5 conv: the buffer between holds 5 rows."""
    graph = chain(32, ("l2", 5, 1, 2))
    plan = plan_rows(graph, [True, True])
    assert plan.buffer_rows[0] == 5
    assert plan.phases == (32, 32)
    # With 'same' padding the first phase of l2 needs 3 rows, then the layers alternate.
    assert step_names(plan) == ["in"] * 3 + ["l2", "in"] * 29 + ["l2"] * 3
    unpadded = chain(32, ("l2", 5, 1, 0))
    assert step_names(plan_rows(unpadded, [True, True])) == ["in"] * 5 + ["l2", "in"] * 27 + ["l2"]


def test_whole_layer_needs_its_full_input():
    graph = chain(16, ("a", 3, 1, 1), ("b", 3, 1, 1))
    plan = plan_rows(graph, [True, False, True])
    assert plan.buffer_rows[0] == 16  # a runs whole: it reads all of its input
    assert plan.buffer_rows[1] == 16  # ...and writes all of its output at once
    assert plan.phases == (16, 1, 16)


def test_skip_connection_buffer_covers_the_halo_of_the_main_path():
    # x -> c1(3x3) -> c2(3x3) -> add(x): when add runs row r, c1 has read x up to r + 2
    # and add still needs x row r: x holds the 2-row halo of the main path plus one row.
    nodes = [FlowNode("x", (), (), 12, True)]
    nodes.append(FlowNode("c1", (0,), (RowMap("window", 12, 3, 1, 1),), 12, True))
    nodes.append(FlowNode("c2", (1,), (RowMap("window", 12, 3, 1, 1),), 12, True))
    nodes.append(FlowNode("add", (2, 0), (RowMap.identity(12), RowMap.identity(12)), 12, True))
    graph = FlowGraph(tuple(nodes), (3,))
    plan = plan_rows(graph, [True] * 4)
    assert plan.buffer_rows == (3, 3, 1, 0)
    assert plan.edge_rows[(0, 1)] == 3 and plan.edge_rows[(0, 3)] == 3
    assert brute_force_min_windows(graph, [True] * 4)[0] == [3, 3, 1, 0]


@st.composite
def flow_graphs(draw):
    """Small random graphs: windows with stride/dilation/padding, pointwise, whole layers,
    skip connections and two-input merges."""
    height = draw(st.integers(3, 8))
    nodes = [FlowNode("in", (), (), height, True)]
    for k in range(draw(st.integers(1, 4))):
        prev = len(nodes) - 1
        h_in = nodes[prev].rows
        kind = draw(st.sampled_from(["window", "window", "pointwise", "merge", "whole"]))
        if kind == "merge":
            same = [j for j in range(prev) if nodes[j].rows == h_in]
            if same:
                j = draw(st.sampled_from(same))
                maps = (RowMap.identity(h_in), RowMap.identity(h_in))
                nodes.append(FlowNode(f"m{k}", (prev, j), maps, h_in, True))
                continue
            kind = "pointwise"
        if kind == "whole":
            nodes.append(FlowNode(f"w{k}", (prev,), (RowMap("all", h_in),), h_in, False))
            continue
        if kind == "pointwise":
            nodes.append(FlowNode(f"p{k}", (prev,), (RowMap.identity(h_in),), h_in, True))
            continue
        kernel = draw(st.sampled_from([1, 2, 3, 5]))
        dilation = draw(st.sampled_from([1, 1, 2]))
        stride = draw(st.sampled_from([1, 1, 2, 3]))
        extent = window_extent(kernel, dilation)
        pad = draw(st.integers(0, extent // 2 + 1))
        h_out = (h_in + 2 * pad - extent) // stride + 1
        # Every output row's window must touch a real input row: a row computed from
        # padding alone needs no input, so "minimum buffers" is meaningless there (and
        # PyTorch's pooling refuses such padding).
        touches = all(
            r * stride - pad <= h_in - 1 and r * stride - pad + extent - 1 >= 0 for r in range(max(h_out, 0))
        )
        if h_out < 1 or not touches:
            nodes.append(FlowNode(f"p{k}", (prev,), (RowMap.identity(h_in),), h_in, True))
            continue
        rmap = RowMap("window", h_in, extent, stride, pad)
        nodes.append(FlowNode(f"c{k}", (prev,), (rmap,), h_out, True))
    parts = draw(st.lists(st.booleans(), min_size=len(nodes), max_size=len(nodes)))
    return FlowGraph(tuple(nodes), (len(nodes) - 1,)), parts, draw(st.sampled_from([1, 1, 2]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flow_graphs())
def test_minimum_buffers_equal_exhaustive_search(case):
    """Our schedule's buffers are the smallest any schedule achieves, tensor by tensor and
    edge by edge (so they are also the least total), and they suffice for our schedule."""
    graph, parts, phase_rows = case
    plan = plan_rows(graph, parts, phase_rows)
    tensor_min, edge_min = brute_force_min_windows(graph, parts, phase_rows)
    assert list(plan.buffer_rows) == tensor_min
    for key, rows in edge_min.items():
        assert plan.edge_rows.get(key, 0) == rows
    # every output row is produced, every phase reads rows that exist
    for out in graph.outputs:
        assert sum(1 for n, _, _ in plan.steps if n == out) == plan.phases[out]


def test_graph_validation():
    with pytest.raises(ValueError):
        FlowGraph((FlowNode("a", (1,), (RowMap.identity(2),), 2, True),), (0,))
    with pytest.raises(ValueError):
        plan_rows(chain(4, ("a", 3, 1, 1)), [True])
