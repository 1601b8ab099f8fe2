"""Exhaustive search over every schedule of a small flow graph (test oracle).

A state is the number of phases each node has run. From a state, the next phase of any
node may run once the rows it reads exist. For each tensor we find, over *all* complete
schedules, the smallest possible maximum window (rows from the oldest row a consumer may
still read to the newest produced) - a minimax path search over the state graph.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from layerfit.engine.stripes import release_point, slot_reads
from layerfit.tradeoff.parts.flow import FlowGraph, effective_parts, phase_range, read_slots


def _phase_counts(graph: FlowGraph, parts: Sequence[bool], phase_rows: int) -> list[int]:
    return [
        -(-node.rows // phase_rows) if p else 1
        for node, p in zip(graph.nodes, parts, strict=True)
    ]


def brute_force_min_windows(
    graph: FlowGraph, parts: Sequence[bool], phase_rows: int = 1
) -> tuple[list[int], dict[tuple[int, int], int]]:
    """Per-tensor and per-edge minimum buffer rows over every schedule completing the outputs."""
    parts = effective_parts(graph, parts)
    nodes = graph.nodes
    count = len(nodes)
    total = _phase_counts(graph, parts, phase_rows)
    slots = read_slots(graph, parts)
    consumers: list[list[tuple[int, int]]] = [[] for _ in nodes]  # (consumer, input slot) per node
    for c, node in enumerate(nodes):
        for slot, i in enumerate(node.inputs):
            consumers[i].append((c, slot))

    def produced(state: tuple[int, ...], n: int) -> int:
        if state[n] == 0:
            return 0
        return phase_range(nodes[n], parts[n], phase_rows, state[n] - 1)[1] + 1

    def oldest(state: tuple[int, ...], c: int, slot: int) -> int:
        return release_point(slots[c][slot], produced(state, c), nodes[c].rows)

    def costs(state: tuple[int, ...]) -> tuple[list[int], dict[tuple[int, int], int]]:
        tensor = [0] * count
        edge: dict[tuple[int, int], int] = {}
        for t in range(count):
            p = produced(state, t)
            low = p
            for c, slot in consumers[t]:
                o = oldest(state, c, slot)
                low = min(low, o)
                edge[(t, c)] = max(edge.get((t, c), 0), p - min(o, p))
            tensor[t] = p - low if consumers[t] else 0
        return tensor, edge

    def successors(state: tuple[int, ...]):
        for n in range(count):
            if state[n] >= total[n]:
                continue
            a, b = phase_range(nodes[n], parts[n], phase_rows, state[n])
            ok = True
            for slot in slots[n]:
                lo, hi = slot_reads(slot, a, b)
                if lo <= hi and produced(state, slot[0]) <= hi:
                    ok = False
                    break
            if ok:
                yield state[:n] + (state[n] + 1,) + state[n + 1 :]

    start = (0,) * count

    def is_final(state: tuple[int, ...]) -> bool:
        return all(state[o] >= total[o] for o in graph.outputs)
    cache: dict[tuple[int, ...], tuple[list[int], dict[tuple[int, int], int]]] = {}

    def cost_of(state):
        if state not in cache:
            cache[state] = costs(state)
        return cache[state]

    def minimax(key) -> int:
        best = {start: key(cost_of(start))}
        heap = [(best[start], start)]
        while heap:
            value, state = heapq.heappop(heap)
            if is_final(state):
                return value
            if value > best.get(state, value):
                continue
            for nxt in successors(state):
                v = max(value, key(cost_of(nxt)))
                if v < best.get(nxt, 1 << 60):
                    best[nxt] = v
                    heapq.heappush(heap, (v, nxt))
        raise AssertionError("no complete schedule")

    tensor_min = [minimax(lambda c, t=t: c[0][t]) for t in range(count)]
    edge_keys = {(t, c) for t in range(count) for c, _ in consumers[t]}
    edge_min = {k: minimax(lambda c, k=k: c[1].get(k, 0)) for k in sorted(edge_keys)}
    return tensor_min, edge_min
