"""Several tokens per pass from Python (issue 56): ``engine.generate`` counts the passes it
made (``passes=PassCount()``), transformers' own prompt lookup makes the same passes and
tokens through the engine as on the model, and a draft given as an engine streams its
own passes and keeps greedy tokens equal to plain decoding."""

from __future__ import annotations

import pytest
import tinymodels
import torch

from layerfit.engine import load
from layerfit.engine.generation import PassCount
from layerfit.errors import LayerfitError
from layerfit.store import prepare

PROMPT = torch.tensor([[44, 17, 83, 9, 61, 30]])
NEW = 24


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    directory = tmp_path_factory.mktemp("passes") / "llama"
    prepare("tinymodels:tiny_llama", directory, input_shape=(1, 8), input_dtype="int64")
    return directory


def _model_passes(**options) -> tuple[torch.Tensor, int]:
    """tiny_llama's own generate and the forward passes it made."""
    model = tinymodels.tiny_llama()
    calls = []
    forward = model.forward
    model.forward = lambda *a, **k: calls.append(1) or forward(*a, **k)
    out = model.generate(PROMPT, max_new_tokens=NEW, do_sample=False, **options)
    return out, len(calls)


def test_prompt_lookup_makes_the_models_own_passes_and_tokens(llama) -> None:
    plain, plain_passes = _model_passes()
    lookup, lookup_passes = _model_passes(prompt_lookup_num_tokens=8)
    assert torch.equal(plain, lookup) and plain_passes == NEW and lookup_passes < NEW
    with load(llama, budget="50%") as engine:
        for options, passes in (({}, plain_passes), ({"prompt_lookup_num_tokens": 8}, lookup_passes)):
            count = PassCount()
            out = engine.generate(PROMPT, max_new_tokens=NEW, do_sample=False, passes=count, **options)
            assert torch.equal(out, plain) and count == PassCount(model=passes)


def test_a_draft_engine_streams_its_own_passes_and_keeps_greedy_tokens(llama) -> None:
    plain, _ = _model_passes()
    with load(llama, budget="50%") as engine, load(llama, pipeline="preload") as draft:
        count = PassCount()
        out = engine.generate(PROMPT, max_new_tokens=NEW, do_sample=False, assistant_model=draft, passes=count)
        assert torch.equal(out, plain)
        assert 0 < count.model < NEW and count.draft > 0  # the same weights: the draft's guesses are taken
        assert draft.model.forward.__func__ is type(draft.model).forward  # its own forward is back


def test_a_draft_that_is_the_engine_itself_or_no_model_is_refused(llama) -> None:
    with load(llama) as engine:
        with pytest.raises(LayerfitError, match="assistant_model is the model itself"):
            engine.generate(PROMPT, max_new_tokens=2, assistant_model=engine)
        with pytest.raises(LayerfitError, match="assistant_model is a str: give a model, or an engine"):
            engine.generate(PROMPT, max_new_tokens=2, assistant_model="draft")
