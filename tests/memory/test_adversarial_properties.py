"""Every registered strategy on adversarial record sets, against brute-force optima.

The record sets are the corners a planner gets wrong: zero-size tensors, a single
tensor, all tensors live at once, identical intervals, and sizes near 2**63 bytes
(their sum is at most 2**63 - 1, the limit :func:`check_records` enforces). For every
strategy of both approaches the plan must be legal, at least the lower bound, and at
least the true optimum (brute force over every packing order / partition); heuristics
stay within the naive total; ``best`` is at most every heuristic; CP-SAT says
``optimal`` only for a true optimum.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from layerfit.memory import (
    TensorUsageRecord,
    lower_bound,
    naive_total,
    plan,
    strategy_names,
    validate_plan,
)
from layerfit.memory.records import MAX_BYTES

HUGE = MAX_BYTES // 7  # up to 6 such tensors (and small ones) still add up below 2**63


@st.composite
def adversarial_records(draw) -> list[TensorUsageRecord]:
    n = draw(st.integers(0, 6))
    shape = draw(st.sampled_from(["random", "all live", "identical", "nested"]))
    size = st.one_of(
        st.just(0),
        st.integers(1, 9),
        st.integers(1, 4).map(lambda k: 64 * k),
        st.integers(HUGE - 1000, HUGE),
    )
    records = []
    for i in range(n):
        if shape == "all live":
            first, last = 0, 5
        elif shape == "identical":
            first, last = 2, 3
        elif shape == "nested":
            first, last = i, 2 * n - i
        else:
            first = draw(st.integers(0, 6))
            last = first + draw(st.integers(0, 3))
        records.append(TensorUsageRecord(100 - 7 * i, first, last, draw(size)))
    return records


def _partitions(items: list[int]) -> Iterator[list[list[int]]]:
    if not items:
        yield []
        return
    head, rest = items[0], items[1:]
    for part in _partitions(rest):
        yield [[head], *part]
        for k in range(len(part)):
            yield [*part[:k], [head, *part[k]], *part[k + 1 :]]


def optimum(records: list[TensorUsageRecord], approach: str) -> int:
    """The smallest total of any legal plan, by exhaustion (few records only)."""
    if approach == "objects":
        best = None
        for part in _partitions(list(range(len(records)))):
            if all(
                not records[a].intersects(records[b])
                for block in part
                for a, b in itertools.combinations(block, 2)
            ):
                total = sum(max(records[i].size for i in block) for block in part)
                best = total if best is None else min(best, total)
        return best or 0
    # offsets: every optimal plan is reached by placing the tensors in the order of their
    # offsets, each at the lowest offset clear of the tensors placed before it
    best = None
    for perm in itertools.permutations(records):
        placed: list[tuple[TensorUsageRecord, int]] = []
        top = 0
        for rec in perm:
            blockers = sorted(
                (o, o + r.size) for r, o in placed if r.intersects(rec) and r.size and rec.size
            )
            offset = 0
            for lo, hi in blockers:
                if offset + rec.size <= lo:
                    break
                offset = max(offset, hi)
            placed.append((rec, offset))
            top = max(top, offset + rec.size)
        best = top if best is None else min(best, top)
    return best or 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(adversarial_records(), st.sampled_from(["objects", "offsets"]))
@example([], "objects")
@example([TensorUsageRecord(0, 0, 0, MAX_BYTES)], "offsets")
@example([TensorUsageRecord(0, 3, 3, 0), TensorUsageRecord(1, 3, 3, 0)], "objects")
@example([TensorUsageRecord(i, 0, 9, HUGE) for i in range(6)], "offsets")
@example([TensorUsageRecord(i, 0, 9, HUGE - i) for i in range(6)], "objects")
@example(
    [TensorUsageRecord(i, t, t + 1, s) for i, (t, s) in enumerate([(0, HUGE), (1, 9), (2, HUGE)])],
    "offsets",
)
def test_every_strategy_is_legal_and_never_below_the_optimum(records, approach) -> None:
    bound = lower_bound(records, approach)
    exact = optimum(records, approach)
    assert bound <= exact <= naive_total(records)
    heuristics = {}
    for name in strategy_names(approach):
        options = {"time_limit": 2} if name == "cpsat" else {}
        result = plan(records, approach, name, **options)
        validate_plan(records, result)
        assert result.total >= exact >= bound, name
        if name in strategy_names(approach, heuristic_only=True):
            assert result.total <= naive_total(records), name
            heuristics[name] = result.total
        if result.status == "optimal":
            assert result.total == exact and result.lower_bound == exact, name
        if result.lower_bound is not None:
            assert bound <= result.lower_bound <= exact, name
        if name == "best":  # its portfolio also tries each heuristic on reordered records
            assert result.total <= min(heuristics.values(), default=0), heuristics
        if name == "cpsat" and max((r.size for r in records), default=0) < 2**40:
            assert result.status == "optimal", result.note
