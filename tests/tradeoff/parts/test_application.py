"""Application model (Eq. 1-4) and buffer reuse (Algorithm 1) on the paper's example."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from layerfit.errors import TradeoffError
from layerfit.tradeoff.parts.application import Application, Partition, split_partitions
from layerfit.tradeoff.parts.cnn import CNN, Layer
from layerfit.tradeoff.parts.kernels import cnn_from_module
from layerfit.tradeoff.parts.reuse import SharedBuffer, naive_buffers, reuse_buffers, total_elems

from .single_thread import single_thread  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("single_thread")


def check_buffers(buffers: Sequence[SharedBuffer], parallel: Callable[[str, str], bool]) -> None:
    """Raise AssertionError if two edges sharing a buffer may be used at the same time."""
    for buffer in buffers:
        for i, a in enumerate(buffer.edges):
            if a.elems > buffer.size:
                raise AssertionError(f"edge {a} larger than its buffer ({buffer.size})")
            for b in buffer.edges[i + 1 :]:
                if a.partition != b.partition:
                    if parallel(a.partition, b.partition):
                        raise AssertionError(f"edges {a} and {b} of parallel partitions share a buffer")
                elif a.start <= b.end and b.start <= a.end:
                    raise AssertionError(f"edges {a} and {b} are live together but share a buffer")


def paper_cnns(l5: str = "fc") -> tuple[CNN, CNN]:
    """CNN^1 and CNN^2 of Figure 1, with the edge sizes of Table 1."""
    cnn1 = CNN(
        "cnn1",
        (
            Layer("l1", "input", (), (1, 3, 32, 32)),
            Layer("l2", "conv", ("l1",), (1, 8, 32, 32), kernel=5, padding=2, params=8 * 3 * 25 + 8),
            Layer("l3", "conv", ("l2",), (1, 8, 32, 32), kernel=3, padding=1, params=8 * 8 * 9 + 8),
            Layer("l4", "concat", ("l2", "l3"), (1, 16, 32, 32)),
            Layer("l5", l5, ("l4",), (1, 10) if l5 == "fc" else (1, 16, 32, 32), params=10),
        ),
    )
    cnn2 = CNN(
        "cnn2",
        (
            Layer("l1", "input", (), (1, 3, 32, 32)),
            Layer("l2", "conv", ("l1",), (1, 8, 28, 28), kernel=5, params=8 * 3 * 25 + 8),
            Layer("l3", "fc", ("l2",), (1, 10), params=6272 * 10 + 10),
            Layer("l4", "softmax", ("l3",), (1, 10)),
        ),
    )
    return cnn1, cnn2


def paper_app(fanout: str = "edge", l5: str = "fc", precision: str = "fp32") -> Application:
    cnn1, cnn2 = paper_cnns(l5)
    partitions = [Partition("P1", "cnn1", 0, 5), Partition("P2", "cnn2", 0, 2), Partition("P3", "cnn2", 2, 4)]
    return Application([cnn1, cnn2], partitions, [["P2", "P3"]], fanout=fanout, precision=precision)


def test_table1_naive_allocation():
    derived = paper_app().derive(reuse=False)
    sizes = [(e.label, e.elems) for e in derived.edges]
    assert sizes == [
        ("cnn1:l1->l2", 3072), ("cnn1:l2->l3", 8192), ("cnn1:l2->l4", 8192), ("cnn1:l3->l4", 8192),
        ("cnn1:l4->l5", 16384), ("cnn2:l1->l2", 3072), ("cnn2:l2->l3(1)", 6272), ("cnn2:l2->l3(2)", 6272),
        ("cnn2:l3->l4", 10),
    ]
    assert total_elems(derived.buffers) == 59_658


def test_table8_algorithm1_reuse_across_cnns():
    app = paper_app()
    derived = app.derive(order="paper")
    table = [(b.size, [e.label for e in b.edges]) for b in derived.buffers]
    assert table == [
        (8192, ["cnn1:l1->l2", "cnn1:l3->l4", "cnn2:l1->l2"]),
        (16384, ["cnn1:l2->l3", "cnn1:l4->l5", "cnn2:l2->l3(1)"]),
        (8192, ["cnn1:l2->l4", "cnn2:l2->l3(2)"]),
        (10, ["cnn2:l3->l4"]),
    ]
    assert total_elems(derived.buffers) == 32_778
    check_buffers(derived.buffers, app.is_parallel)
    # Eq. 1-4: parameters and buffers, fp32 and fp16
    params = sum(c.param_count for c in app.cnns)
    assert derived.memory().params == params * 4
    assert derived.memory().buffers == 32_778 * 4
    assert derived.memory("fp16").total == (params + 32_778) * 2
    assert paper_app(precision="fp16").derive(order="paper").memory().total == (params + 32_778) * 2


def test_table9_processing_by_parts_in_l3_to_l5():
    """Algorithm 2's example output: l3, l4, l5 of CNN^1 process data by parts in 32 phases.

    The paper lists e45 at 256 elements; one row of its 16 x 32 x 32 tensor (Table 1) is
    512, which is what a pointwise l5 needs here. The other buffers are as in Table 9."""
    app = paper_app(l5="act")
    bits = [False, False, True, True, True, False, False, False, False]
    derived = app.derive(bits, order="paper")
    table = [(b.size, [e.label for e in b.edges]) for b in derived.buffers]
    assert table == [
        (3072, ["cnn1:l1->l2", "cnn1:l3->l4", "cnn2:l1->l2"]),
        (8192, ["cnn1:l2->l3", "cnn2:l2->l3(1)"]),
        (8192, ["cnn1:l2->l4", "cnn2:l2->l3(2)"]),
        (512, ["cnn1:l4->l5", "cnn2:l3->l4"]),
    ]
    phases = derived.phases
    assert [phases[("cnn1", n)] for n in ("l1", "l2", "l3", "l4", "l5")] == [1, 1, 32, 32, 32]
    steps = derived.plans["P1"].steps
    assert steps[:2] == (("l1",), ("l2",)) and len(steps) == 2 + 3 * 32
    check_buffers(derived.buffers, app.is_parallel)


def test_pipelined_partitions_never_share_and_untileable_genes_are_cleared():
    app = paper_app(fanout="tensor")
    derived = app.derive([True] * app.n_layers)
    for buffer in derived.buffers:
        parts = {e.partition for e in buffer.edges}
        assert not ({"P2", "P3"} <= parts)
    mask = app.tileable_mask()
    assert derived.bits == tuple(mask)
    assert mask == [True, True, True, True, False, True, True, False, False]


def test_tensor_fanout_counts_each_tensor_once():
    app = paper_app(fanout="tensor")
    naive = app.derive(reuse=False)
    # l2's output is one edge read by l3 and l4; the CNN outputs are edges too.
    labels = [e.label for e in naive.edges if e.cnn == "cnn1"]
    assert labels == ["cnn1:l1->l2", "cnn1:l2->l3,l4", "cnn1:l3->l4", "cnn1:l4->l5", "cnn1:l5->out"]


def test_application_validation_names_the_problem():
    cnn1, cnn2 = paper_cnns()
    with pytest.raises(TradeoffError, match="must start at layer 2"):
        Application([cnn1], [Partition("a", "cnn1", 0, 2), Partition("b", "cnn1", 3, 5)])
    with pytest.raises(TradeoffError, match="pipeline stages"):
        Application([cnn1], [Partition("a", "cnn1", 0, 2), Partition("b", "cnn1", 2, 5)], parallel=[])
    with pytest.raises(TradeoffError, match="unknown partition"):
        Application([cnn1], parallel=[["nope"]])
    with pytest.raises(TradeoffError, match="before or with its input"):
        Application([cnn1], schedules={"cnn1.p0": [["l1"], ["l3"], ["l2"], ["l4"], ["l5"]]})
    with pytest.raises(TradeoffError, match="not scheduled"):
        Application([cnn1], schedules={"cnn1.p0": [["l1"], ["l2"]]})
    with pytest.raises(TradeoffError, match="not an earlier layer"):
        CNN("x", (Layer("a", "conv", ("b",), (1, 1, 2, 2)),))
    with pytest.raises(TradeoffError, match="chromosome has 3 genes"):
        Application([cnn1]).derive([True] * 3)


def test_schedule_with_several_layers_per_step():
    branches = CNN(
        "b",
        (
            Layer("x", "input", (), (1, 2, 8, 8)),
            Layer("p", "conv", ("x",), (1, 2, 8, 8), kernel=3, padding=1),
            Layer("q", "conv", ("x",), (1, 2, 8, 8), kernel=1),
            Layer("cat", "concat", ("p", "q"), (1, 4, 8, 8)),
        ),
    )
    app = Application([branches], schedules={"b.p0": [["x"], ["p", "q"], ["cat"]]})
    derived = app.derive(reuse=False)
    assert derived.plans["b.p0"].steps == (("x",), ("p", "q"), ("cat",))
    intervals = {e.producer: (e.start, e.end) for e in derived.edges}
    assert intervals == {"x": (0, 1), "p": (1, 2), "q": (1, 2), "cat": (2, 2)}
    with pytest.raises(TradeoffError, match="runs before or with"):
        Application([branches], schedules={"b.p0": [["x", "p"], ["q"], ["cat"]]})


class TwoBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.a = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))
        self.head = nn.Sequential(nn.MaxPool2d(2), nn.Conv2d(8, 16, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        return self.head(torch.relu(self.a(y) + y))


def test_reuse_is_never_worse_than_the_memory_planner_on_a_single_cnn():
    from layerfit.memory import make_records, plan_objects
    from layerfit.memory.registry import strategy_names

    cnn = cnn_from_module("net", TwoBranch().eval(), torch.randn(1, 3, 16, 16))
    app = Application([cnn])
    for bits in (None, [True] * app.n_layers):
        naive = app.derive(bits, reuse=False)
        records = make_records([(k, e.start, e.end, e.elems) for k, e in enumerate(naive.edges)], alignment=1)
        best_planner = min(
            plan_objects(records, s).total for s in strategy_names("objects", heuristic_only=True)
        )
        ours = app.derive(bits, order="planner")
        assert total_elems(ours.buffers) <= best_planner
        check_buffers(ours.buffers, app.is_parallel)
    # processing by parts shrinks the buffers
    assert app.derive([True] * app.n_layers).memory().buffers < app.derive().memory().buffers


def test_reuse_by_size_is_the_planners_greedy_by_size_when_no_partitions_run_in_parallel():
    """Visiting the largest edges first never grows a buffer: Algorithm 1 then picks the
    smallest suitable buffer, as Pisarchyk & Lee's greedy by size does, on the
    partitions' schedules laid end to end."""
    from layerfit.tradeoff.parts.reuse import planner_buffers

    cnn = cnn_from_module("net", TwoBranch().eval(), torch.randn(1, 3, 16, 16))
    app = Application([cnn, CNN("other", cnn.layers, runner=cnn.runner)])
    for bits in (None, [True] * app.n_layers):
        edges = app.derive(bits, reuse=False).edges
        ours, planner = reuse_buffers(edges, app.is_parallel, "size"), planner_buffers(edges, "greedy_by_size")
        assert [(b.size, b.edges) for b in ours] == [(b.size, sorted(b.edges, key=lambda e: -e.elems)) for b in planner]


def test_split_partitions_balances_macs():
    cnn = cnn_from_module("net", TwoBranch().eval(), torch.randn(1, 3, 16, 16))
    parts = split_partitions(cnn, 2)
    assert parts[0].start == 0 and parts[-1].stop == len(cnn.layers) and parts[0].stop == parts[1].start
    app = Application([cnn], parts)
    assert app.is_parallel(parts[0].name, parts[1].name)
    derived = app.derive([True] * app.n_layers)
    crossing = [e for e in derived.edges if e.copy]
    assert {e.copy for e in crossing} == {1, 2}  # the cut is double buffered
    assert all(e.elems == e.full_elems for e in crossing)


@st.composite
def random_apps(draw):
    """Random multi-CNN applications with pipelined and sequential partitions."""
    rng = random.Random(draw(st.integers(0, 10_000)))
    cnns, partitions, parallel = [], [], []
    for n in range(draw(st.integers(1, 3))):
        layers = [Layer("in", "input", (), (1, 2, rng.randint(4, 9), 3))]
        for k in range(rng.randint(2, 7)):
            prev = layers[-1]
            h = prev.shape[2]
            op = rng.choice(["conv", "act", "add", "pool"])
            if op == "add" and len(layers) > 2 and layers[-2].shape == prev.shape:
                layers.append(Layer(f"a{k}", "add", (prev.name, layers[-2].name), prev.shape))
            elif op == "pool" and h >= 2:
                layers.append(Layer(f"p{k}", "pool", (prev.name,), (1, 2, h // 2, 3), kernel=2, stride=2))
            elif op == "conv":
                layers.append(Layer(f"c{k}", "conv", (prev.name,), prev.shape, kernel=3, padding=1, params=40))
            else:
                layers.append(Layer(f"r{k}", "act", (prev.name,), prev.shape))
        cnn = CNN(f"n{n}", tuple(layers))
        cnns.append(cnn)
        if len(layers) >= 4 and rng.random() < 0.5:
            parts = split_partitions(cnn, 2)
            partitions += parts
            parallel.append([p.name for p in parts])
        else:
            partitions.append(Partition(f"n{n}.p0", cnn.name, 0, len(layers)))
    if len(cnns) > 1 and rng.random() < 0.5:  # two CNNs on two processors
        parallel.append([partitions[0].name, partitions[-1].name])
    app = Application(cnns, partitions, parallel, fanout=rng.choice(["tensor", "edge"]))
    bits = [rng.random() < 0.5 for _ in range(app.n_layers)]
    return app, bits


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_apps())
def test_algorithm1_invariants_on_random_applications(case):
    app, bits = case
    for order in ("paper", "size", "best", "planner"):
        derived = app.derive(bits, order=order)
        check_buffers(derived.buffers, app.is_parallel)
        assert total_elems(derived.buffers) <= total_elems(naive_buffers(derived.edges))
        assert sorted(id(e) for b in derived.buffers for e in b.edges) == sorted(id(e) for e in derived.edges)
    best = total_elems(app.derive(bits, order="best").buffers)
    assert best == min(total_elems(reuse_buffers(app.derive(bits).edges, app.is_parallel, o)) for o in ("paper", "size"))
    # processing by parts never needs more buffer memory than running whole
    assert app.derive(bits, reuse=False).memory().buffers <= app.derive(None, reuse=False).memory().buffers
