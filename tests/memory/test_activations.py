"""Activation bytes of a captured graph: a view owns no bytes and keeps its base alive."""

from __future__ import annotations

from graph_helpers import toy_graph as graph

from layerfit.memory.activations import activation_bytes, activation_records
from layerfit.memory.from_graph import records_from_graph
from layerfit.schedule.runtime.profiler import activation_peak_bytes
from layerfit.tradeoff.swapnet.partition import planned_arena_bytes

# x -> a (op 0); v = a.view(...) (op 1); b = g(x) (op 2); out = h(v, b) (op 3): a's last
# reader is the view op, but its storage is read through v until op 3, while b is live.
OUTLIVES = graph(
    [((0,), (1,), False), ((1,), (2,), False), ((0,), (3,), False), ((2, 3), (4,), False)],
    [(0, 0, 2, 100), (1, 0, 1, 1000), (2, 1, 3, 1000, 1), (3, 2, 3, 500), (4, 3, 3, 10)],
)

# a (op 0, 64 bytes) broadcast by expand into a view of 6400 bytes (op 1), read by op 2
EXPAND = graph(
    [((0,), (1,), False), ((1,), (2,), False), ((2,), (3,), False)],
    [(0, 0, 0, 8), (1, 0, 1, 64), (2, 1, 2, 6400, 1), (3, 2, 2, 64)],
)


def test_a_view_keeps_its_base_alive_and_owns_nothing() -> None:
    records = activation_records(OUTLIVES)
    assert [(r.id, r.first_op, r.last_op, r.size) for r in records] == [
        (0, 0, 2, 100),
        (1, 0, 3, 1000),  # a, with its view v, lives until op 3 reads v
        (3, 2, 3, 500),
        (4, 3, 3, 10),
    ]
    # at op 2: x + a (read later through v) + b; dropping the view would free a after op 1
    assert activation_bytes(OUTLIVES) == 100 + 1000 + 500
    assert activation_peak_bytes(OUTLIVES) == activation_bytes(OUTLIVES)


def test_an_expand_view_adds_no_bytes_to_its_base() -> None:
    assert [(r.id, r.size) for r in activation_records(EXPAND)] == [(0, 8), (1, 64), (3, 64)]
    assert activation_bytes(EXPAND) == 64 + 64
    # the activation planner's records keep TFLite's accounting: a broadcast is a tensor
    planner = records_from_graph(EXPAND, inplace=False, alignment=1).records
    assert [(r.id, r.size) for r in planner] == [(0, 8), (1, 6400), (3, 64)]


def test_an_arena_strategy_lays_out_the_same_records_aligned() -> None:
    # x, a and b aligned at op 2; the output takes x's place after it
    assert activation_bytes(OUTLIVES, "greedy_by_size", alignment=64) == 128 + 1024 + 512
    assert activation_bytes(OUTLIVES, alignment=64) == 128 + 1024 + 512
    assert planned_arena_bytes(OUTLIVES) == activation_bytes(OUTLIVES, "greedy_by_size", alignment=64)
    assert activation_bytes(graph([], [])) == 0
