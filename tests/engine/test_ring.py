"""Circular weight buffer: live units never overlap, the ledger never exceeds capacity."""

from __future__ import annotations

import gc
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from layerfit.engine.ring import RingBuffer
from layerfit.errors import BudgetError

PAGE = 4096


@settings(max_examples=200, deadline=None)
@given(
    capacity_pages=st.integers(2, 40),
    ops=st.lists(st.tuples(st.booleans(), st.integers(1, 12)), min_size=1, max_size=80),
)
def test_live_allocations_never_overlap_and_stay_within_capacity(capacity_pages, ops):
    ring = RingBuffer(capacity_pages * PAGE)
    live: deque[tuple[int, int]] = deque()
    try:
        for allocate, pages in ops:
            nbytes = min(pages, capacity_pages) * PAGE
            if allocate and ring._fits(nbytes) is not None:
                start = ring.allocate(nbytes)
                assert start % PAGE == 0 and start + nbytes <= ring.capacity
                for a, b in live:
                    assert start + nbytes <= a or b <= start, "overlapping live units"
                live.append((start, start + nbytes))
            elif live:
                start, _ = live.popleft()
                ring.release(start)
            assert sum(b - a for a, b in live) <= ring.in_use <= ring.capacity
            assert ring.peak <= ring.capacity
        if not live:
            assert ring.in_use == 0
    finally:
        ring.close()


@settings(max_examples=200, deadline=None)
@given(
    capacity_pages=st.integers(2, 40),
    ops=st.lists(st.tuples(st.sampled_from(["allocate", "release", "front"]), st.integers(1, 12)),
                 min_size=1, max_size=80),
)
def test_giving_back_the_oldest_units_first_pages_makes_room_and_nothing_overlaps(capacity_pages, ops):
    """A unit whose kernel has used its first pages gives them back (``release_front_locked``)
    and is released later from where it then begins: the room it gave back is placed again,
    and no two live units overlap."""
    ring = RingBuffer(capacity_pages * PAGE)
    live: deque[tuple[int, int]] = deque()
    try:
        for op, pages in ops:
            nbytes = min(pages, capacity_pages) * PAGE
            if op == "allocate" and ring._fits(nbytes) is not None:
                start = ring.allocate(nbytes)
                for a, b in live:
                    assert start + nbytes <= a or b <= start, "overlapping live units"
                live.append((start, start + nbytes))
            elif op == "front" and live and live[0][1] - live[0][0] > pages * PAGE:
                start, end = live[0]
                with ring.condition:
                    assert ring.oldest_starts_at(start)
                    ring.release_front_locked(start, start + pages * PAGE)
                    assert ring.holds_only(start + pages * PAGE) == (len(live) == 1)
                live[0] = (start + pages * PAGE, end)
            elif op == "release" and live:
                start, _ = live.popleft()
                ring.release(start)
            assert sum(b - a for a, b in live) <= ring.in_use <= ring.capacity
        if not live:
            assert ring.in_use == 0
    finally:
        ring.close()


def test_a_front_given_back_must_lie_inside_the_oldest_unit():
    ring = RingBuffer(4 * PAGE)
    a = ring.allocate(2 * PAGE)
    ring.allocate(PAGE)
    with ring.condition:
        for start, front in ((a + PAGE, a + 2 * PAGE), (a, a + 2 * PAGE), (a, a)):
            with pytest.raises(RuntimeError, match="not inside the oldest"):
                ring.release_front_locked(start, front)
        ring.release_front_locked(a, a + PAGE)
    assert ring.allocate(PAGE) == 3 * PAGE and ring.in_use == 3 * PAGE
    ring.close()


def test_a_unit_waits_until_the_oldest_is_released():
    import threading

    ring = RingBuffer(3 * PAGE)
    first = ring.allocate(2 * PAGE)
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(ring.allocate(2 * PAGE)))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive() and not got  # no room: it waits on the condition
    ring.release(first)
    waiter.join(5)
    assert got == [0]
    ring.close()


def test_oversized_unit_and_out_of_order_release_are_errors():
    ring = RingBuffer(2 * PAGE)
    with pytest.raises(BudgetError):
        ring.allocate(3 * PAGE)
    a = ring.allocate(PAGE)
    ring.allocate(PAGE)
    with pytest.raises(RuntimeError, match="out of order"):
        ring.release(a + PAGE)
    ring.close()


def test_reshape_reuses_the_mapping_and_releases_pages():
    ring = RingBuffer(64 * PAGE)
    ring.bytes[:] = 1
    assert ring.reshape(16 * PAGE)
    assert ring.capacity == 16 * PAGE
    assert int(ring.bytes[16 * PAGE :: PAGE].sum()) == 0  # pages beyond were given back
    with pytest.raises(BudgetError):
        ring.allocate(17 * PAGE)
    assert ring.reshape(64 * PAGE)
    assert ring.allocate(64 * PAGE) == 0
    assert not ring.reshape(65 * PAGE)  # beyond the mapping: the caller maps anew
    ring.close()


def test_closing_leaves_bytes_a_view_still_points_to_mapped():
    # A tensor that escaped the engine must never point into unmapped memory (a crash):
    # the mapping then goes with the last view.
    ring = RingBuffer(4096)
    view = ring.bytes[:8]
    view.fill_(7)
    ring.close()
    gc.collect()
    assert view.tolist() == [7] * 8
