"""Dependency graphs of the four schemes (thesis §4.1.2, Figures 4.3–4.8)."""

from __future__ import annotations

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from schedule_helpers import net

from layerfit.errors import ScheduleError
from layerfit.schedule.graph import (
    GraphCache,
    build_graph,
    build_job_graph,
    count_orders,
    draw_graph,
    edges_by_label,
    tasks_of,
    transitive_reduction,
)
from layerfit.schedule.tasks import Job, Pool, TaskKind

THREE = net("a", [1, 2, 3])
FOUR = net("b", [1, 1, 5, 2], kinds=["conv", "conv", "fc", "fc"])


def test_partial_graph_is_the_layer_semantics():
    assert edges_by_label(build_graph([THREE], "partial")) == {
        ("I", "L0"),
        ("I", "L1"),
        ("I", "L2"),
        ("L0", "E0"),
        ("L1", "E1"),
        ("L2", "E2"),
        ("E0", "E1"),
        ("E1", "E2"),
        ("E0", "U0"),
        ("E1", "U1"),
        ("E2", "U2"),
    }


def test_linear_graph_has_exactly_one_order():
    graph = build_graph([THREE], "linear")
    assert edges_by_label(graph) == {
        ("I", "L0"),
        ("L0", "E0"),
        ("E0", "U0"),
        ("U0", "L1"),
        ("L1", "E1"),
        ("E1", "U1"),
        ("U1", "L2"),
        ("L2", "E2"),
        ("E2", "U2"),
    }
    assert count_orders(graph) == 1


def test_bulk_graph_loads_all_then_executes_then_frees():
    assert edges_by_label(build_graph([THREE], "bulk")) == {
        ("I", "L0"),
        ("I", "L1"),
        ("I", "L2"),
        ("L0", "E0"),
        ("L1", "E0"),
        ("L2", "E0"),
        ("E0", "E1"),
        ("E1", "E2"),
        ("E2", "U0"),
        ("E2", "U1"),
        ("E2", "U2"),
    }


def test_deepeye_graph_loads_the_conv_part_before_it_runs():
    edges = edges_by_label(build_graph([FOUR], "deepeye"))
    assert {("L0", "E0"), ("L1", "E0"), ("L2", "E2"), ("L3", "E3")} <= edges
    assert ("L1", "E1") not in edges  # implied by L1 -> E0 -> E1
    pools = {
        t.layer: t.pool for t in tasks_of(build_graph([FOUR], "deepeye")) if t.kind is TaskKind.LOAD
    }
    assert pools == {0: Pool.CONV, 1: Pool.CONV, 2: Pool.FC, 3: Pool.FC}


def test_deepeye_chains_networks_of_one_job():
    edges = edges_by_label(build_graph([FOUR, FOUR], "deepeye"))
    assert ("L1", "1.L0") in edges  # conv loads in one chain across networks
    assert ("L3", "1.L2") in edges  # fc loads in one chain
    assert ("E1", "1.E0") in edges  # conv executions in one chain
    assert ("1.L1", "E0") in edges  # every conv load of the job before the first conv execution


@pytest.mark.parametrize("scheme", ["partial", "linear", "bulk", "deepeye"])
def test_graphs_are_acyclic_and_transitively_reduced(scheme):
    graph = build_graph([FOUR, THREE], scheme)
    assert nx.is_directed_acyclic_graph(graph)
    assert set(graph.edges) == set(nx.transitive_reduction(graph).edges)
    assert graph.number_of_nodes() == 2 * 1 + 3 * (4 + 3)


@st.composite
def dags(draw: st.DrawFn) -> tuple[int, list[tuple[int, int]], list[int]]:
    """A DAG on n nodes (edges point forward in a shuffled order) and that order."""
    n = draw(st.integers(1, 24))
    order = draw(st.permutations(range(n)))
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    chosen = draw(st.lists(st.sampled_from(pairs), max_size=60)) if pairs else []
    return n, [(order[a], order[b]) for a, b in chosen], list(order)


@settings(max_examples=200, deadline=None)
@given(dags())
def test_transitive_reduction_is_networkx_s(dag):
    n, edges, order = dag
    successors = [set() for _ in range(n)]
    for a, b in edges:
        successors[a].add(b)
    reduced = transitive_reduction(successors, order)
    graph = nx.DiGraph(edges)
    graph.add_nodes_from(range(n))
    assert {(a, b) for a in range(n) for b in reduced[a]} == set(nx.transitive_reduction(graph).edges)
    assert all(list(succ) == sorted(succ) for succ in reduced)


@pytest.mark.parametrize("scheme", ["partial", "linear", "bulk", "deepeye"])
def test_the_dispatcher_s_graphs_are_the_networkx_graphs(scheme):
    job = Job(id="j7", networks=(FOUR, THREE, FOUR), seq=7)
    cached = GraphCache(scheme).job_graph(job)
    built = build_job_graph(job, scheme)
    assert [t.id for t in cached.tasks] == list(built.nodes)
    assert list(cached.to_networkx().edges) == list(built.edges)  # the same order, too
    assert cached.indegree == [built.in_degree(t.id) for t in cached.tasks]


def test_derived_schemes_have_fewer_orders_than_partial():
    three = net("c", [1, 2, 3], kinds=["conv", "conv", "fc"])
    orders = {
        s: count_orders(build_graph([three], s)) for s in ("partial", "linear", "bulk", "deepeye")
    }
    assert orders["partial"] > max(orders["linear"], orders["bulk"], orders["deepeye"])
    assert orders["linear"] == 1


def test_memory_fields_follow_the_locked_memory_model():
    p = net("m", [10], exec_memory=[3], init_memory=7)
    tasks = {t.kind: t for t in tasks_of(build_graph([p], "partial", job="j"))}
    assert (tasks[TaskKind.LOAD].memory, tasks[TaskKind.LOAD].retained) == (10, 10)
    assert (tasks[TaskKind.EXEC].memory, tasks[TaskKind.EXEC].retained) == (3, 0)
    assert tasks[TaskKind.UNLOAD].releases == (tasks[TaskKind.LOAD].id,)
    assert (tasks[TaskKind.INIT].memory, tasks[TaskKind.INIT].retained) == (7, 7)


def test_estimate_factor_scales_what_the_scheduler_sees_only():
    p = net("m", [100])
    load = next(
        t
        for t in tasks_of(build_graph([p], "partial", estimate_factor=0.5))
        if t.kind is TaskKind.LOAD
    )
    assert (load.memory, load.actual_memory) == (50, 100)


def test_unknown_scheme_is_a_clear_error():
    with pytest.raises(
        ScheduleError, match="unknown scheme 'fast'.*partial, linear, bulk, deepeye"
    ):
        build_graph([THREE], "fast")


def test_draw_graph_writes_an_image(tmp_path):
    out = draw_graph(build_graph([THREE], "bulk"), tmp_path / "g.png")
    assert out.stat().st_size > 1000 and out.read_bytes()[:4] == b"\x89PNG"
