"""The timeline's pieces (``layerfit.engine.trace``)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from layerfit.engine.trace import split_read


@given(
    t0=st.floats(0, 1e3),
    seconds=st.floats(1e-6, 10),
    sizes=st.lists(st.integers(1, 1 << 30), min_size=1, max_size=12),
)
def test_a_merged_read_is_split_by_bytes_end_to_end(t0: float, seconds: float, sizes: list[int]):
    t1 = t0 + seconds
    times = split_read(t0, t1, sizes)
    assert len(times) == len(sizes)
    assert times[0][0] == t0 and times[-1][1] == t1  # the whole read, no gap at either end
    for (_, end), (start, _) in zip(times, times[1:], strict=False):
        assert start == end  # each piece starts where the one before it ended
    for (start, end), size in zip(times, sizes, strict=True):  # each as long as its share of the bytes
        assert math.isclose(end - start, seconds * size / sum(sizes), rel_tol=1e-6, abs_tol=1e-9)
