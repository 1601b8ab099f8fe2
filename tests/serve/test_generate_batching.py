"""Continuous batching: sequences in flight decode together, one engine pass per step for
all of them; a sequence joins at the next step and leaves when done; its KV cache is
held in the runtime's ledger, so admitting one never passes the budget.

Equality: a batched row's logits are the model's for that sequence alone within 1e-5
(measured: about 1e-7, the order of float32 sums over padded rows), and every greedy
token equals transformers' own ``generate`` for the prompt alone."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import transformers
from generate_helpers import KV_BYTES_PER_TOKEN, make_repository, reference_tokens
from serve_helpers import settings, wait_until

import layerfit.engine
from layerfit.errors import GenerationTooLargeError
from layerfit.schedule.decoding.batch_step import BatchStep, Row, kv_bytes_per_token
from layerfit.schedule.decoding.batching import DecodeLoop, Finish, Sequence
from layerfit.schedule.decoding.sampling import Sampling
from layerfit.schedule.ledger import MemoryLedger
from layerfit.serve.server import ServerThread

openai = pytest.importorskip("openai")  # the test extra has it; the compatibility legs do not

pytestmark = pytest.mark.timeout(120)

PROMPTS = [[5, 10, 15, 23, 36], [7, 8], [9, 11, 13, 4, 6, 8, 10, 12, 14], [42]]


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repository(tmp_path_factory.mktemp("batching"))


@pytest.fixture()
def engine(hf_folder: Path) -> Iterator[layerfit.engine.Engine]:
    with layerfit.engine.load(hf_folder.parent / "repo" / "lm", pipeline="async") as running:
        yield running


class Collected:
    """A sequence's tokens and end, with an event set when it ends."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.finish: Finish | None = None
        self.error: BaseException | None = None
        self.done = threading.Event()

    def __call__(self, token: int | None, finish: Finish | None, error: BaseException | None) -> None:
        if token is not None:
            self.tokens.append(token)
        else:
            self.finish, self.error = finish, error
            self.done.set()


def sequence(prompt: list[int], n: int, sink: Collected) -> Sequence:
    return Sequence(prompt, n, Sampling(), frozenset({1}), sink)


def test_the_kv_cache_is_counted_from_the_config(engine: layerfit.engine.Engine):
    assert kv_bytes_per_token(engine.model.config) == KV_BYTES_PER_TOKEN


def test_batched_logits_are_each_sequences_alone_within_tolerance(engine: layerfit.engine.Engine, hf_folder: Path):
    model = transformers.LlamaForCausalLM.from_pretrained(hf_folder).eval()
    step = BatchStep(engine)
    logits, caches = step.run([Row(None, 0, p) for p in PROMPTS])  # four prefills in one pass
    nxt = [int(row.argmax()) for row in logits]
    logits2, _ = step.run([Row(c, len(p), [t]) for c, p, t in zip(caches, PROMPTS, nxt, strict=True)])
    with torch.no_grad():
        for i, prompt in enumerate(PROMPTS):
            alone = model(torch.tensor([[*prompt, nxt[i]]])).logits[0]
            assert torch.allclose(logits[i], alone[-2], atol=1e-5, rtol=0)
            assert torch.allclose(logits2[i], alone[-1], atol=1e-5, rtol=0)
    assert step.steps == 2


def test_sequences_join_mid_flight_and_each_gets_its_greedy_tokens_alone(engine: layerfit.engine.Engine, hf_folder: Path):
    loop = DecodeLoop("lm", engine, MemoryLedger(10**7), max_waiting=8)
    sinks = [Collected() for _ in PROMPTS]

    class JoinLater(Collected):  # the first sequence brings in the others as it goes
        def __call__(self, token: int | None, finish: Finish | None, error: BaseException | None) -> None:
            super().__call__(token, finish, error)
            if len(self.tokens) in (2, 5) and token is not None:
                i = 1 if len(self.tokens) == 2 else 2
                loop.submit(sequence(PROMPTS[i], 12, sinks[i]))

    sinks[0] = JoinLater()
    loop.submit(sequence(PROMPTS[0], 12, sinks[0]))
    loop.submit(sequence(PROMPTS[3], 12, sinks[3]))
    try:
        for sink in sinks:
            assert sink.done.wait(60) and sink.error is None
        for prompt, sink in zip(PROMPTS, sinks, strict=True):
            assert sink.tokens == reference_tokens(hf_folder, prompt, 12)
        stats = loop.stats()
        assert stats["most_in_flight"] >= 3
        assert stats["steps"] < stats["sequence_steps"]  # passes were shared
    finally:
        loop.close()


def test_admission_never_passes_the_budget_and_a_cache_too_large_is_refused(engine: layerfit.engine.Engine):
    weights = engine.memory.weight_bytes
    one = weights + KV_BYTES_PER_TOKEN * 3 * 25  # a sequence of 25 positions: its cache, the padded in and out
    ledger = MemoryLedger(one + 1000)  # one sequence at a time fits, two do not
    loop = DecodeLoop("lm", engine, ledger, max_waiting=2)
    try:
        with pytest.raises(GenerationTooLargeError, match="more than the memory budget"):
            loop.submit(sequence([5] * 40, 20, Collected()))
        sinks = [Collected(), Collected()]
        for sink in sinks:
            loop.submit(sequence(PROMPTS[0], 20, sink))
        for sink in sinks:
            assert sink.done.wait(60) and sink.error is None
        assert sinks[0].tokens == sinks[1].tokens
        assert loop.stats()["most_in_flight"] == 1  # the second waited for the first's memory
        assert ledger.peak <= ledger.budget
        wait_until(lambda: ledger.used == 0)  # the loop returns the memory right after the last token
    finally:
        loop.close()


def test_kept_weights_read_fewer_bytes_give_the_same_tokens_and_are_dropped_when_idle(
    engine: layerfit.engine.Engine, hf_folder: Path
):
    lean = engine.memory.weight_bytes
    total = engine.memory.total_weight_bytes
    ledger = MemoryLedger(10**7)
    loop = DecodeLoop("lm", engine, ledger, max_waiting=4, kept_budget=(lean + total) // 2)
    try:
        assert lean == loop.lean_bytes < loop.kept_bytes <= (lean + total) // 2
        sinks = [Collected() for _ in PROMPTS[:2]]
        for prompt, sink in zip(PROMPTS, sinks, strict=False):
            loop.submit(sequence(prompt, 10, sink))
        for prompt, sink in zip(PROMPTS, sinks, strict=False):
            assert sink.done.wait(60) and sink.error is None
            assert sink.tokens == reference_tokens(hf_folder, prompt, 10)
        stats = loop.stats()
        assert stats["kept_steps"] == stats["steps"] > 0
        assert ledger.peak >= loop.kept_bytes  # the kept weights were held while they ran
        wait_until(lambda: ledger.used == 0 and engine.memory.weight_bytes == lean)  # idle: lean again
        assert engine.kept_units == ()
    finally:
        loop.close()


def test_kept_weights_give_way_to_a_cache_that_fits_only_beside_the_lean_buffers(engine: layerfit.engine.Engine):
    lean = engine.memory.weight_bytes
    total = engine.memory.total_weight_bytes
    one = lean + KV_BYTES_PER_TOKEN * 3 * 25
    ledger = MemoryLedger(one + 1000)  # the sequence fits only beside the stream's own buffers
    loop = DecodeLoop("lm", engine, ledger, max_waiting=2, kept_budget=total)
    try:
        assert loop.kept_bytes > one + 1000 - lean
        sink = Collected()
        loop.submit(sequence(PROMPTS[0], 20, sink))
        assert sink.done.wait(60) and sink.error is None
        assert loop.stats()["kept_steps"] == 0 and ledger.peak <= ledger.budget
    finally:
        loop.close()


def test_concurrent_http_clients_decode_together_and_get_what_they_would_alone(hf_folder: Path):
    from generate_helpers import word_tokenizer

    tokenizer = word_tokenizer()
    prompts = [" ".join(tokenizer.convert_ids_to_tokens(p)) for p in PROMPTS]
    with ServerThread(settings(hf_folder.parent / "repo", memory_budget="4MB")) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        client.completions.create(model="lm", prompt="w1", max_tokens=1)  # opens the engine
        start, texts = threading.Barrier(len(prompts)), [""] * len(prompts)

        def ask(i: int) -> None:
            start.wait()
            texts[i] = client.completions.create(model="lm", prompt=prompts[i], max_tokens=30, temperature=0).choices[0].text

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        stats = server.built.runtime.decoding_stats("lm")
        assert server.built.runtime.stats()["peak_bytes"] <= server.built.runtime.ledger.budget
    for prompt, text in zip(PROMPTS, texts, strict=True):
        assert text == tokenizer.decode(reference_tokens(hf_folder, prompt, 30), skip_special_tokens=True)
    assert stats["most_in_flight"] >= 2 and stats["steps"] < stats["sequence_steps"]


@pytest.mark.parametrize("failure", ["in the step", "in the engine's pass"])
def test_a_failing_sequence_ends_alone_and_the_others_keep_their_tokens(
    engine: layerfit.engine.Engine, hf_folder: Path, failure: str
):
    """A pass that fails for one sequence ends that sequence only; the others run that
    step alone and get the tokens they get alone. The failure: any step feeding token 63,
    or (the submit's check lifted) an id the embedding does not have, mid-pass."""
    loop = DecodeLoop("lm", engine, MemoryLedger(10**7), max_waiting=8)
    run = loop.step.run
    poison, error = ([7, 63, 8], RuntimeError) if failure == "in the step" else ([7, 64, 8], IndexError)

    def poisoned(rows: list[Row]) -> tuple:
        if any(63 in row.feed for row in rows):
            raise RuntimeError("a sequence this pass cannot take")
        return run(rows)

    if failure == "in the step":
        loop.step.run = poisoned  # type: ignore[method-assign]
    else:
        loop.check_prompt = lambda prompt: None  # type: ignore[method-assign]
    sinks = [Collected() for _ in range(3)]
    gate = threading.Event()

    class Gate(Collected):  # holds the loop's first step until every sequence waits, so all share it
        def __call__(self, token, finish, error) -> None:
            gate.wait(10)
            super().__call__(token, finish, error)

    sinks[0] = Gate()
    try:
        loop.submit(sequence(PROMPTS[0], 12, sinks[0]))
        loop.submit(sequence(poison, 12, sinks[1]))
        loop.submit(sequence(PROMPTS[2], 12, sinks[2]))
        gate.set()
        for sink in sinks:
            assert sink.done.wait(60)
        assert isinstance(sinks[1].error, error) and sinks[1].tokens == [], sinks[1].error
        for prompt, sink in ((PROMPTS[0], sinks[0]), (PROMPTS[2], sinks[2])):
            assert sink.error is None and sink.tokens == reference_tokens(hf_folder, prompt, 12)
        assert loop.stats()["in_flight"] == 0
    finally:
        loop.close()


def test_a_prompt_id_outside_the_vocabulary_never_joins_a_batch(engine: layerfit.engine.Engine):
    from layerfit.errors import InputError

    loop = DecodeLoop("lm", engine, MemoryLedger(10**7), max_waiting=8)
    try:
        for prompt in ([-1], [5, 64], []):
            with pytest.raises(InputError):
                loop.submit(sequence(prompt, 4, Collected()))
        assert loop.stats()["waiting"] == 0
    finally:
        loop.close()


def test_a_temperature_whose_division_overflows_chooses_the_argmax():
    from layerfit.schedule.decoding.sampling import choose

    logits = torch.randn(64, generator=torch.Generator().manual_seed(0)) * 10
    for temperature in (1e-300, 1e-45):
        sampling = Sampling(temperature=temperature, top_p=0.9, top_k=5, seed=1)
        assert choose(logits, sampling, sampling.generator()) == int(logits.argmax())
