"""The operator-order search on wide graphs: bounded time, dependencies respected."""

from __future__ import annotations

import pytest
from graph_helpers import toy_graph

from layerfit.capture.graph import ModelGraph
from layerfit.errors import PlanError
from layerfit.memory import offsets_lower_bound, records_from_graph, search_operator_order
from layerfit.memory.from_graph import _Storage
from layerfit.memory.operator_order import FALLBACK_STATES


def wide_graph(branches: int, length: int) -> ModelGraph:
    """One input feeding ``branches`` chains of ``length`` ops joined by a last op."""
    ops: list[tuple[tuple[int, ...], tuple[int, ...]]] = [((), (0,))]
    ends = []
    tid = 1
    for _ in range(branches):
        prev = 0
        for _ in range(length):
            ops.append(((prev,), (tid,)))
            prev, tid = tid, tid + 1
        ends.append(prev)
    ops.append((tuple(ends), (tid,)))
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, (ins, outs) in enumerate(ops):
        for t in (*ins, *outs):
            first.setdefault(t, i)
            last[t] = i
    return toy_graph(
        [(ins, outs, False) for ins, outs in ops],
        [(t, first[t], last[t], 64 * (1 + (t * 7919) % 13)) for t in sorted(first)],
    )


def test_search_on_a_wide_graph_narrows_its_beam_past_the_time_limit() -> None:
    # 8 parallel branches of 20 ops: every layer fills the beam; without a time limit the
    # full-width search took over two minutes. Past the limit each layer keeps at most
    # FALLBACK_STATES sets, each with at most one successor per branch: the work is
    # bounded by that, not by the clock (a limit this small is passed at once).
    graph = wide_graph(8, 20)
    found = search_operator_order(graph, time_limit=1e-6)
    assert found.states <= len(graph.ops) * FALLBACK_STATES * 8
    assert found.time_limited and not found.exact
    assert found.to_dict()["time_limited"] is True
    records = records_from_graph(graph, found.order).records  # checks the dependencies
    assert offsets_lower_bound(records) == found.peak <= found.captured_peak
    deps = _Storage(graph).dependencies()
    position = {op: p for p, op in enumerate(found.order)}
    assert all(position[d] < position[op] for op in found.order for d in deps[op])


def test_small_graphs_stay_exact_under_the_time_limit() -> None:
    found = search_operator_order(wide_graph(3, 4))
    assert found.exact and not found.time_limited


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), "3"])
def test_search_time_limit_must_be_positive_and_finite(bad) -> None:
    with pytest.raises(PlanError, match="time_limit"):
        search_operator_order(wide_graph(2, 2), time_limit=bad)


def test_best_leaves_min_cost_flow_out_of_large_inputs(monkeypatch) -> None:
    # the min-cost flow network is quadratic (20 s and 1.4 GB at 5 000 tensors): past
    # PORTFOLIO_ARC_LIMIT reuse arcs the portfolio must not build it
    from dataclasses import replace

    from layerfit.memory import STRATEGIES, make_records, plan_objects, plan_offsets
    from layerfit.memory import best as best_module

    def boom(records, **options):
        raise AssertionError("min_cost_flow ran inside the portfolio")

    for name in ("min_cost_flow", "objects:min_cost_flow"):
        approach = "objects" if name == "min_cost_flow" else "offsets"
        entry = STRATEGIES[approach][name]
        monkeypatch.setitem(STRATEGIES[approach], name, replace(entry, function=boom))
    monkeypatch.setattr(best_module, "PORTFOLIO_ARC_LIMIT", 3)
    records = make_records([(i, i, i + 1 + i % 3, 64 * (1 + i % 5)) for i in range(12)])
    objects = plan_objects(records, "best")
    offsets = plan_offsets(records, "best")
    assert "min_cost_flow left out" in objects.note
    assert offsets.total >= offsets.lower_bound
