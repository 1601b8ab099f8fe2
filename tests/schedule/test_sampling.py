"""How a sequence chooses its next token: greedy, or a seeded draw after transformers'
own temperature, top-k and top-p warpers."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from layerfit.errors import InputError
from layerfit.schedule.decoding.sampling import Sampling, choose

pytest.importorskip("transformers")


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), k=st.integers(1, 5), vocab=st.integers(6, 40))
def test_a_draw_stays_within_the_top_k_and_repeats_with_its_seed(seed: int, k: int, vocab: int):
    logits = torch.randn(vocab, generator=torch.Generator().manual_seed(seed))
    sampling = Sampling(temperature=0.7, top_k=k, seed=seed)
    token = choose(logits, sampling, sampling.generator())
    assert token in torch.topk(logits, k).indices.tolist()
    assert choose(logits, sampling, sampling.generator()) == token  # the same seed, the same draw


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_greedy_top_k_1_and_a_tiny_top_p_all_take_the_argmax(seed: int):
    logits = torch.randn(50, generator=torch.Generator().manual_seed(seed))
    best = int(torch.argmax(logits))
    assert choose(logits, Sampling(), None) == best
    for sampling in (Sampling(temperature=1.0, top_k=1, seed=seed), Sampling(temperature=1.0, top_p=1e-9, seed=seed)):
        assert choose(logits, sampling, sampling.generator()) == best


def test_settings_out_of_range_are_refused():
    for bad in ({"temperature": -1.0}, {"temperature": float("nan")}, {"top_p": 0.0}, {"top_k": -2}, {"seed": -1}):
        with pytest.raises(InputError):
            Sampling(**bad)
