"""Routed experts on demand: a mixture-of-experts layer reads only the experts its router
chose, and the outputs (one pass, generate's tokens) are transformers' own."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layerfit.engine import load
from layerfit.engine.experts import ExpertTable, experts_segment
from layerfit.store.manifest import ALIGN, Segment, TensorLayout

pytest.importorskip("transformers")


def _experts_reads(engine) -> list[tuple[str, int]]:
    return [(e.name, e.nbytes) for e in engine.last_timeline.events if e.stage == "read" and "experts" in e.name]


def test_a_decoded_token_reads_only_the_experts_its_router_chose(moe):
    directory, manifest, reference = moe
    experts = {u.name: u for u in manifest.units if experts_segment(u)}
    assert len(experts) == 3  # one per layer
    ids = torch.tensor([[3, 8, 13, 21, 34, 55]])
    budget = manifest.resident_bytes + 2 * manifest.largest_unit_bytes
    # (the reads of each layer's own hook: what is read ahead for it is counted in
    # tests/engine/test_expert_prefetch.py)
    with load(directory, budget=budget, trace=True, expert_prefetch=False) as engine:
        assert {engine.blocks[i].name for i in engine.rows_units} >= set(experts)
        with torch.no_grad():
            assert torch.equal(engine(ids).logits, reference(ids).logits)  # the first pass verifies: whole reads
            assert all(n == experts[name].nbytes for name, n in _experts_reads(engine))
            out = engine(ids[:, :1], use_cache=True)
            step = engine(ids[:, 1:2], past_key_values=out.past_key_values, use_cache=True)
            expected = reference(ids[:, :1], use_cache=True)
            expected = reference(ids[:, 1:2], past_key_values=expected.past_key_values, use_cache=True)
        assert torch.equal(step.logits, expected.logits)
        reads = _experts_reads(engine)
        assert len(reads) == 3
        for name, n in reads:  # one token: its 2 experts of 8, widened to pages
            unit = experts[name]
            per_expert = sum(t.nbytes for t in unit.tensors) // 8
            assert n <= 2 * per_expert + 2 * len(unit.tensors) * 2 * ALIGN
            assert n < unit.nbytes // 2
        generated = engine.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False)
        assert engine.last_weights_peak <= budget
    assert torch.equal(generated, reference.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False))


def test_preloaded_and_kept_experts_are_read_whole_once(moe):
    directory, manifest, reference = moe
    ids = torch.tensor([[5, 9, 2]])
    with torch.no_grad():
        expected = reference(ids).logits
        for budget in (None, manifest.total_bytes):
            with load(directory, budget=budget) as engine:
                assert not any("experts" in engine.blocks[i].name for i in engine.rows_units)
                assert torch.equal(engine(ids).logits, expected)


def test_verify_always_reads_every_pass_whole(moe):
    directory, manifest, reference = moe
    ids = torch.tensor([[7]])
    with load(directory, budget="50%", trace=True, verify="always") as engine, torch.no_grad():
        for _ in range(2):
            assert torch.equal(engine(ids).logits, reference(ids).logits)
            units = {u.name: u.nbytes for u in manifest.units}
            assert all(n == units[name] for name, n in _experts_reads(engine))


def _segment(count: int, shapes: list[tuple[int, ...]], itemsize: int = 4) -> Segment:
    tensors, offset = [], 0
    for k, shape in enumerate(shapes):
        nbytes = count * int(torch.tensor(shape).prod()) * itemsize
        tensors.append(TensorLayout(f"m.experts.w{k}", "param", "float32", (count, *shape), offset, nbytes,
                                    (f"m.experts.w{k}",)))
        offset = -(-(offset + nbytes) // 64) * 64
    nbytes = -(-offset // ALIGN) * ALIGN
    return Segment(3, "m.experts", "MoeExperts", 10 * ALIGN, nbytes, offset, "0" * 64, tuple(tensors))


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(2, 16),
    shapes=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=2, max_size=3),
    data=st.data(),
)
def test_the_reads_cover_each_chosen_expert_and_stay_inside_the_unit(count, shapes, data):
    segment = _segment(count, shapes)
    table = ExpertTable(segment, [])
    chosen = data.draw(st.lists(st.integers(0, count), min_size=1, max_size=12))  # count: no expert
    lookup = table.plan(torch.tensor(chosen), verify=False)
    start, end = segment.offset, segment.offset + segment.nbytes
    assert set(lookup.experts) == {e for e in chosen if e < count}
    for (_, b), (c, _) in zip(lookup.extents, lookup.extents[1:], strict=False):
        assert b < c  # sorted and disjoint
    for a, b in lookup.extents:
        assert a % ALIGN == 0 and start <= a < b <= end and (b % ALIGN == 0 or b == end)
    for t in segment.tensors:
        size = t.nbytes // count
        for e in lookup.experts:
            first = start + t.offset + e * size
            assert any(a <= first and first + size <= b for a, b in lookup.extents)
    pages = sum(-(-(t.nbytes // count) // ALIGN) + 1 for t in segment.tensors) * len(lookup.experts)
    assert lookup.bytes_read <= pages * ALIGN
    assert table.plan(torch.tensor(chosen), verify=True).extents == ((start, end),)


def test_a_module_of_experts_is_told_from_its_manifest(tmp_path: Path):
    segment = _segment(4, [(3, 5), (5, 3)])
    assert experts_segment(segment)
    plain = Segment(0, "m.fc", "Linear", 0, ALIGN, 60, "0" * 64, segment.tensors)
    assert not experts_segment(plain)
    ragged = Segment(3, "m.experts", "MoeExperts", 0, ALIGN, 60, "0" * 64, (
        segment.tensors[0], TensorLayout("m.experts.w1", "param", "float32", (3, 5, 3), 0, 180, ("m.experts.w1",))))
    assert not experts_segment(ragged)  # the experts' count differs between its tensors


def test_auto_keeps_whole_experts_units_with_what_the_budget_leaves(moe):
    directory, manifest, reference = moe
    experts = [u.index for u in manifest.units if experts_segment(u)]
    dense = manifest.total_bytes - sum(manifest.units[i].nbytes for i in experts)
    # Room for every dense unit kept, one experts unit kept and the others' reads.
    budget = dense + 2 * manifest.units[experts[0]].nbytes + 8 * ALIGN
    ids = torch.tensor([[4, 2, 9]])
    with load(directory, budget=budget) as engine, torch.no_grad():
        kept = set(engine.kept_units) & set(experts)
        routed = set(engine.rows_units) & set(experts)
        assert len(kept) == 1 and len(routed) == 2 and engine.memory.weight_bytes <= budget
        assert torch.equal(engine(ids).logits, reference(ids).logits)
        assert engine.last_weights_peak <= budget


def test_experts_used_before_are_copied_from_the_cache_not_read(moe):
    directory, manifest, reference = moe
    ids = torch.tensor([[3, 8, 13, 21]])
    # (the cache alone: what is read ahead on a guess is tested in test_expert_guess.py)
    with load(directory, budget="60%", trace=True, expert_prefetch=False) as engine, torch.no_grad():
        assert engine.memory.expert_cache_bytes > 0 and engine.memory.weight_bytes <= manifest.total_bytes * 0.6
        per_expert = {name: u.nbytes // 8 for name, u in ((u.name, u) for u in manifest.units if experts_segment(u))}
        engine(ids)  # the first pass verifies every unit whole: nothing cached
        token = ids[:, -1:]
        first = engine(token)
        read_first = sum(n for _, n in _experts_reads(engine))
        again = engine(token)  # the same token: the same experts, now held
        assert torch.equal(again.logits, first.logits)
        assert sum(n for _, n in _experts_reads(engine)) < read_first
        stats = engine.expert_cache
        assert stats["hits"] > 0 and stats["held_bytes"] <= engine.memory.expert_cache_bytes
        assert stats["bytes_saved"] >= stats["hits"] * min(per_expert.values()) - 1
        generated = engine.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
        assert engine.last_weights_peak <= manifest.total_bytes * 0.6
    assert torch.equal(generated, reference.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False))
    assert 0 < stats["hit_rate"] <= 1


PAGE_SLICES = {e: ((e * 4, 4, 0), (32 + e * 4, 4, ALIGN)) for e in range(8)}
"""A unit of 64 bytes, two tensors of 4 bytes per expert; each slice lands on a page of a slot."""


def test_the_expert_cache_keeps_the_most_often_chosen_experts_within_its_capacity():
    from layerfit.engine.expert_cache import ExpertCache

    cache = ExpertCache(capacity=3 * 2 * ALIGN + 100, slot_bytes=2 * ALIGN)
    assert cache.slots == 3 and cache.capacity == 3 * 2 * ALIGN
    unit = bytearray(range(64))
    out = bytearray(64)

    def choose(e: int) -> bool:  # what the engine does: look it up, store it on a miss
        hit = cache.load(7, e, memoryview(out), PAGE_SLICES[e])
        if not hit:
            cache.store(7, e, memoryview(unit), PAGE_SLICES[e])
        return hit

    assert [choose(e) for e in (0, 1, 2)] == [False] * 3
    assert cache.cached(7) == {0, 1, 2} and cache.used == 3 * cache.slot_bytes
    assert choose(0) and out[0:4] == unit[0:4] and out[32:36] == unit[32:36] and out[4:32] == bytes(28)
    assert not choose(3)  # chosen once: not more often than any held expert, so not let in
    assert cache.cached(7) == {0, 1, 2}
    assert not choose(3)  # twice now: pushes out 1, chosen once and least recent among those
    assert cache.cached(7) == {0, 2, 3} and cache.evictions == 1
    for _ in range(4):  # a cycle over more experts than fit does not thrash the cache
        for e in (0, 2, 3, 4, 5):
            choose(e)
    assert cache.cached(7) == {0, 2, 3}
    stats = cache.stats
    assert stats["hits"] == 1 + 12 and stats["hit_rate"] == stats["hits"] / (stats["hits"] + stats["misses"])
    cache.close()


def test_the_expert_cache_thrashes_no_cycle():
    """A decode visits layers in a cycle; with room for 4 of the 6 experts a token uses, the
    cache must still hit on 4 of them per token."""
    from layerfit.engine.expert_cache import ExpertCache

    cache = ExpertCache(capacity=4 * ALIGN, slot_bytes=1)
    one = memoryview(bytearray(1))
    for _ in range(10):
        for unit in range(3):
            for e in (unit, unit + 3):
                if not cache.load(unit, e, one, ((0, 1, 0),)):
                    cache.store(unit, e, one, ((0, 1, 0),))
    assert cache.hits >= 4 * 9
    cache.close()


def test_inspect_shows_the_expert_cache_the_engine_plans(moe):
    import json

    from typer.testing import CliRunner

    from layerfit.cli import app

    directory, manifest, _ = moe
    with load(directory, budget="60%") as engine:
        planned = engine.memory.expert_cache_bytes
    shown = json.loads(CliRunner().invoke(app, ["inspect", str(directory), "--budget", "60%", "--json"]).output)
    assert shown["auto_plan"]["expert_cache_bytes"] == planned > 0
    text = CliRunner().invoke(app, ["inspect", str(directory), "--budget", "60%"]).output
    assert "expert cache" in text and "experts" in text
    without = CliRunner().invoke(app, ["inspect", str(directory), "--budget", "100%"]).output
    assert "expert cache" not in without
