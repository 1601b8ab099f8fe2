"""Prompt lookup's proposals are transformers' own, verification keeps the argmax's
tokens, and the server's setting is read once."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from layerfit.errors import InputError
from layerfit.schedule.decoding.lookup import (
    MAX_NGRAM,
    MAX_PROMPT_LOOKUP,
    PromptLookup,
    accept,
    propose,
)

END = 1


def transformers_proposals(ids: list[int], n: int) -> list[int]:
    generator = PromptLookupCandidateGenerator(
        eos_token_id=torch.tensor([END]), num_output_tokens=n, max_matching_ngram_size=MAX_NGRAM, max_length=10_000,
    )
    candidates, _ = generator.get_candidates(torch.tensor([ids]))
    return candidates[0, len(ids):].tolist()


@settings(max_examples=300, deadline=None)
@given(ids=st.lists(st.integers(0, 5), min_size=1, max_size=40), n=st.integers(1, 12))
def test_proposals_are_transformers_prompt_lookups(ids: list[int], n: int):
    # a small alphabet, so n-grams repeat and end tokens fall inside continuations
    assert propose(ids, n, frozenset({END})) == transformers_proposals(ids, n)


def test_a_proposal_stops_before_an_end_token_and_none_without_a_match():
    assert propose([5, 6, 7, 1, 8, 5, 6], 4, frozenset({1})) == [7]
    assert propose([5, 6, 7, 8], 4, frozenset({1})) == []
    assert propose([5, 6, 7, 5, 6], 0) == []


@settings(max_examples=200, deadline=None)
@given(best=st.lists(st.integers(0, 3), min_size=1, max_size=9), data=st.data())
def test_accepted_tokens_are_the_argmax_prefix_and_the_next(best: list[int], data: st.DataObject):
    proposals = data.draw(st.lists(st.integers(0, 3), min_size=len(best) - 1, max_size=len(best) - 1))
    logits = torch.nn.functional.one_hot(torch.tensor(best), 4).float()
    made = accept(proposals, logits)
    agree = next((i for i, (p, b) in enumerate(zip(proposals, best, strict=False)) if p != b), len(proposals))
    assert made == best[:agree + 1]  # greedy decoding's tokens: each the argmax after the ones before


def test_the_server_setting_reads_numbers_and_models_once():
    lookup = PromptLookup.parse(["8", "lm=3", "other=0"])
    assert (lookup.of("lm"), lookup.of("other"), lookup.of("any")) == (3, 0, 8)
    for bad in ("x", "lm=", f"{MAX_PROMPT_LOOKUP + 1}", "-1", "lm=2.5"):
        with pytest.raises(InputError, match="--prompt-lookup"):
            PromptLookup.parse([bad])
