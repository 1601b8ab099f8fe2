"""Streaming engine: every pipeline and budget gives exactly model(x); faults are clean."""

from __future__ import annotations

import errno
import gc
import json
import os
import re
import threading
import time
from pathlib import Path

import pytest
import tinymodels
import torch
from engine_helpers import read_spy
from hypothesis import given, settings
from hypothesis import strategies as st

import layerfit.store.reader as reader_mod
from layerfit.cli import main
from layerfit.engine import load
from layerfit.engine.units import make_blocks
from layerfit.errors import BudgetError, CorruptStoreError, LayerfitError, ReadError
from layerfit.sizes import format_bytes_exact
from layerfit.store import example_input, prepare, read_manifest
from layerfit.store.manifest import Segment

PIPELINES = ["preload", "sequential", "sync", "async"]


@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_every_pipeline_is_bit_identical(tiny: Path, reference, pipeline: str, stages: int):
    x, y = reference
    with load(tiny, pipeline=pipeline, stages=stages) as engine:
        for _ in range(2):
            assert torch.equal(engine(x), y)
        assert engine.last_weights_peak <= engine.memory.weight_bytes
        assert (engine.memory.device_buffer_bytes > 0) == (stages == 3)


def test_three_stage_budget_is_split_between_read_and_device_buffer(tiny: Path, reference):
    x, y = reference
    largest = read_manifest(tiny).largest_unit_bytes  # 20480
    with load(tiny, pipeline="async", stages=3, budget=2 * largest) as engine:
        assert engine.memory.buffer_bytes == engine.memory.device_buffer_bytes == largest
        assert torch.equal(engine(x), y)
        assert engine.last_weights_peak <= 2 * largest
        engine.reconfigure(budget=4 * largest)  # both buffers grow; nothing is reloaded
        assert engine.memory.buffer_bytes == engine.memory.device_buffer_bytes == 2 * largest
        assert torch.equal(engine(x), y)
    with pytest.raises(BudgetError, match=re.escape(f"minimum for this model: {format_bytes_exact(2 * largest)}")):
        load(tiny, pipeline="async", stages=3, budget=2 * largest - 1)
    with pytest.raises(BudgetError, match=f"three-stage sync .* minimum budget is {re.escape(format_bytes_exact(4 * largest))}"):
        load(tiny, pipeline="sync", stages=3, budget=3 * largest)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"device": "tpu"}, "unknown device 'tpu'"),
        ({"device": "cpu:1"}, "unknown device"),
        ({"stages": 4}, "stages must be 2"),
        ({"stages": 3, "pipeline": "external"}, "unit source"),
    ],
)
def test_bad_device_or_stages_is_refused(tiny: Path, kwargs: dict, message: str):
    with pytest.raises(LayerfitError, match=message):
        load(tiny, **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where CUDA is absent")
def test_cuda_without_cuda_says_so(tiny: Path):
    with pytest.raises(LayerfitError, match="sees no CUDA device"):
        load(tiny, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_cuda_three_stage_pipeline_matches_the_model_on_cuda(tiny: Path, reference, pipeline: str):
    x, _ = reference
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    with torch.no_grad():
        y = tinymodels.tiny_cnn().eval().cuda()(x.cuda())
    with load(tiny, pipeline=pipeline, device="cuda", trace=True) as engine:
        assert engine.device.stages == 3
        for _ in range(2):
            out = engine(x.cuda())
            assert out.is_cuda and torch.equal(out, y)
        if pipeline != "preload":
            assert {e.stage for e in engine.last_timeline.events} == {"read", "copy", "kernel"}


def test_copy_error_mid_inference_names_unit_and_engine_recovers(tiny: Path, reference, monkeypatch):
    from layerfit.engine.device import Device

    real = Device.copy
    calls = {"n": 0, "armed": True}

    def flaky(self, dst, src):
        calls["n"] += 1
        if calls["armed"] and calls["n"] == 3:  # the third unit copied
            raise RuntimeError("copy engine fault")
        return real(self, dst, src)

    monkeypatch.setattr(Device, "copy", flaky)
    with load(tiny, pipeline="async", stages=3) as engine:
        fails_cleanly_then_recovers(
            engine, reference, LayerfitError, r"copying unit 2 \(.*\) to cpu failed: copy engine fault",
            disarm=lambda: calls.update(armed=False),
        )


def fails_cleanly_then_recovers(engine, reference, error: type, match: str, disarm) -> None:
    """The call raises ``error`` (message matching ``match``) and leaves no engine thread
    running; once ``disarm()`` removes the fault, the next call gives the reference."""
    x, y = reference
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(error, match=match):
        engine(x)
    assert not {"layerfit-reader", "layerfit-copier"} & ({t.name for t in threading.enumerate()} - before)
    disarm()
    assert torch.equal(engine(x), y)


def test_nonsense_coalesce_size_is_refused(tiny: Path):
    with pytest.raises(BudgetError, match="lots"):
        load(tiny, pipeline="async", coalesce="lots")


@pytest.mark.parametrize(("coalesce", "budget"), [(0, None), ("1MiB", None), ("1MiB", "1MiB"), (8192, "1MiB")])
def test_coalesced_reads_cover_every_unit_once_in_fewer_requests(tiny: Path, reference, monkeypatch, coalesce, budget):
    x, y = reference
    units = read_manifest(tiny).units
    reads, spy = read_spy()
    with load(tiny, pipeline="async", coalesce=coalesce, budget=budget, read_ahead=False) as engine:  # a pass's own reads
        engine(x)  # first inference verifies checksums; count the second
        # A slow first kernel lets the reader run ahead: the unit the next kernel needs
        # (unit 1) is read alone and at once, the units after it may be coalesced.
        engine.model.conv1.register_forward_pre_hook(lambda module, args: time.sleep(0.05))
        monkeypatch.setattr(reader_mod.os, "preadv", spy)
        assert torch.equal(engine(x), y)
        cap = min(engine.config.coalesce_bytes, engine.memory.buffer_bytes // 2)
    # the requests tile the units' bytes exactly, in order
    assert [off for off, _ in reads][0] == units[0].offset
    assert sum(n for _, n in reads) == sum(u.nbytes for u in units)
    for (a, n), (b, _) in zip(reads, reads[1:], strict=False):
        assert a + n == b
    largest = max(u.nbytes for u in units)
    assert all(n <= max(cap, largest) for _, n in reads)
    assert reads[0] == (units[0].offset, units[0].nbytes)  # the first kernel waits for it alone
    if cap >= units[2].nbytes + units[3].nbytes:  # read ahead of kernel 0: units 2, 3 in one request
        assert len(reads) < len(units)
    if coalesce == 0:
        assert len(reads) == len(units)


class _SlowWaker(threading.Condition):
    """A condition whose waiter, once notified, takes a while to run again: the
    executing thread of a loaded machine, not yet scheduled after its unit arrived."""

    def wait(self, timeout=None):
        woken = super().wait(timeout)
        self.release()
        time.sleep(0.02)
        self.acquire()
        return woken


def test_reader_coalesces_while_the_woken_kernel_thread_is_not_yet_running(tiny: Path, reference, monkeypatch):
    x, y = reference
    units = read_manifest(tiny).units
    reads, spy = read_spy()
    with load(tiny, pipeline="async", coalesce="1MiB", budget="1MiB", read_ahead=False) as engine:  # a pass's own reads
        engine(x)  # first inference verifies checksums; count the second
        engine.stream.ready = _SlowWaker(engine.stream.state)
        monkeypatch.setattr(reader_mod.os, "preadv", spy)
        assert torch.equal(engine(x), y)
        cap = min(engine.config.coalesce_bytes, engine.memory.buffer_bytes // 2)
    # The kernel waited for unit 0 only: the units after it are read in requests as
    # large as the cap allows, not one by one as if the kernel still waited for each.
    assert sum(n for _, n in reads) == sum(u.nbytes for u in units)
    assert reads[0] == (units[0].offset, units[0].nbytes)
    first_unit = {u.offset: u for u in units}
    for (_, n), (b, _) in zip(reads[1:], reads[2:], strict=False):
        assert n + first_unit[b].nbytes > cap  # the next unit could not have joined
    assert len(reads) < len(units)


@pytest.mark.parametrize("budget", [20480, 24576, 32768, 45056, 10**6])
@pytest.mark.parametrize("units", ["layers", "blocks:2", "blocks:3", "merge:16kB", "merge:40kB"])
def test_async_budgets_and_blocks(tiny: Path, reference, budget: int, units: str):
    x, y = reference
    blocks = make_blocks(read_manifest(tiny).units, units)
    if budget < max(b.nbytes for b in blocks):
        with pytest.raises(BudgetError, match="minimum"):
            load(tiny, pipeline="async", budget=budget, units=units)
        return
    with load(tiny, pipeline="async", budget=budget, units=units, trace=True) as engine:
        assert torch.equal(engine(x), y)
        assert engine.last_weights_peak <= budget
        assert max(b for _, b in engine.last_timeline.occupancy) <= budget


def test_equal_blocks_cover_every_layer_once(tiny: Path):
    units = read_manifest(tiny).units
    for n in range(1, len(units) + 3):
        blocks = make_blocks(units, f"blocks:{n}")
        assert [s for b in blocks for s in b.segments] == list(units)
        assert len(blocks) == min(n, len(units))
    with pytest.raises(LayerfitError, match="blocks:N"):
        make_blocks(units, "chunks")


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 64), min_size=1, max_size=40),
    limit=st.integers(1, 200),
)
def test_merged_blocks_are_the_fewest_within_the_size_cap(sizes: list[int], limit: int):
    units = [
        Segment(i, f"l{i}", "Linear", offset=4096 * sum(sizes[:i]), nbytes=4096 * n, payload_bytes=4096 * n,
                sha256="", tensors=())
        for i, n in enumerate(sizes)
    ]
    blocks = make_blocks(units, f"merge:{4096 * limit}")
    assert [s for b in blocks for s in b.segments] == units  # every layer once, in order
    for block in blocks:  # within the cap, unless one layer alone is larger
        assert block.nbytes <= 4096 * limit or len(block.segments) == 1
    for a, b in zip(blocks, blocks[1:], strict=False):  # greedy: the next layer did not fit
        assert a.nbytes + b.segments[0].nbytes > 4096 * limit
    assert make_blocks(units, "merge:1B") == make_blocks(units, "layers")


@pytest.mark.parametrize("spec", ["merge:", "merge:0", "merge:abc", "merge:-1MB"])
def test_a_bad_merge_size_is_refused(tiny: Path, spec: str):
    with pytest.raises(LayerfitError, match="granularity"):
        make_blocks(read_manifest(tiny).units, spec)


def test_the_runtimes_merge_auto_is_refused_with_a_size_to_use_instead(tiny: Path, capsys):
    assert main(["run", str(tiny), "--units", "merge:auto"]) == 2
    err = capsys.readouterr().err
    assert "'merge:auto' is the runtime's (serve, schedule run)" in err and "e.g. merge:4MB" in err


def test_budget_below_largest_unit_states_the_minimum(tiny: Path, capsys):
    with pytest.raises(BudgetError, match=r"below the minimum for this model: 20\.5 kB \(20480 bytes\)"):
        load(tiny, budget="10kB")
    assert main(["run", str(tiny), "--pipeline", "async", "--budget", "10kB"]) == 2
    assert "20480" in capsys.readouterr().err
    assert main(["run", str(tiny), "--pipeline", "async", "--budget", "ten megs"]) == 2
    assert "cannot read 'ten megs' as a size" in capsys.readouterr().err


def test_tied_weights_resident_and_streamed_rest(tmp_path: Path):
    out = tmp_path / "lm"
    prepare("tinymodels:tied_lm", out, input_shape=(1, 8), input_dtype="int64")
    ids = example_input((1, 8), "int64")
    with torch.no_grad():
        y = tinymodels.tied_lm().eval()(ids)
    for pipeline in PIPELINES:
        with load(out, pipeline=pipeline) as engine:
            assert torch.equal(engine(ids), y)
            assert engine.memory.resident_bytes > 0


def test_read_error_mid_inference_names_unit_and_engine_recovers(tiny: Path, reference, monkeypatch):
    unit = read_manifest(tiny).units[3]
    real = os.preadv
    fail = {"armed": True}

    def flaky(fd, buffers, offset, *rest):
        # A bad sector inside unit 3: every read that covers it fails in this inference.
        length = sum(len(b) for b in buffers)
        if fail["armed"] and offset <= unit.offset < offset + length:
            failed_lengths.append(length)
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, buffers, offset, *rest)

    # Coalesced (the whole model fits the buffer): units 1-3 are read with one request,
    # which fails; reading them one by one then names the unit that cannot be read. A
    # slow first kernel lets the reader run ahead, so unit 3 is not the one the kernel
    # waits for (that one is read alone) even on a loaded machine.
    for coalesce, budget, stages in (("1MiB", "1MiB", 2), (0, None, 2), (0, None, 3)):
        fail["armed"], failed_lengths = True, []
        with load(tiny, pipeline="async", coalesce=coalesce, budget=budget, stages=stages) as engine:
            engine.model.conv1.register_forward_pre_hook(lambda module, args: time.sleep(0.05))
            monkeypatch.setattr(reader_mod.os, "preadv", flaky)
            fails_cleanly_then_recovers(
                engine, reference, ReadError, r"unit 3 \(bn2\)", disarm=lambda: fail.update(armed=False)
            )
            monkeypatch.setattr(reader_mod.os, "preadv", real)
        assert (max(failed_lengths) > unit.nbytes) == bool(coalesce)


def test_weights_file_changed_under_running_engine(tiny: Path, reference, tmp_path: Path):
    x, y = reference
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(tiny, copy)
    with load(copy, pipeline="async") as engine:
        assert torch.equal(engine(x), y)
        time.sleep(0.01)
        path = copy / "weights.safetensors"
        data = path.read_bytes()
        path.write_bytes(data)  # same bytes, new mtime: still a change we must notice
        with pytest.raises(CorruptStoreError, match="changed on disk"):
            engine(x)


def test_buffered_fallback_is_reported(tiny: Path, reference):
    x, y = reference
    with load(tiny, pipeline="async", direct_io=False) as engine:
        assert engine.io_mode == "buffered"
        assert torch.equal(engine(x), y)


def test_run_cli_json_and_trace_and_plot(tiny: Path, tmp_path: Path, capsys):
    trace = tmp_path / "t.json"
    assert main(["run", str(tiny), "--pipeline", "async", "--budget", "32KiB", "--trace", str(trace), "--json", "--repeats", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    for key in ("latency_s", "weights_peak_bytes", "rss_peak_bytes", "output_shape", "output_sha256", "io_mode"):
        assert key in report
    assert report["weights_peak_bytes"] <= 32 * 1024
    chrome = json.loads(trace.read_text())
    stages = {e.get("cat") for e in chrome["traceEvents"] if e["ph"] == "X"}
    assert stages == {"read", "kernel"}
    assert main(["run", str(tiny), "--pipeline", "preload", "--json"]) == 0
    pre = json.loads(capsys.readouterr().out)
    assert pre["output_sha256"] == report["output_sha256"]
    png = tmp_path / "g.png"
    assert main(["plot-trace", str(trace), "-o", str(png)]) == 0
    assert png.stat().st_size > 1000


def test_run_cli_threads_sets_how_many_threads_each_kernel_uses(tmp_path: Path, capsys):
    """blazeface's convolutions differ in the last bits between one and two threads, so
    the output shows which count the kernels ran with."""
    from layerfit import zoo
    from layerfit.engine import output_digest

    shape = (1, 3, 128, 128)
    prepare("blazeface", tmp_path / "bf", input_shape=shape)
    model, x, before = zoo.build("blazeface").eval(), example_input(shape), torch.get_num_threads()
    try:
        digests = {}
        for threads in (1, 2):
            torch.set_num_threads(threads)
            with torch.no_grad():
                digests[threads] = output_digest(model(x))
        for threads in (1, 2):
            args = ["run", str(tmp_path / "bf"), "--pipeline", "async", "--budget", "1MB", "--repeats", "1"]
            assert main([*args, "--threads", str(threads), "--json"]) == 0
            report = json.loads(capsys.readouterr().out)
            assert report["compute_threads"] == threads
            assert report["output_sha256"] == digests[threads]  # model(x) with the same count, bit for bit
    finally:
        torch.set_num_threads(before)
    assert main(["run", str(tmp_path / "bf"), "--threads", "0"]) == 2


def test_run_cli_three_stages_reports_both_buffers_and_copies(tiny: Path, tmp_path: Path, capsys):
    trace = tmp_path / "t3.json"
    args = ["run", str(tiny), "--pipeline", "async", "--stages", "3", "--budget", "80KiB", "--trace", str(trace)]
    assert main([*args, "--json", "--repeats", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["device"], report["stages"]) == ("cpu", 3)
    assert report["device_buffer_bytes"] == 40 * 1024  # the budget is split evenly
    assert report["weight_buffer_bytes"] == 80 * 1024 >= report["weights_peak_bytes"]
    assert report["copy_s"] > 0
    chrome = json.loads(trace.read_text())
    assert {e.get("cat") for e in chrome["traceEvents"] if e["ph"] == "X"} == {"read", "copy", "kernel"}
    assert main(["run", str(tiny), "--pipeline", "preload", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["output_sha256"] == report["output_sha256"]
    assert main(["run", str(tiny), "--pipeline", "sync", "--stages", "3", "--budget", "60kB"]) == 2
    assert "minimum budget is 81.9 kB (81920 bytes)" in capsys.readouterr().err


def test_run_cli_input_and_output_files(tiny: Path, tmp_path: Path, reference, capsys):
    import numpy as np

    x, y = reference
    np.save(tmp_path / "x.npy", x.numpy())
    assert main(["run", str(tiny), "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")]) == 0
    assert np.array_equal(np.load(tmp_path / "y.npy"), y.numpy())
    np.save(tmp_path / "bad.npy", np.zeros((1, 3, 5, 5), np.float32))
    assert main(["run", str(tiny), "--input", str(tmp_path / "bad.npy")]) == 2
    assert "prepare it again with --input-shape 1,3,5,5" in capsys.readouterr().err
    np.save(tmp_path / "ints.npy", np.zeros((1, 3, 16, 16), np.int64))  # a shape is no remedy here
    assert main(["run", str(tiny), "--input", str(tmp_path / "ints.npy")]) == 2
    assert "expects float32 (1, 3, 16, 16)" in (err := capsys.readouterr().err) and "prepare" not in err


def test_reconfigure_between_inferences_respects_each_budget(tiny: Path, reference):
    x, y = reference
    with load(tiny, pipeline="async", budget=40960, trace=True) as engine:
        assert torch.equal(engine(x), y)
        assert engine.last_weights_peak <= 40960
        seconds = engine.reconfigure(budget=20480)
        assert seconds < 5
        assert torch.equal(engine(x), y)
        assert max(b for _, b in engine.last_timeline.occupancy) <= 20480
        with pytest.raises(BudgetError):
            engine.reconfigure(budget=4096)
        assert engine.memory.buffer_bytes == 20480  # the old configuration keeps running
        assert torch.equal(engine(x), y)
        engine.reconfigure(units="blocks:2", budget=10**6)
        assert len(engine.blocks) == 2
        assert torch.equal(engine(x), y)


def test_weights_used_outside_their_module_give_the_models_output(tmp_path: Path):
    out = tmp_path / "outside"
    prepare("tinymodels:outside_reads", out, input_shape=(2, 8))
    x = example_input((2, 8), "float32")
    with torch.no_grad():
        expected = tinymodels.outside_reads().eval()(x)
    for pipeline in PIPELINES:
        engine = load(out, pipeline=pipeline)
        got = engine(x)
        engine.close()
        del engine
        gc.collect()
        # Outputs that are views of weights outlive the engine: still the model's bytes.
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True)), pipeline


@pytest.mark.parametrize(
    ("model", "error"),
    [("outside_reads", "read a weight outside the module"), ("weight_view", "view of a streamed weight")],
)
def test_weights_streamed_by_an_older_prepare_are_refused_not_returned(tmp_path: Path, monkeypatch, model, error):
    # Prepared without the resident rule for such weights (as older versions did), the
    # model would give meta tensors or reused bytes: the engine says why instead.
    import layerfit.capture.units as units_mod

    monkeypatch.setattr(units_mod.UnitRecorder, "_note_escapes", lambda self, output: None)
    monkeypatch.setattr(units_mod, "_METADATA_OPS", _EVERY_OP)
    out = tmp_path / model
    prepare(f"tinymodels:{model}", out, input_shape=(2, 8))
    assert read_manifest(out).resident is None  # streamed, as before the rule
    x = example_input((2, 8), "float32")
    for pipeline in PIPELINES:
        with load(out, pipeline=pipeline) as engine, pytest.raises(LayerfitError, match=error):
            engine(x)


class _EveryOp(frozenset):
    """Pretends every op reads only metadata: the recorder then sees no outside read."""

    def __contains__(self, item: object) -> bool:
        return True


_EVERY_OP = _EveryOp()
