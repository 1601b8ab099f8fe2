"""An untied embedding table is read by the rows its ids look up, and still gives the
model's output bit for bit (see :mod:`layerfit.engine.gather`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import tinymodels
import torch
from engine_helpers import read_spy
from hypothesis import given, settings
from hypothesis import strategies as st

from layerfit.engine import load
from layerfit.engine.weight_plan import plan_weights
from layerfit.errors import BudgetError, CorruptStoreError
from layerfit.store import prepare
from layerfit.store.manifest import ALIGN
from layerfit.store.model_spec import ModelSpec

VOCAB = 5000


def _prepare(root: Path, name: str, **kwargs) -> tuple[Path, object, torch.nn.Module]:
    directory = root / name
    manifest = prepare(
        ModelSpec("factory", "tinymodels:token_table", kwargs), directory, input_shape=(1, 8), input_dtype="int64"
    )
    return directory, manifest, tinymodels.token_table(**kwargs)


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory):
    return _prepare(tmp_path_factory.mktemp("gather"), "table")


def _others(manifest) -> int:
    """The largest unit that is not the table (unit 0), or the room one row of it takes
    (its page and the pages it is read from: 400-byte rows, 3 pages)."""
    return max(*(u.nbytes for u in manifest.units[1:]), 3 * ALIGN)


IDS = {
    "one id": torch.tensor([[7]]),
    "first, last, padding and repeats": torch.tensor([[0, VOCAB - 1, 3, 3, 17, 0]]),
    "a batch of rows across pages": torch.arange(2, 3100, 97).view(2, -1),
    "int32": torch.tensor([[5, 10, 11, 4095]], dtype=torch.int32),
}


@pytest.mark.parametrize("ids", IDS.values(), ids=IDS.keys())
@pytest.mark.parametrize("pipeline", ["sequential", "sync", "async", "auto"])
def test_the_rows_give_the_models_output_within_the_budget(table, pipeline: str, ids: torch.Tensor):
    directory, manifest, model = table
    budget = manifest.resident_bytes + 2 * _others(manifest) + (_others(manifest) if pipeline == "auto" else 0)
    with load(directory, pipeline=pipeline, budget=budget) as engine:
        assert engine.memory.minimum_budget == manifest.resident_bytes + _others(manifest)  # not the table's
        for _ in range(2):  # the first pass scans the table to verify it, the second reads rows
            got = engine(ids)
            assert engine.last_weights_peak <= budget
            assert torch.equal(got, model(ids))
        assert engine.model.embed.padding_idx == 3  # restored after the pass


def test_a_verified_table_is_read_by_a_page_or_two_per_id(table, monkeypatch: pytest.MonkeyPatch):
    directory, manifest, model = table
    start, size = manifest.units[0].offset, manifest.units[0].nbytes
    with load(directory, pipeline="async") as engine:
        reads, spy = read_spy()
        monkeypatch.setattr("os.preadv", spy)
        engine(torch.tensor([[42]]))  # first use: the whole table, to check its SHA-256
        first = sum(n for off, n in reads if start <= off < start + size)
        assert first == size
        reads.clear()
        ids = torch.tensor([[42, 1000, 1001, 4321]])
        assert torch.equal(engine(ids), model(ids))
        table_reads = [(off, n) for off, n in reads if start <= off < start + size]
        assert len(table_reads) == 3  # 1000 and 1001 are neighbours: one request
        assert sum(n for _, n in table_reads) <= 3 * 2 * ALIGN
    # (read_ahead off: it would read the table again for a next pass that never comes)
    with load(directory, pipeline="async", gather_rows=False, read_ahead=False) as engine:
        reads.clear()
        assert torch.equal(engine(ids), model(ids))
        assert sum(n for off, n in reads if start <= off < start + size) == size  # streamed whole


def test_many_distinct_ids_scan_the_table_instead_of_reading_rows(table, monkeypatch: pytest.MonkeyPatch):
    directory, manifest, model = table
    start, size = manifest.units[0].offset, manifest.units[0].nbytes
    ids = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(1))[:4000].view(2, 2000)
    with load(directory, pipeline="async", budget=manifest.total_bytes) as engine:
        engine(torch.tensor([[1]]))  # verified
        reads, spy = read_spy()
        monkeypatch.setattr("os.preadv", spy)
        assert torch.equal(engine(ids), model(ids))
        table_reads = [n for off, n in reads if start <= off < start + size]
        # 3200 runs of rows would be 3200 requests: a few large ones read it all instead,
        # in what the buffer has beside the 1.6 MB of rows
        assert sum(table_reads) == size and len(table_reads) <= 10
        assert engine.last_weights_peak <= manifest.total_bytes


def test_rows_that_do_not_fit_the_buffer_are_refused_and_the_engine_runs_on(table):
    directory, manifest, model = table
    budget = manifest.resident_bytes + 2 * _others(manifest)
    with load(directory, pipeline="async", budget=budget) as engine:
        with pytest.raises(BudgetError, match=r"looks up 3000 distinct rows of embedding embed .* raise the budget"):
            engine(torch.arange(3000).view(1, -1))
        ids = torch.tensor([[9, 8]])
        assert torch.equal(engine(ids), model(ids))
        assert engine.model.embed.padding_idx == 3


def test_bad_ids_fail_as_on_the_model_and_change_nothing(table):
    directory, _, model = table
    with load(directory, pipeline="async") as engine:
        for bad in (torch.tensor([[VOCAB]]), torch.tensor([[-1]]), torch.tensor([[1.0]])):
            with pytest.raises((IndexError, RuntimeError)) as on_model:
                model(bad)
            with pytest.raises(type(on_model.value), match=str(on_model.value)[:30]):
                engine(bad)
        ids = torch.tensor([[1, 2, 3]])
        assert torch.equal(engine(ids), model(ids))
        assert engine.model.embed.padding_idx == 3


def test_a_corrupt_table_is_found_on_first_use_every_time(table, tmp_path: Path):
    directory, manifest, _ = table
    copy = tmp_path / "corrupt"
    shutil.copytree(directory, copy)
    weights = copy / manifest.weights_file
    data = bytearray(weights.read_bytes())
    data[manifest.units[0].offset + 12345] ^= 0xFF
    weights.write_bytes(bytes(data))
    with load(copy, pipeline="async") as engine:
        for _ in range(2):
            with pytest.raises(CorruptStoreError, match="checksum mismatch in unit 0 \\(embed\\)"):
                engine(torch.tensor([[7]]))


def test_an_embedding_called_by_keyword_is_read_by_rows(tmp_path: Path):
    directory, _, model = _prepare(tmp_path, "keyword", by_keyword=True)
    with load(directory, pipeline="async") as engine:
        assert engine.rows_units == (0,)
        ids = torch.tensor([[4, 4000, 4]])
        assert torch.equal(engine(ids), model(ids))


def test_tables_that_must_be_read_whole_are_streamed_as_before(tmp_path: Path):
    directory, _, model = _prepare(tmp_path, "max_norm", max_norm=1.0)  # max_norm rewrites rows
    with load(directory, pipeline="async") as engine:
        assert not engine.rows_units
        ids = torch.tensor([[4, 9]])
        assert torch.equal(engine(ids), model(ids))
    gpt2 = tmp_path / "gpt2"  # its token table is tied to the head: resident
    manifest = prepare("tinymodels:tiny_gpt2", gpt2, input_shape=(1, 8), input_dtype="int64")
    with load(gpt2, pipeline="async") as engine:
        assert not engine.rows_units  # and its position table is a page: read whole
        assert any("wte" in p for t in manifest.resident.tensors for p in t.places)


def test_a_unit_source_supplies_the_table_whole(table):
    directory, _, model = table

    class WholeUnits:
        def __init__(self, engine) -> None:
            self.engine, self.held = engine, {}

        def acquire(self, i: int) -> tuple[torch.Tensor, int]:
            self.held[i] = self.engine.read_unit_buffer(i)
            return torch.frombuffer(self.held[i], dtype=torch.uint8), 0

        def release(self, i: int) -> None:
            self.held.pop(i)

    with load(directory, pipeline="async") as engine:
        ids = torch.tensor([[3, 2, 1]])
        assert torch.equal(engine.run_from(WholeUnits(engine), ids), model(ids))


def test_the_plan_neither_keeps_nor_buffers_a_gathered_table():
    sizes = [1_000_000, 40_000, 20_000]
    rows = {0: 12_288}  # the least room one row of the table takes in the buffer
    plan = plan_weights("async", sizes, 0, None, 2, rows)
    assert plan.gathered == {0} and plan.buffer_bytes == 72_288  # the other units and a row's room
    plan = plan_weights("async", sizes, 0, 100_000, 2, rows)  # what the budget leaves may hold rows
    assert plan.gathered == {0} and plan.buffer_bytes == 100_000 // 4096 * 4096
    with pytest.raises(BudgetError, match=r"the largest unit \(40\.0 kB\)"):
        plan_weights("sequential", sizes, 0, 30_000, 2, rows)
    assert plan_weights("sequential", [1_000_000, 4096], 0, None, 2, rows).buffer_bytes == 12_288
    auto = plan_weights("auto", sizes, 0, 1_000_000, 2, rows)
    assert 0 not in auto.kept and auto.gathered == {0} and auto.buffer_bytes >= 12_288
    assert plan_weights("auto", sizes, 0, None, 2, rows).gathered == frozenset()  # preload
    assert plan_weights("async", [1_000_000], 0, None, 2, rows).gathered == frozenset()  # nothing else


@pytest.fixture(scope="module")
def streamed_table(table):
    directory, manifest, model = table
    with load(directory, pipeline="async", budget=manifest.resident_bytes + 8 * _others(manifest)) as engine:
        yield engine, model


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12), min_size=1, max_size=3).filter(
        lambda rows: len({len(r) for r in rows}) == 1
    )
)
def test_any_ids_give_the_models_output(streamed_table, rows: list[list[int]]):
    engine, model = streamed_table
    ids = torch.tensor(rows)
    assert torch.equal(engine(ids), model(ids))


def test_inspect_plans_the_table_by_rows_as_the_engine_does(table):
    from typer.testing import CliRunner

    from layerfit.cli import app

    directory, manifest, _ = table
    budget = manifest.resident_bytes + 3 * _others(manifest)
    out = CliRunner().invoke(app, ["inspect", str(directory), "--budget", str(budget), "--json"])
    assert out.exit_code == 0, out.output
    info = json.loads(out.output)
    assert info["rows_units"] == [0] and info["auto_plan"]["rows_units"] == [0]
    with load(directory, pipeline="auto", budget=budget) as engine:
        assert info["minimum_budget_bytes"] == engine.memory.minimum_budget
        assert info["auto_plan"]["kept_units"] == list(engine.kept_units)
        assert info["auto_plan"]["buffer_bytes"] == engine.memory.buffer_bytes
    assert info["auto_plan"]["bytes_read_per_inference"] < manifest.units[0].nbytes  # the table is not read


@pytest.mark.parametrize("ids", IDS.values(), ids=IDS.keys())
@pytest.mark.parametrize("pipeline", ["sequential", "sync", "async", "auto"])
def test_three_stages_look_the_rows_up_on_the_host(table, pipeline: str, ids: torch.Tensor):
    """With a copy stage (CUDA's pipeline, here on the host) the table is read by rows
    too, looked up where they were read; nothing of it is copied to the device buffer,
    and a budget that could not hold two copies of the table runs."""
    directory, manifest, model = table
    table_bytes = manifest.units[0].nbytes
    budget = manifest.resident_bytes + 4 * _others(manifest) + (_others(manifest) if pipeline == "auto" else 0)
    assert budget < manifest.resident_bytes + 2 * table_bytes  # read and device buffers of the table: refused
    with load(directory, pipeline=pipeline, budget=budget, stages=3, trace=True) as engine:
        assert engine.rows_units == (0,)
        for _ in range(2):  # the first pass scans the table to verify it, the second reads rows
            got = engine(ids)
            assert engine.last_weights_peak <= budget
            assert torch.equal(got, model(ids))
            assert 0 not in {e.unit for e in engine.last_timeline.events if e.stage == "copy"}
        assert engine.model.embed.padding_idx == 3  # restored after the pass


@settings(max_examples=25, deadline=None)
@given(
    pipeline=st.sampled_from(["sequential", "sync", "async", "auto"]),
    slack=st.integers(0, 600_000),
    ids=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=400),
)
def test_the_budget_holds_whatever_the_ids_and_budget(table, pipeline: str, slack: int, ids: list[int]):
    directory, manifest, model = table
    copies = 1 if pipeline == "sequential" else 2
    budget = manifest.resident_bytes + copies * _others(manifest) + slack
    x = torch.tensor([ids])
    with load(directory, pipeline=pipeline, budget=budget) as engine:
        try:
            got = engine(x)
        except BudgetError as exc:  # only when the distinct rows cannot fit the buffer
            assert "distinct rows of embedding embed" in str(exc)
            assert len(set(ids)) * 400 + ALIGN > engine.memory.buffer_bytes
        else:
            assert torch.equal(got, model(x))
            assert engine.last_weights_peak <= budget
        small = torch.tensor([[ids[0]]])
        assert torch.equal(engine(small), model(small))  # and it runs on
        assert engine.last_weights_peak <= budget


def test_run_reads_the_table_by_rows_unless_told_to_stream_it_whole(table):
    from typer.testing import CliRunner

    from layerfit.cli import app

    directory = str(table[0])
    reports = {}
    for flag in ("--rows", "--tables-whole"):
        out = CliRunner().invoke(app, ["run", directory, "--pipeline", "async", "--repeats", "1", flag, "--json"])
        assert out.exit_code == 0, out.output
        reports[flag] = json.loads(out.output)
    assert reports["--rows"]["rows_units"] == 1 and reports["--tables-whole"]["rows_units"] == 0
    assert reports["--rows"]["output_sha256"] == reports["--tables-whole"]["output_sha256"]
    assert reports["--rows"]["weights_peak_bytes"] < reports["--tables-whole"]["weights_peak_bytes"]


def test_reconfiguring_turns_rows_off_for_preload_and_on_again(table):
    directory, manifest, model = table
    ids = torch.tensor([[11, 4999]])
    with load(directory, pipeline="async") as engine:
        assert engine.rows_units == (0,)
        engine.reconfigure(pipeline="preload")
        assert engine.rows_units == () and torch.equal(engine(ids), model(ids))
        engine.reconfigure(pipeline="auto", budget=manifest.resident_bytes + 3 * _others(manifest))
        assert engine.rows_units == (0,) and torch.equal(engine(ids), model(ids))
        assert engine.model.embed.weight.device.type == "meta"  # nothing left bound between passes
