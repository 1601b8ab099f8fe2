"""Compact places of routed experts: a module of stacked experts bound over slots of the
chosen experts only, its router's choice renumbered, computes what it computes bound
whole, bit for bit, in each of transformers' implementations; slots keep the experts'
order whatever the guess that filled them."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layerfit.engine.expert_places import (
    ExpertPlace,
    ahead_layout,
    assign,
    bind_compact,
    compact_layout,
    in_order,
    renumbered,
)
from layerfit.engine.experts import ExpertTable
from layerfit.engine.skeleton import segment_bindings
from layerfit.store.manifest import ALIGN, Segment, TensorLayout

transformers = pytest.importorskip("transformers")
COUNT, HIDDEN, INTER = 8, 64, 96


def _experts(implementation: str | None):
    """A Mixtral experts module with seeded weights, its manifest segment and its
    bytes as the weights file lays them out (gate_up_proj, then down_proj)."""
    from transformers.models.mixtral.modeling_mixtral import MixtralExperts

    config = transformers.MixtralConfig(hidden_size=HIDDEN, intermediate_size=INTER, num_local_experts=COUNT,
                                        num_experts_per_tok=2)
    config._experts_implementation = implementation
    torch.manual_seed(0)
    module = MixtralExperts(config)
    model = torch.nn.Module()
    model.experts = module
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0, 0.05)
    tensors, offset, data = [], 0, bytearray()
    for name in ("gate_up_proj", "down_proj"):
        t = getattr(module, name).detach().contiguous()
        raw = t.numpy().tobytes()
        tensors.append(TensorLayout(f"experts.{name}", "param", "float32", tuple(t.shape), offset, len(raw),
                                    (f"experts.{name}",)))
        data += raw
        offset += len(raw)
    segment = Segment(0, "experts", "MixtralExperts", 0, -(-offset // ALIGN) * ALIGN, offset, "0" * 64, tuple(tensors))
    return model, module, segment, bytes(data)


@pytest.mark.parametrize("implementation", ["eager", "grouped_mm", "batched_mm"])
@settings(max_examples=40, deadline=None)
@given(tokens=st.integers(1, 6), top_k=st.integers(2, 4), data=st.data())
def test_bound_compact_a_module_of_experts_computes_what_it_computes_bound_whole(implementation, tokens, top_k, data):
    """(With three or more experts a token, the order the module sums them in shows.)"""
    model, module, segment, raw = _experts(implementation)
    hidden = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(tokens))
    choice = torch.tensor([data.draw(st.lists(st.integers(0, COUNT - 1), min_size=top_k, max_size=top_k, unique=True))
                           for _ in range(tokens)])
    weights = torch.softmax(torch.randn(tokens, top_k), dim=-1)
    with torch.no_grad():
        expected = module(hidden, choice, weights)
    table = ExpertTable(segment, segment_bindings(model, segment, 0))
    assert compact_layout(table)
    chosen = sorted(set(choice.reshape(-1).tolist()))
    guessed = data.draw(st.lists(st.integers(0, COUNT - 1), max_size=3, unique=True))
    place = ExpertPlace(2 * ALIGN, ahead_layout(sorted(guessed), tokens, top_k, COUNT))  # as the reader lays it out
    buffer = torch.zeros(2 * ALIGN + len(place.slots) * table.slot_bytes, dtype=torch.uint8)
    fills = assign(place, chosen)
    fills = in_order(place, chosen) if fills is None else fills
    assert {e for e, _ in fills} <= set(chosen)
    for e, s in enumerate(place.slots):
        if s is not None:  # every slot's expert, read or guessed, from the file's bytes
            at = place.offset + e * table.slot_bytes
            for (offset, size, inside) in table.slices(s):
                buffer[at + inside : at + inside + size] = torch.frombuffer(bytearray(raw[offset : offset + size]),
                                                                             dtype=torch.uint8)
    original = module.gate_up_proj
    count = bind_compact(table, buffer, place)
    try:
        assert module.num_experts == len(place.slots) and module.gate_up_proj.shape[0] == len(place.slots)
        with torch.no_grad():
            got = module(hidden, renumbered(choice, place, COUNT), weights)
    finally:
        table.restore(count)
    assert module.num_experts == COUNT and module.gate_up_proj is original  # what unbinding restores
    assert torch.equal(got, expected)


@settings(max_examples=300, deadline=None)
@given(
    guessed=st.lists(st.integers(0, 15), max_size=6, unique=True),
    chosen=st.lists(st.integers(0, 15), min_size=1, max_size=6, unique=True),
    tokens=st.integers(1, 3),
)
def test_a_place_keeps_its_experts_in_order_and_its_guesses_where_they_were_read(guessed, chosen, tokens):
    chosen = sorted(chosen)
    layout = ahead_layout(sorted(guessed), tokens, 2, 16)
    assert [e for e in layout if e is not None] == sorted(guessed)
    assert len(layout) == min(16, len(guessed) + 2 * tokens)
    if len(chosen) > 2 * tokens:  # more than the pass could choose: not the case the layout serves
        return
    place = ExpertPlace(0, list(layout))
    fills = assign(place, chosen)
    if fills is None:
        fills = in_order(place, chosen)
        assert place.slots[: len(chosen)] == chosen
    else:
        for e, s in enumerate(layout):  # a guessed expert that was chosen kept its slot
            if s in chosen:
                assert place.slots[e] == s and all(f != s for f, _ in fills)
    slots = [place.slots.index(e) for e in chosen]
    assert slots == sorted(slots) and len(set(slots)) == len(slots)  # the experts' order, one slot each
    assert {e for e, _ in fills} == set(chosen) - {e for e in layout if e is not None} or fills == list(
        zip(chosen, range(len(chosen)), strict=True))


def test_one_token_of_two_experts_always_finds_its_slots_in_order():
    """The layout of a decoded token's guess (two guessed experts, a free slot before and
    one after) serves every choice of two experts without placing any again."""
    for g in [(a, b) for a in range(8) for b in range(a + 1, 8)]:
        for c in [(a, b) for a in range(8) for b in range(a + 1, 8)]:
            place = ExpertPlace(0, ahead_layout(list(g), 1, 2, 8))
            assert assign(place, list(c)) is not None, (g, c)


def test_a_unit_laid_out_unevenly_is_not_bound_compact():
    # 3 x 5 floats a slice: expert slices straddle pages at different offsets
    tensors = (TensorLayout("m.experts.w0", "param", "float32", (4, 3, 5), 0, 240, ("m.experts.w0",)),
               TensorLayout("m.experts.w1", "param", "float32", (4, 5, 3), 256, 240, ("m.experts.w1",)))
    segment = Segment(3, "m.experts", "MoeExperts", 100 * ALIGN + 8, ALIGN, 496, "0" * 64, tensors)
    table = ExpertTable(segment, [])
    assert len({tuple((size, at) for _, size, at in table.slices(e)) for e in range(4)}) > 1
    assert not compact_layout(table)
