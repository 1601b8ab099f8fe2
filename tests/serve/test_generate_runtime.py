"""The runtime owns decoding: ``Runtime.generate`` (the Python API) decodes in the same
loop as the server's routes, its KV caches held in the runtime's ledger; the loop
follows its model (an unload or a reload retires it, letting the sequences in flight
finish; shutdown closes it); which models generate is one rule, the command line's too."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from generate_helpers import KV_BYTES_PER_TOKEN, make_repository, reference_tokens, word_tokenizer
from serve_helpers import wait_until

from layerfit.errors import ModelNotReadyError
from layerfit.schedule.decoding.sampling import Sampling
from layerfit.schedule.runtime.executor import Runtime

pytestmark = pytest.mark.timeout(120)

PROMPT = [5, 10, 15, 23, 36]


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repository(tmp_path_factory.mktemp("runtime-decoding"))


@pytest.fixture()
def runtime(hf_folder: Path) -> Iterator[Runtime]:
    with Runtime(hf_folder.parent / "repo", "4MB", queue_limit=8) as running:
        yield running


def test_generate_gives_transformers_greedy_tokens_and_its_ledger_holds_the_cache(runtime: Runtime, hf_folder: Path):
    assert runtime.generate("lm", PROMPT, 12) == reference_tokens(hf_folder, PROMPT, 12)
    text = " ".join(word_tokenizer().convert_ids_to_tokens(PROMPT))
    assert runtime.generate("lm", text, 12) == reference_tokens(hf_folder, PROMPT, 12)  # text: the model's tokenizer
    stats = runtime.decoding_stats("lm")
    assert stats["steps"] > 0 and stats["held_bytes"] == 0
    loop = runtime.decoder("lm").loop
    assert runtime.stats()["peak_bytes"] >= loop.lean_bytes + KV_BYTES_PER_TOKEN * 3 * (len(PROMPT) + 12)
    wait_until(lambda: runtime.ledger.used == 0)  # the loop returns its memory after the last token
    seeded = Sampling(temperature=1.5, top_p=0.95, seed=7)
    assert runtime.generate("lm", PROMPT, 8, seeded) == runtime.generate("lm", PROMPT, 8, seeded)


def test_which_models_generate_is_one_rule(runtime: Runtime):
    assert runtime.cannot_generate("lm") is None
    assert "not prepared from a Hugging Face language model" in (runtime.cannot_generate("chain") or "")
    with pytest.raises(Exception, match="cannot generate with 'chain'"):
        runtime.decoder("chain")


def test_an_unload_retires_the_loop_after_its_sequences_and_a_reload_opens_a_new_one(runtime: Runtime, hf_folder: Path):
    first = runtime.decoder("lm")
    tokens: list[int] = []
    two, reloaded, done = threading.Event(), threading.Event(), threading.Event()

    def on_token(token, finish, error) -> None:
        if token is None:
            done.set()
            return
        tokens.append(token)
        if len(tokens) == 2:  # hold the loop until the model is reloaded: mid-sequence
            two.set()
            reloaded.wait(60)

    first.submit(PROMPT, 20, Sampling(), on_token)
    assert two.wait(60)
    runtime.load_model("lm")  # a new version of the model
    reloaded.set()
    assert done.wait(60)
    assert tokens == reference_tokens(hf_folder, PROMPT, 20)  # the sequence in flight decoded to its end
    assert first.loop.retired
    wait_until(lambda: not first.loop._thread.is_alive())  # then the retired loop closed itself
    second = runtime.decoder("lm")
    assert second is not first and not second.loop.retired
    runtime.unload_model("lm")
    assert second.loop.retired
    with pytest.raises(ModelNotReadyError):
        runtime.decoder("lm")
    wait_until(lambda: runtime.ledger.used == 0)


def test_shutdown_closes_every_loop(hf_folder: Path):
    runtime = Runtime(hf_folder.parent / "repo", "4MB")
    loop = runtime.decoder("lm").loop
    runtime.shutdown(wait=True)
    assert loop.retired and not loop._thread.is_alive()
    with pytest.raises(ModelNotReadyError, match="shut down"):
        runtime.decoder("lm")
