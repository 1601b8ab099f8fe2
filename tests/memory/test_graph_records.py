"""Records from captured graphs (views, in-place reuse) and the operator-order search."""

from __future__ import annotations

import itertools

import networkx as nx
import pytest
import torch
from graph_helpers import toy_graph as graph
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from layerfit.capture import capture
from layerfit.capture.graph import ModelGraph
from layerfit.errors import PlanError
from layerfit.memory import offsets_lower_bound, plan_offsets, validate_plan
from layerfit.memory.from_graph import _Storage, records_from_graph
from layerfit.memory.operator_order import breadth_first_order, peak_position, search_operator_order

# x feeds two branches; the big branch outputs can be consumed before the other branch runs
BRANCHES = graph(
    [((0,), (1,), False), ((0,), (2,), False), ((1,), (3,), False), ((2, 3), (4,), False)],
    [(0, 0, 1, 64), (1, 0, 2, 640), (2, 1, 3, 640), (3, 2, 3, 64), (4, 3, 3, 64)],
)

# conv -> batchnorm -> relu -> view -> fc: BN and ReLU write over their dying inputs
CHAIN = graph(
    [
        ((0,), (1,), False),
        ((1,), (2,), True),
        ((2,), (3,), True),
        ((3,), (4,), False),
        ((4,), (5,), False),
    ],
    [
        (0, 0, 0, 64),
        (1, 0, 1, 256),
        (2, 1, 2, 256),
        (3, 2, 3, 256),
        (4, 3, 4, 256, 3),
        (5, 4, 4, 64),
    ],
)


def test_views_share_storage_and_inplace_ops_reuse_the_dying_input() -> None:
    plain = records_from_graph(CHAIN, inplace=False, alignment=1)
    assert plain.views == 1 and plain.inplace == 0
    assert [(r.id, r.first_op, r.last_op, r.size) for r in plain.records] == [
        (0, 0, 0, 64),
        (1, 0, 1, 256),
        (2, 1, 2, 256),
        (3, 2, 4, 256),  # tensor 4 is a view of 3: one buffer until fc reads it
        (5, 4, 4, 64),
    ]
    fused = records_from_graph(CHAIN, alignment=1)
    assert fused.inplace == 2
    assert [(r.id, r.first_op, r.last_op, r.size) for r in fused.records] == [
        (0, 0, 0, 64),
        (1, 0, 4, 256),  # conv output, overwritten by bn and relu, then viewed
        (5, 4, 4, 64),
    ]
    assert fused.record_of == {0: 0, 1: 1, 2: 1, 3: 1, 4: 1, 5: 5}
    assert offsets_lower_bound(fused.records) == 320 < offsets_lower_bound(plain.records) == 512


def test_inplace_needs_the_input_to_die_there() -> None:
    # x -> relu(x) (in-place capable) -> add(x, relu): x is still needed, so no reuse
    residual = graph(
        [((0,), (1,), False), ((1,), (2,), True), ((1, 2), (3,), True)],
        [(0, 0, 0, 64), (1, 0, 2, 64), (2, 1, 2, 64), (3, 2, 2, 64)],
    )
    recs = records_from_graph(residual, alignment=1)
    # relu cannot overwrite x (add reads it later); add may overwrite x or relu's output
    assert recs.inplace == 1
    assert recs.record_of[2] == 2 and recs.record_of[3] == recs.record_of[1]


def test_order_must_be_topological() -> None:
    with pytest.raises(PlanError, match="depends on"):
        records_from_graph(BRANCHES, [1, 0, 3, 2])
    with pytest.raises(PlanError, match="exactly once"):
        records_from_graph(BRANCHES, [0, 1, 2])


def test_search_runs_the_big_branch_to_completion_first() -> None:
    result = search_operator_order(BRANCHES, alignment=1)
    assert result.captured_peak == 64 + 640 + 640
    assert result.order == (0, 2, 1, 3) and result.peak == 64 + 640 + 64 and result.exact
    assert result.saving == pytest.approx(1 - 768 / 1344)
    records = records_from_graph(BRANCHES, result.order, alignment=1).records
    assert offsets_lower_bound(records) == result.peak
    plan = plan_offsets(records, "best")
    validate_plan(records, plan)
    assert plan.total == 768


def test_breadth_first_order_runs_both_branches_side_by_side() -> None:
    order = breadth_first_order(BRANCHES)
    assert order == (0, 1, 2, 3)
    records = records_from_graph(BRANCHES, order, alignment=1).records
    assert offsets_lower_bound(records) == 1344
    assert peak_position(records) == 1  # op B, with x, a and b all live


def test_beam_search_is_never_worse_than_the_captured_order() -> None:
    result = search_operator_order(BRANCHES, alignment=1, max_states=1)
    assert not result.exact or result.states <= 4
    assert result.peak <= result.captured_peak


@st.composite
def random_graphs(draw) -> ModelGraph:
    m = draw(st.integers(1, 7))
    ops, producer, readers, size, alias = [], {0: None}, {0: []}, {0: draw(st.integers(1, 5))}, {}
    for i in range(m):
        k = draw(st.integers(1, 2))
        ins = tuple(
            sorted(set(draw(st.lists(st.sampled_from(sorted(size)), min_size=1, max_size=k))))
        )
        out = len(size)
        view = draw(st.integers(0, 5)) == 0
        size[out] = size[ins[0]] if view else draw(st.integers(1, 5))
        if view:
            alias[out] = ins[0]
        inplace = draw(st.booleans()) and not view
        if inplace:
            size[out] = size[ins[0]]
        for t in ins:
            readers[t].append(i)
        readers[out] = []
        producer[out] = i
        ops.append((ins, (out,), inplace))
    tensors = []
    for t in sorted(size):
        first = producer[t] if producer[t] is not None else min(readers[t])
        last = m - 1 if not readers[t] else max(readers[t])
        tensors.append(
            (t, first, last, size[t] * 64, alias.get(t))
            if t in alias
            else (t, first, last, size[t] * 64)
        )
    return graph(ops, tensors)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs(), st.booleans())
def test_search_finds_the_best_topological_order(g: ModelGraph, inplace: bool) -> None:
    deps = _Storage(g).dependencies()
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(g.ops)))
    dag.add_edges_from((d, v) for v, ds in enumerate(deps) for d in ds)
    brute = min(
        offsets_lower_bound(records_from_graph(g, order, inplace=inplace).records)
        for order in itertools.islice(nx.all_topological_sorts(dag), 5000)
    )
    result = search_operator_order(g, inplace=inplace)
    assert result.exact and result.peak == brute
    assert (
        offsets_lower_bound(records_from_graph(g, result.order, inplace=inplace).records)
        == result.peak
    )


class Branchy(nn.Module):
    """conv-bn-relu stem, two branches of different widths, concatenated."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.wide = nn.Sequential(nn.Conv2d(8, 32, 1), nn.ReLU(), nn.Conv2d(32, 4, 1))
        self.thin = nn.Sequential(nn.Conv2d(8, 4, 1), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        return torch.cat([self.thin(x), self.wide(x)], dim=1).flatten(1)


def test_captured_model_records_fold_bn_and_relu_into_the_conv_buffer() -> None:
    g = capture(Branchy().eval(), torch.zeros(1, 3, 16, 16))
    plain = records_from_graph(g, inplace=False)
    fused = records_from_graph(g)
    assert fused.inplace >= 3 and len(fused.records) < len(plain.records)
    assert offsets_lower_bound(fused.records) < offsets_lower_bound(plain.records)
    stem_conv = g.ops[0].outputs[0]
    stem_relu = g.ops[2].outputs[0]
    assert fused.record_of[stem_relu] == fused.record_of[stem_conv]
    result = search_operator_order(g)
    assert result.exact and result.peak <= result.captured_peak
    for order in (None, result.order):
        records = records_from_graph(g, order).records
        validate_plan(records, plan_offsets(records, "best"))
