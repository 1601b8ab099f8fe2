"""The read stage's batch: the room the reader waits for before it reads a unit."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from layerfit.engine.pass_state import PassState
from layerfit.engine.policies import POLICIES
from layerfit.engine.reader import ReadStage
from layerfit.engine.ring import RingBuffer

MB = 1 << 20


def stage(sizes: list[int], kept: set[int], gathered: set[int] = frozenset(), ring: RingBuffer | None = None) -> ReadStage:
    """A read stage over units of ``sizes`` bytes, async on two stages (only what its
    wake-up predicate looks at)."""
    blocks = [SimpleNamespace(nbytes=n) for n in sizes]
    reader = ReadStage(SimpleNamespace(
        blocks=blocks, kept=frozenset(kept), gathered=dict.fromkeys(gathered), ring=ring,
        policy=POLICIES["async"], device=SimpleNamespace(stages=2),
    ))
    reader.begin_pass(len(sizes), None)
    return reader


def test_a_unit_between_kept_units_waits_for_its_own_room_only():
    # A decoder's projections at 75 % of its weights: every third streamed, the ring
    # two units large plus a ragged end. Waiting for half the ring (a bigger read that
    # cannot be made) held the reader until the ring was empty, each pair of reads
    # apart by the kernels between them.
    sizes = [3 * MB] * 9
    reader = stage(sizes, kept={0, 1, 3, 4, 6, 7})
    run = PassState(len(sizes))
    chunk = (2 * 3 * MB + 246 * 1024) // 2
    assert [reader._batch(run, i, chunk) for i in (2, 5, 8)] == [3 * MB] * 3
    # Unit 2 read and running, unit 5 read and waiting for its kernel: unit 8 may be
    # read as soon as unit 2's kernel gives its room back, though the ring is not empty.
    ring = RingBuffer(2 * chunk)
    reader = stage(sizes, kept={0, 1, 3, 4, 6, 7}, ring=ring)
    run.started = run.done = 3
    reader.output.ready[2], reader.output.ready[5] = ring.allocate_locked(3 * MB), ring.allocate_locked(3 * MB)
    assert not reader.may_go(run, 8, reader._batch(run, 8, chunk))
    ring.release_locked(reader.output.ready[2])
    assert reader.may_go(run, 8, reader._batch(run, 8, chunk))
    assert not reader.may_go(run, 8, chunk)  # what it waited for before: room it never gets


def test_adjacent_streamed_units_batch_up_to_the_chunk():
    reader = stage([MB] * 8, kept={5})
    run = PassState(8)
    assert reader._batch(run, 0, 3 * MB) == 3 * MB  # three of five adjacent ones
    assert reader._batch(run, 3, 3 * MB) == 2 * MB  # the kept unit 5 ends the batch
    assert reader._batch(run, 6, 0) == MB  # no coalescing (not async): the unit alone


def test_a_batch_stops_at_rows_an_expected_skip_or_a_unit_read_ahead():
    reader = stage([MB] * 8, kept=set(), gathered={2})
    run = PassState(8)
    assert reader._batch(run, 0, 8 * MB) == 2 * MB
    run.expect_skipped = {5}
    assert reader._batch(run, 3, 8 * MB) == 2 * MB
    reader.output.ready[7] = 0
    assert reader._batch(run, 6, 8 * MB) == MB


@given(
    sizes=st.lists(st.integers(1, 64), min_size=1, max_size=24),
    kept=st.sets(st.integers(0, 23)),
    chunk=st.integers(0, 256),
    data=st.data(),
)
def test_a_batch_is_the_unit_and_the_streamed_ones_right_after_it_within_the_chunk(sizes, kept, chunk, data):
    kept = {k for k in kept if k < len(sizes)}
    i = data.draw(st.integers(0, len(sizes) - 1))
    kept.discard(i)
    reader = stage(sizes, kept)
    batch = reader._batch(PassState(len(sizes)), i, chunk)
    stop = next(k for k in range(i + 1, len(sizes) + 1) if sum(sizes[i:k]) == batch)  # it is a run from i
    assert all(k not in kept for k in range(i, stop))
    assert batch == sizes[i] or batch <= chunk  # the unit alone, or within the chunk
    nxt = stop  # the run stops where the next unit cannot join
    assert nxt == len(sizes) or nxt in kept or batch + sizes[nxt] > chunk
