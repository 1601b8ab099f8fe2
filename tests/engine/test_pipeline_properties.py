"""Property test of the pipeline scheduler: random unit sizes and stage durations.

For every policy the trace must show reads in order, each kernel after its read, and at
every instant the bytes of units between read start and kernel end within the buffer —
whether units are read one by one or coalesced into larger reads. With a copy stage
(three stages) copies run in order between their read and their kernel, a unit holds
the read buffer from read start to copy end and the device buffer from copy start to
kernel end, and each stays within its size (Algorithm 1's constraints).
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
from layerfit.engine.device import Device
from layerfit.store import ModelSpec, example_input, prepare


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    widths=st.lists(st.integers(4, 120), min_size=3, max_size=7),
    delays=st.lists(st.sampled_from([0.0, 0.001, 0.003]), min_size=6, max_size=6),
    read_delay=st.sampled_from([0.0, 0.002]),
    slack=st.integers(0, 3),
    pipeline=st.sampled_from(["sequential", "sync", "async"]),
    coalesce=st.sampled_from([0, 8192, "4MiB"]),
    stages=st.sampled_from([2, 3]),
    copy_delay=st.sampled_from([0.0, 0.002]),
)
def test_pipeline_constraints(
    tmp_path_factory, monkeypatch, widths, delays, read_delay, slack, pipeline, coalesce, stages, copy_delay
):
    d = delays[: len(widths) - 1]
    spec = ModelSpec("factory", "tinymodels:chain", {"widths": widths, "delays": d})
    out = tmp_path_factory.mktemp("chain") / "m"
    m = prepare(spec, out, input_shape=(2, widths[0]))
    largest = m.largest_unit_bytes
    budget = largest * 2 + slack * 4096 if pipeline != "sequential" else largest + slack * 4096
    budget *= stages - 1  # three stages: a read and a device buffer of that size each
    real = reader_mod.SegmentReader.read_range

    def slow(self, *a, **k):
        time.sleep(read_delay)
        return real(self, *a, **k)

    monkeypatch.setattr(reader_mod.SegmentReader, "read_range", slow)
    real_copy = Device.copy

    def slow_copy(self, *a, **k):
        time.sleep(copy_delay)
        return real_copy(self, *a, **k)

    monkeypatch.setattr(Device, "copy", slow_copy)
    x = example_input((2, widths[0]))
    with torch.no_grad():
        y = tinymodels.chain(widths, d).eval()(x)
    with load(out, pipeline=pipeline, budget=budget, trace=True, coalesce=coalesce, stages=stages) as engine:
        assert torch.equal(engine(x), y)
        tl = engine.last_timeline
        cap, device_cap = engine.memory.buffer_bytes, engine.memory.device_buffer_bytes
    assert engine.memory.weight_bytes <= budget
    n = len(m.units)
    reads = [e for e in tl.events if e.stage == "read"]
    copies = [e for e in tl.events if e.stage == "copy"]
    kernels = {e.unit: e for e in tl.events if e.stage == "kernel"}
    assert [e.unit for e in reads] == list(range(n))
    for a, b in zip(reads, reads[1:], strict=False):
        assert a.end <= b.start  # one reader, in order
    # where each unit's bytes become usable by its kernel, and until when the read buffer holds them
    if stages == 2:
        assert copies == []
        usable, read_held_until = {r.unit: r.end for r in reads}, {u: k.end for u, k in kernels.items()}
    else:
        assert [c.unit for c in copies] == list(range(n))
        for a, b in zip(copies, copies[1:], strict=False):
            assert a.end <= b.start  # one copy stage, in order
        for r, c in zip(reads, copies, strict=True):
            assert c.start >= r.end  # a copy never starts before its read
        usable, read_held_until = {c.unit: c.end for c in copies}, {c.unit: c.end for c in copies}
        on_device = {c.unit: (c.start, kernels[c.unit].end, c.nbytes) for c in copies}
        for t in sorted({c.start for c in copies}):
            assert sum(nb for s, e, nb in on_device.values() if s <= t < e) <= device_cap
    for u, k in kernels.items():
        assert k.start >= usable[u]  # a kernel never runs before its bytes are there
    # bytes held in the read buffer from read start never exceed it
    for t in sorted({e.start for e in reads}):
        held = sum(r.nbytes for r in reads if r.start <= t < read_held_until[r.unit])
        assert held <= cap
    assert max(b for _, b in tl.occupancy) <= cap + device_cap
    if pipeline == "sequential":  # nothing of unit i+1 moves before kernel i is done
        for e in reads[1:] + copies[1:]:
            assert e.start >= kernels[e.unit - 1].end
    if pipeline == "sync":  # lock-step: unit i is read while kernel i-(stages-1) runs
        for r in reads[stages - 1 :]:
            assert r.start >= kernels[r.unit - (stages - 1)].start
        for c in copies[1:]:
            assert c.start >= kernels[c.unit - 1].start


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


@pytest.mark.parametrize(
    "text,weights,expected",
    [("50%", 1000, 500), ("12.5%", 1000, 125), (" 33 % ", 300, 99), ("100%", 7, 7), ("24MB", 5, 24_000_000)],
)
def test_a_budget_may_be_a_share_of_the_weights(text, weights, expected):
    from layerfit.sizes import parse_budget

    assert parse_budget(text, weights) == expected


@given(percent=st.integers(0, 100), hundredths=st.integers(0, 99), weights=st.integers(0, 2**44))
def test_a_share_is_exact_and_rounds_down(percent, hundredths, weights):
    from layerfit.errors import BudgetError
    from layerfit.sizes import parse_budget

    if percent * 100 + hundredths > 10000:  # more than every weight: refused (100 % is preload)
        with pytest.raises(BudgetError, match="up to 100%"):
            parse_budget(f"{percent}.{hundredths:02d}%", weights)
        return
    # No floating point: 12.34 % of any size is the same whole byte as in integers.
    assert parse_budget(f"{percent}.{hundredths:02d}%", weights) == (percent * 100 + hundredths) * weights // 10000


@pytest.mark.parametrize("text", ["%", "50%%", "-5%", "half", "5 0%", "1e2%"])
def test_budget_share_nonsense(text):
    from layerfit.errors import BudgetError
    from layerfit.sizes import parse_budget

    with pytest.raises(BudgetError, match="e.g. 50%"):
        parse_budget(text, 1000)


def test_a_share_where_no_single_model_is_meant_says_so():
    from layerfit.errors import BudgetError
    from layerfit.sizes import parse_bytes

    with pytest.raises(BudgetError, match="50% is a share of a model's weights, which only one model's"):
        parse_bytes("50%")
