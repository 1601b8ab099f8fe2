"""Property test of the pipeline scheduler: random unit sizes and stage durations.

For every policy the trace must show reads in order, each kernel after its read, and at
every instant the bytes of units between read start and kernel end within the buffer —
whether units are read one by one or coalesced into larger reads.
"""

from __future__ import annotations

import time

import pytest
import tinymodels  # noqa: I001
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import layerfit.store.reader as reader_mod
from layerfit.engine import load
from layerfit.store import ModelSpec, example_input, prepare


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    widths=st.lists(st.integers(4, 120), min_size=3, max_size=7),
    delays=st.lists(st.sampled_from([0.0, 0.001, 0.003]), min_size=6, max_size=6),
    read_delay=st.sampled_from([0.0, 0.002]),
    slack=st.integers(0, 3),
    pipeline=st.sampled_from(["sequential", "sync", "async"]),
    coalesce=st.sampled_from([0, 8192, "4MiB"]),
)
def test_pipeline_constraints(
    tmp_path_factory, monkeypatch, widths, delays, read_delay, slack, pipeline, coalesce
):
    d = delays[: len(widths) - 1]
    spec = ModelSpec("factory", "tinymodels:chain", {"widths": widths, "delays": d})
    out = tmp_path_factory.mktemp("chain") / "m"
    m = prepare(spec, out, input_shape=(2, widths[0]))
    largest = m.largest_unit_bytes
    budget = largest * 2 + slack * 4096 if pipeline != "sequential" else largest + slack * 4096
    real = reader_mod.SegmentReader.read_range

    def slow(self, *a, **k):
        time.sleep(read_delay)
        return real(self, *a, **k)

    monkeypatch.setattr(reader_mod.SegmentReader, "read_range", slow)
    x = example_input((2, widths[0]))
    with torch.no_grad():
        y = tinymodels.chain(widths, d).eval()(x)
    with load(out, pipeline=pipeline, budget=budget, trace=True, coalesce=coalesce) as engine:
        assert torch.equal(engine(x), y)
        tl = engine.last_timeline
        cap = engine.memory.buffer_bytes
    reads = [e for e in tl.events if e.stage == "read"]
    kernels = {e.unit: e for e in tl.events if e.stage == "kernel"}
    assert [e.unit for e in reads] == list(range(len(m.units)))
    for a, b in zip(reads, reads[1:], strict=False):
        assert a.end <= b.start  # one reader, in order
    for r in reads:
        assert kernels[r.unit].start >= r.end  # a kernel never runs before its read
    # bytes held from read start to kernel end never exceed the buffer
    for t in sorted({e.start for e in reads}):
        held = sum(r.nbytes for r in reads if r.start <= t < kernels[r.unit].end)
        assert held <= cap
    assert max(b for _, b in tl.occupancy) <= cap
    if pipeline == "sequential":
        for r in reads[1:]:
            assert r.start >= kernels[r.unit - 1].end
    if pipeline == "sync":
        for r in reads[1:]:
            assert r.start >= kernels[r.unit - 1].start


@pytest.mark.parametrize("text,expected", [("24MB", 24_000_000), ("1.5GiB", 1.5 * 2**30), ("512KiB", 524288), ("4096", 4096), ("2 kB", 2000)])
def test_budget_strings(text, expected):
    from layerfit.sizes import parse_bytes

    assert parse_bytes(text) == int(expected)


@pytest.mark.parametrize("text", ["", "MB", "12 apples", "-5MB", "1.5", "1e6", "24 M B"])
def test_budget_nonsense(text):
    from layerfit.errors import BudgetError
    from layerfit.sizes import parse_bytes

    with pytest.raises(BudgetError):
        parse_bytes(text)
