"""Pipeline ``auto``: every weight resident when the budget holds them, else async with the
room beyond async's buffer spent keeping units resident; always exactly model(x)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import tinymodels
import torch
from engine_helpers import read_spy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import layerfit.store.reader as reader_mod
from layerfit.cli import main
from layerfit.engine import load
from layerfit.engine.policies import (
    REQUEST_BYTES,
    STREAMED_PER_BUFFER_BYTE,
    choose_kept_units,
    least_room_to_keep,
    spread_streamed,
)
from layerfit.engine.unit_reader import UnitReader
from layerfit.errors import BudgetError, LayerfitError, ReadError
from layerfit.sizes import format_bytes_exact
from layerfit.store import ModelSpec, example_input, prepare, read_manifest

SHAPE = (1, 3, 16, 16)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("auto") / "tiny"
    prepare("tinymodels:tiny_cnn", out, input_shape=SHAPE)
    return out  # units of 4096, 4096, 12288, 4096, 20480 and 4096 bytes


@pytest.fixture(scope="module")
def reference(tiny: Path):
    x = example_input(SHAPE)
    with torch.no_grad():
        return x, tinymodels.tiny_cnn().eval()(x)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 256).map(lambda k: 4096 * k), min_size=1, max_size=40),
    room_fraction=st.floats(0.0, 1.0),
)
def test_kept_units_leave_async_its_buffer_and_something_to_stream(sizes: list[int], room_fraction: float):
    room = int(room_fraction * sum(sizes))
    kept = choose_kept_units(sizes, room)
    streamed = [n for i, n in enumerate(sizes) if i not in kept]
    assert kept <= set(range(len(sizes)))
    assert streamed, "keeping every unit is preload's case"
    if kept:  # what is kept, plus a buffer that holds two of the largest unit streamed
        assert sum(sizes[i] for i in kept) + 2 * max(streamed) <= room
        # and is not too small for what streams through it
        assert (room - sum(sizes[i] for i in kept)) * STREAMED_PER_BUFFER_BYTE >= sum(streamed)
    # Keeping the smallest units beside a buffer of two of the largest is one of the
    # candidates: the choice saves at least as much as it would.
    left, floor_kept = room - 2 * max(sizes), []
    for n in sorted(sizes)[:-1]:
        kept_after = sum(floor_kept) + n
        if n > left or (room - kept_after) * STREAMED_PER_BUFFER_BYTE < sum(sizes) - kept_after:
            break
        floor_kept.append(n)
        left -= n
    saved = sum(sizes[i] + REQUEST_BYTES for i in kept)
    assert saved >= sum(n + REQUEST_BYTES for n in floor_kept)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 256).map(lambda k: 4096 * k), min_size=1, max_size=40),
    room_fraction=st.floats(0.0, 1.0),
    buffers=st.sampled_from([1, 2]),
)
def test_the_least_room_to_keep_is_where_keeping_starts(sizes: list[int], room_fraction: float, buffers: int):
    least = least_room_to_keep(sizes, buffers)
    room = int(room_fraction * (sum(sizes) + 2 * max(sizes) * buffers))
    kept = choose_kept_units(sizes, room, buffers=buffers)
    assert bool(kept) == (least is not None and room >= least)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 256).map(lambda k: 4096 * k), min_size=1, max_size=40),
    room_fraction=st.floats(0.0, 1.0),
    runs=st.lists(st.integers(1, 32), min_size=40, max_size=40),
)
def test_units_weighed_by_their_runs_keep_the_room_rules_and_equal_weights_change_nothing(
    sizes: list[int], room_fraction: float, runs: list[int]
):
    room = int(room_fraction * sum(sizes))
    runs = runs[: len(sizes)]
    assert choose_kept_units(sizes, room, runs=[1] * len(sizes)) == choose_kept_units(sizes, room)
    assert choose_kept_units(sizes, room, runs=[7] * len(sizes)) == choose_kept_units(sizes, room)
    weighed = choose_kept_units(sizes, room, runs=runs)
    streamed = [n for i, n in enumerate(sizes) if i not in weighed]
    assert streamed
    if weighed:  # the same room rules: a buffer of two of the largest streamed, large enough
        assert sum(sizes[i] for i in weighed) + 2 * max(streamed) <= room
        assert (room - sum(sizes[i] for i in weighed)) * STREAMED_PER_BUFFER_BYTE >= sum(streamed)


def test_units_that_run_more_often_are_kept_first():
    mib = 1 << 20
    sizes = [mib] * 12  # an encoder of 6 and a decoder of 6 units of one size
    runs = [1] * 6 + [16] * 6
    assert choose_kept_units(sizes, 6 * mib) == {1, 4, 7, 10}  # spread out, when they run alike
    assert choose_kept_units(sizes, 6 * mib, runs=runs) == {6, 7, 9, 10}  # 8 and 11 stream
    # room for all six: the buffer's unit streams from the encoder, not the decoder
    assert choose_kept_units(sizes, 8 * mib, runs=runs) == set(range(6, 12))


@settings(max_examples=300, deadline=None)
@given(kinds=st.lists(st.integers(0, 3), min_size=1, max_size=60), data=st.data())
def test_streamed_units_of_a_kind_are_as_many_and_evenly_spread(kinds: list[int], data):
    kept = set(data.draw(st.sets(st.integers(0, len(kinds) - 1))))
    spread = spread_streamed(kept, kinds)
    for kind in set(kinds):
        units = [i for i, k in enumerate(kinds) if k == kind]
        streamed = [j for j, i in enumerate(units) if i not in spread]  # places among the kind
        assert len(streamed) == sum(1 for i in units if i not in kept)  # as many of each kind
        if streamed:
            assert streamed[-1] == len(units) - 1  # the kind's last streams
            # evenly spaced: the gaps between them differ by one at most
            gaps = [b - a for a, b in zip([-1, *streamed], streamed, strict=False)]
            assert max(gaps) - min(gaps) <= 1


def test_streamed_units_spread_through_the_pass():
    mib = 1 << 20
    # 18 projections of one size (a 6-layer decoder's MLPs), 7 streamed: one in every
    # two or three, not the last seven (whose reads would all queue at the pass's end).
    kept = choose_kept_units([mib] * 18, 13 * mib)
    streamed = sorted(set(range(18)) - kept)
    assert len(streamed) == 7
    assert streamed == [1, 4, 6, 9, 11, 14, 17]


def test_kept_units_shrink_the_buffer_first_then_save_the_most_requests():
    mib, small = 1 << 20, 64 * 1024
    # Many small layers and one large classifier (a MobileNet's shape): kept, the
    # classifier leaves a buffer of two small layers, so every layer but one is kept.
    assert choose_kept_units([small] * 20 + [5 * mib], 11 * mib) == set(range(21)) - {19}
    # One unit far larger than the rest (a VGG's fc6): keeping it shrinks the buffer the
    # rest need from two of it to two of the next, so the room keeps it first.
    vgg = [2 * mib] * 8 + [40 * mib]
    assert choose_kept_units(vgg, 48 * mib) == {2, 6, 8}  # the two kept of 2 MiB spread out
    assert choose_kept_units(vgg, 80 * mib) == set(range(9)) - {7}  # one unit of 2 MiB streams
    assert choose_kept_units(vgg, 40 * mib) == set()  # two of 40 MiB do not fit, nor 40 + two of 2
    # Units of one size leave the buffer nothing to gain: the small ones go first, each
    # a request saved, then as many large ones as fit.
    assert choose_kept_units([mib] * 10 + [small] * 10, 4 * mib) == {8, *range(10, 20)}


def test_auto_keeps_every_weight_when_the_budget_holds_them_and_streams_below(tiny: Path, reference, monkeypatch):
    x, y = reference
    m = read_manifest(tiny)
    sizes = [u.nbytes for u in m.units]
    for budget, chosen, kept in [
        (None, "preload", ()), (m.total_bytes, "preload", ()), (10**6, "preload", ()),
        # of the four units of 4096 bytes the third is kept, the other three stream
        (m.total_bytes - 4096, "async", (2, 3, 4)), (32768, "async", ()),
    ]:
        # (read_ahead off: the reads counted are this pass's own)
        with load(tiny, pipeline="auto", budget=budget, read_ahead=False) as engine:
            assert (engine.pipeline, engine.policy.name, engine.kept_units) == ("auto", chosen, kept)
            assert engine.memory.weight_bytes <= (budget or m.total_bytes)
            engine(x)  # streamed units are read again on each call, kept ones were read at load
            reads, spy = read_spy()
            monkeypatch.setattr(reader_mod.os, "preadv", spy)
            assert torch.equal(engine(x), y)
            monkeypatch.undo()
            assert engine.last_weights_peak <= (budget or m.total_bytes)
            streamed = sum(n for i, n in enumerate(sizes) if i not in kept) if chosen == "async" else 0
            assert sum(n for _, n in reads) == streamed
            assert {off for off, _ in reads}.isdisjoint(m.units[i].offset for i in kept)


@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    widths=st.lists(st.integers(4, 120), min_size=3, max_size=7),
    fraction=st.floats(0.0, 0.99),
    read_delay=st.sampled_from([0.0, 0.002]),
    coalesce=st.sampled_from([0, "4MiB"]),
    stages=st.sampled_from([2, 3]),
)
def test_auto_streams_the_rest_in_order_within_the_budget(
    tmp_path_factory, monkeypatch, widths, fraction, read_delay, coalesce, stages
):
    spec = ModelSpec("factory", "tinymodels:chain", {"widths": widths, "delays": [0.0] * (len(widths) - 1)})
    out = tmp_path_factory.mktemp("chain") / "m"
    m = prepare(spec, out, input_shape=(2, widths[0]))
    minimum = (stages - 1) * m.largest_unit_bytes  # a read buffer, and a device buffer with three stages
    budget = max(minimum, minimum + int(fraction * (m.total_bytes - minimum)))
    real = reader_mod.SegmentReader.read_range

    def slow(self, *a, **k):
        time.sleep(read_delay)
        return real(self, *a, **k)

    monkeypatch.setattr(reader_mod.SegmentReader, "read_range", slow)
    x = example_input((2, widths[0]))
    with torch.no_grad():
        y = tinymodels.chain(widths, [0.0] * (len(widths) - 1)).eval()(x)
    with load(out, pipeline="auto", budget=budget, trace=True, coalesce=coalesce, stages=stages) as engine:
        for _ in range(2):
            assert torch.equal(engine(x), y)
        tl, kept, policy = engine.last_timeline, set(engine.kept_units), engine.policy.name
        cap, device_cap = engine.memory.buffer_bytes, engine.memory.device_buffer_bytes
        assert engine.memory.weight_bytes <= budget and engine.last_weights_peak <= budget
    assert policy == ("preload" if budget >= m.total_bytes else "async")
    streamed = [] if policy == "preload" else [i for i in range(len(m.units)) if i not in kept]
    reads = [e for e in tl.events if e.stage == "read"]
    copies = [e for e in tl.events if e.stage == "copy"]
    kernels = {e.unit: e for e in tl.events if e.stage == "kernel"}
    assert [e.unit for e in reads] == streamed
    assert [e.unit for e in copies] == (streamed if stages == 3 else [])
    assert sorted(kernels) == list(range(len(m.units)))
    # a streamed kernel never runs before its bytes are there; each buffer holds its units
    usable = {c.unit: c.end for c in copies} if stages == 3 else {r.unit: r.end for r in reads}
    read_until = usable if stages == 3 else {u: kernels[u].end for u in streamed}
    for u in streamed:
        assert kernels[u].start >= usable[u]
    for t in sorted({e.start for e in reads}):
        assert sum(r.nbytes for r in reads if r.start <= t < read_until[r.unit]) <= cap
    for t in sorted({c.start for c in copies}):
        assert sum(c.nbytes for c in copies if c.start <= t < kernels[c.unit].end) <= device_cap


def test_only_streamed_units_wait_for_their_kernels(tmp_path: Path, monkeypatch):
    """A streamed unit's buffer is reused only once its kernels finished (on CUDA the host
    waits for them); a kept unit gives nothing back, so its end waits for nothing. The
    pass waits once more at its end (its latency counts the kernels)."""
    from layerfit.engine.device import Device

    widths = [100, 100, 8, 8, 8, 8, 8]
    prepare(ModelSpec("factory", "tinymodels:chain", {"widths": widths, "delays": [0.0] * 6}),
            tmp_path / "m", input_shape=(2, 100))
    waits = []
    monkeypatch.setattr(Device, "finish_kernels", lambda self: waits.append(1))
    with load(tmp_path / "m", pipeline="auto", budget=57344, stages=3) as engine:
        assert engine.kept_units == (0,)
        engine(example_input((2, 100)))
        assert len(waits) == (len(engine.blocks) - 1) + 1


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"))],
)
def test_three_stages_keep_units_in_the_device_buffer(tmp_path: Path, monkeypatch, device: str):
    widths = [100, 100, 8, 8, 8, 8, 8]  # units of 40960 bytes, then five of 4096
    spec = ModelSpec("factory", "tinymodels:chain", {"widths": widths, "delays": [0.0] * 6})
    m = prepare(spec, tmp_path / "m", input_shape=(2, 100))
    x = example_input((2, 100)).to(device)
    with torch.no_grad():
        y = tinymodels.chain(widths, [0.0] * 6).eval().to(device)(x)
    # the large unit kept (40960), and a read and a device buffer of two of 4096 each
    with load(tmp_path / "m", pipeline="auto", budget=57344, stages=3, device=device, trace=True) as engine:
        assert engine.kept_units == (0,)
        assert (engine.memory.kept_bytes, engine.memory.buffer_bytes, engine.memory.device_buffer_bytes) == (
            40960, 8192, 8192
        )
        engine(x)
        reads, spy = read_spy()
        monkeypatch.setattr(reader_mod.os, "preadv", spy)
        assert torch.equal(engine(x), y)
        assert sum(n for _, n in reads) == m.total_bytes - 40960  # the kept unit is not read again
        assert [e.unit for e in engine.last_timeline.events if e.stage == "copy"] == [1, 2, 3, 4, 5]
        assert engine.last_weights_peak <= 57344
    # async needs a read and a device buffer of the large unit each: more than that budget
    with pytest.raises(BudgetError, match=r"below the minimum for this model: 81\.9 kB \(81920 bytes\)"):
        load(tmp_path / "m", pipeline="async", budget=57344, stages=3)
    # below auto's own minimum, the error names it
    with pytest.raises(BudgetError, match=r"below the minimum for this model: 57\.3 kB \(57344 bytes\), for pipeline auto"):
        load(tmp_path / "m", pipeline="auto", budget=53248, stages=3)


def test_auto_chooses_again_for_each_new_budget(tiny: Path, reference):
    x, y = reference
    total = read_manifest(tiny).total_bytes
    with load(tiny, pipeline="auto", budget=20480) as engine:
        assert engine.policy.name == "async"
        engine.reconfigure(budget=total)
        assert engine.policy.name == "preload" and torch.equal(engine(x), y)
        engine.reconfigure(budget=total - 4096)
        assert (engine.policy.name, engine.kept_units) == ("async", (2, 3, 4)) and torch.equal(engine(x), y)
        engine.reconfigure(budget=total // 2)
        assert (engine.policy.name, engine.kept_units) == ("async", ()) and torch.equal(engine(x), y)
        with pytest.raises(BudgetError):
            engine.reconfigure(budget=4096)
        with pytest.raises(LayerfitError, match="unknown pipeline 'fast': choose one of auto, preload"):
            engine.reconfigure(pipeline="fast", budget=total)
        # refused: what ran before keeps running
        assert (engine.pipeline, engine.policy.name, engine.memory.buffer_bytes) == ("auto", "async", total // 2)
        engine.reconfigure(pipeline="sync", budget=total)  # asked for by name: no choice made
        assert (engine.pipeline, engine.policy.name, engine.kept_units) == ("sync", "sync", ())
        assert torch.equal(engine(x), y)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.sampled_from([None, "auto", "async", "preload"]), st.integers(0, 13)), min_size=1, max_size=6))
def test_any_sequence_of_reconfigurations_runs_the_model_exactly(tiny: Path, reference, steps):
    x, y = reference
    total = read_manifest(tiny).total_bytes  # 49152
    current = 20480
    with load(tiny, pipeline="auto", budget=current) as engine:
        for pipeline, pages in steps:
            budget = 20480 + 4096 * pages  # from the minimum to past every weight
            try:
                engine.reconfigure(pipeline=pipeline, budget=budget)
                current = budget
            except BudgetError:  # only preload has a minimum above 20480: every weight
                assert (pipeline or engine.pipeline) == "preload" and budget < total
            assert engine.memory.weight_bytes <= current
            if engine.pipeline == "auto":
                assert engine.policy.name == ("preload" if current >= total else "async")
            assert torch.equal(engine(x), y)
            assert engine.last_weights_peak <= current
            if engine.policy.name != "preload":  # streamed units are unbound between passes
                held = dict(engine.model.named_parameters(remove_duplicate=False))
                streamed = [
                    place
                    for i, block in enumerate(engine.blocks)
                    if i not in engine.kept_units
                    for seg in block.segments
                    for t in seg.tensors
                    for place in t.places
                ]
                assert all(held[p].device.type == "meta" for p in streamed if p in held), "left bound"


def test_a_failed_read_of_the_kept_units_leaves_an_engine_that_says_so(tiny: Path, reference, monkeypatch):
    x, y = reference
    total = read_manifest(tiny).total_bytes
    with load(tiny, pipeline="auto", budget=total // 2) as engine:
        assert torch.equal(engine(x), y)
        real = UnitReader.read_unit  # every read of a unit goes through the engine's UnitReader

        def failing(self, i, into):
            raise ReadError(f"reading unit {i} failed: [Errno 5] Input/output error")

        monkeypatch.setattr(UnitReader, "read_unit", failing)
        with pytest.raises(ReadError, match="Input/output error"):
            engine.reconfigure(budget=total - 4096)  # keeps units 0, 2 and 4: reads them now
        monkeypatch.setattr(UnitReader, "read_unit", real)
        with pytest.raises(LayerfitError, match="cannot run: reading its weights for the new configuration failed"):
            engine(x)
        assert engine.memory.weight_bytes <= total
        engine.reconfigure(budget=total - 4096)
        assert engine.kept_units == (2, 3, 4) and torch.equal(engine(x), y)


def test_preload_below_every_weight_says_what_it_needs_and_what_streaming_needs(tiny: Path):
    m = read_manifest(tiny)
    for budget in (4096, m.largest_unit_bytes, m.total_bytes - 1):
        with pytest.raises(
            BudgetError,
            match=re.escape(
                f"preload keeps every weight resident and needs {format_bytes_exact(m.total_bytes)}; the budget is "
                f"{format_bytes_exact(budget)}: raise it, or stream the weights with pipeline 'auto' or 'async', "
                f"from {format_bytes_exact(m.largest_unit_bytes)}"
            ),
        ):
            load(tiny, pipeline="preload", budget=budget)


def test_run_cli_streams_a_budget_below_the_weights_and_keeps_them_above(tiny: Path, capsys):
    total = read_manifest(tiny).total_bytes
    reports = {}
    for budget in (None, total // 2, total - 4096, total):
        args = ["run", str(tiny), "--json", "--repeats", "1"] + ([] if budget is None else ["--budget", str(budget)])
        assert main(args) == 0
        reports[budget] = json.loads(capsys.readouterr().out)
        assert reports[budget]["pipeline_requested"] == "auto"
    assert [(r["pipeline"], r["kept_units"]) for r in reports.values()] == [
        ("preload", 0), ("async", 0), ("async", 3), ("preload", 0)
    ]
    assert reports[total - 4096]["kept_bytes"] == 4096 + 12288 + 20480
    assert reports[total // 2]["weights_peak_bytes"] <= total // 2
    assert len({r["output_sha256"] for r in reports.values()}) == 1
    assert main(["run", str(tiny), "--budget", str(total - 4096), "--repeats", "1"]) == 0
    assert "[async, chosen by auto, 6 units (3 kept resident, 36.9 kB)," in capsys.readouterr().out
    assert main(["run", str(tiny), "--pipeline", "async", "--budget", str(total), "--repeats", "1"]) == 0
    assert "[async, 6 units, 2 stages" in capsys.readouterr().out  # asked for by name: streamed as asked
    assert main(["run", str(tiny), "--pipeline", "preload", "--budget", str(total // 2)]) == 2
    assert "stream the weights with pipeline 'auto' or 'async'" in capsys.readouterr().err


@pytest.mark.parametrize("stages", [2, 3])
def test_inspect_budget_shows_the_plan_the_engine_makes(tiny: Path, capsys, stages: int):
    m = read_manifest(tiny)
    for budget in (m.total_bytes - 4096, m.total_bytes):
        assert main(["inspect", str(tiny), "--budget", str(budget), "--stages", str(stages), "--json"]) == 0
        plan = json.loads(capsys.readouterr().out)["auto_plan"]
        with load(tiny, pipeline="auto", budget=budget, stages=stages) as engine:
            assert plan["policy"] == engine.policy.name
            assert plan["kept_units"] == list(engine.kept_units)
            assert (plan["kept_bytes"], plan["buffer_bytes"], plan["device_buffer_bytes"]) == (
                engine.memory.kept_bytes, engine.memory.buffer_bytes, engine.memory.device_buffer_bytes
            )
        read = [] if plan["policy"] == "preload" else [u for u in m.units if u.index not in plan["kept_units"]]
        assert plan["bytes_read_per_inference"] == sum(u.nbytes for u in read)
    assert main(["inspect", str(tiny), "--budget", str(m.total_bytes - 4096)]) == 0
    out = " ".join(capsys.readouterr().out.split())  # as one line, whatever the terminal's width
    assert "(2 stages) pipeline auto runs async: 3 of 6 units kept resident (36.9 kB)" in out
    assert "each inference reads 3 units, 12.3 kB" in out
    assert main(["inspect", str(tiny), "--budget", str(m.total_bytes)]) == 0
    assert "runs preload: every weight resident (49.2 kB), read once at load" in " ".join(capsys.readouterr().out.split())
    assert main(["inspect", str(tiny), "--budget", "10kB"]) == 2
    assert "below the minimum for this model: 20.5 kB (20480 bytes)" in capsys.readouterr().err
    assert main(["inspect", str(tiny), "--budget", "1MB", "--stages", "4"]) == 2
    assert "stages must be 2 (zero-copy) or 3" in capsys.readouterr().err



def test_a_share_of_the_weights_is_a_budget(tiny: Path, reference, capsys):
    x, y = reference
    total = read_manifest(tiny).total_bytes  # 49152: 50 % is 24576, 90 % is 44236
    with load(tiny, pipeline="auto", budget="50%") as by_share, load(tiny, pipeline="auto", budget=total // 2) as by_bytes:
        assert (by_share.policy.name, by_share.kept_units, by_share.memory.buffer_bytes) == (
            by_bytes.policy.name, by_bytes.kept_units, by_bytes.memory.buffer_bytes
        )
        assert by_share.memory.buffer_bytes == 24576 and torch.equal(by_share(x), y)
        by_share.reconfigure(budget="100%")
        assert by_share.policy.name == "preload" and torch.equal(by_share(x), y)
        with pytest.raises(BudgetError, match=r"below the minimum .* \(10% of its 49\.2 kB of weights\)"):
            by_share.reconfigure(budget="10%")
        assert by_share.policy.name == "preload"  # refused: the old configuration runs on
    assert main(["run", str(tiny), "--budget", "90%", "--json", "--repeats", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["weights_peak_bytes"] <= total * 90 // 100 and report["output_sha256"]
    assert main(["inspect", str(tiny), "--budget", "90%", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["auto_plan"]["budget_bytes"] == total * 90 // 100
    assert main(["run", str(tiny), "--budget", "half"]) == 2
    assert "or a share of the model's weights, e.g. 50%" in capsys.readouterr().err
