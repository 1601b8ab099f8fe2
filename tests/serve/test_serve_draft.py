"""A draft model on the server (``--draft MODEL=DRAFT``): a resident model of the same
vocabulary proposes each greedy sequence's tokens, batched across the sequences that
draft, and the model's shared pass verifies them; the tokens stay transformers' own greedy
ones beside sequences that look up or do neither, and a perfect draft cuts the passes."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
import transformers
from generate_helpers import CONFIG, make_repository, reference_tokens, words
from generate_helpers import decoding_stats as stats
from serve_helpers import settings

from layerfit.errors import LayerfitError
from layerfit.serve.server import ServerThread
from layerfit.store import prepare

openai = pytest.importorskip("openai")  # the test extra has it; the compatibility legs do not

pytestmark = pytest.mark.timeout(180)

PROMPTS = [[5, 10, 15, 23, 36], [7, 8], [9, 11, 13, 4, 6, 8, 10, 12, 14], [42], [20, 21, 22, 20, 21, 22, 20, 21],
           [12, 28, 32, 9, 6, 6]]
TOKENS = 24


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``lm``, ``chain``, ``twin`` (lm's own weights: a draft always right) and ``small``
    (one layer, other weights: a draft often wrong)."""
    folder = make_repository(tmp_path_factory.mktemp("draft"))
    repo = folder.parent / "repo"
    prepare("hf:" + str(folder), repo / "twin")
    torch.manual_seed(5)
    small = folder.parent / "hf-small"
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**CONFIG, "num_hidden_layers": 1})).save_pretrained(small)
    prepare("hf:" + str(small), repo / "small")
    return folder


@pytest.fixture(scope="module")
def server(hf_folder: Path) -> Iterator[ServerThread]:
    with ServerThread(settings(hf_folder.parent / "repo", request_memory="4MB", draft=["lm=small"])) as running:
        yield running


def test_drafting_looking_up_and_plain_requests_in_one_batch_make_transformers_greedy_tokens(
    server: ServerThread, hf_folder: Path
):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    ways = [{}, {"draft": False}, {"prompt_lookup": 6}]  # the draft (the default), neither, lookup

    def complete(i: int) -> str:
        done = client.completions.create(model="lm", prompt=PROMPTS[i], max_tokens=TOKENS, temperature=0,
                                         extra_body=ways[i % 3])
        assert done.usage.completion_tokens == TOKENS
        return done.choices[0].text

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        texts = list(pool.map(complete, range(len(PROMPTS))))
    for prompt, text in zip(PROMPTS, texts, strict=True):
        assert text == words(reference_tokens(hf_folder, prompt, TOKENS))
    after = stats(server)
    assert after["draft_passes"] > 0 and after["proposed"] > after["accepted"] > 0
    metrics = httpx.get(server.url + "/metrics").text
    assert f'layerfit_decode_draft_passes_total{{model="lm"}} {float(after["draft_passes"])}' in metrics


def test_a_draft_always_right_makes_its_tokens_plus_one_per_pass(hf_folder: Path):
    repo = hf_folder.parent / "repo"
    with ServerThread(settings(repo, request_memory="4MB", draft=["lm=twin"], draft_tokens=4)) as running:
        client = openai.OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0)
        done = client.completions.create(model="lm", prompt=PROMPTS[1], max_tokens=TOKENS, temperature=0)
        assert done.choices[0].text == words(reference_tokens(hf_folder, PROMPTS[1], TOKENS))
        after = stats(running)
        assert after["accepted"] == after["proposed"] > 0
        assert after["steps"] == TOKENS // 5 + (TOKENS % 5 > 0)  # 4 proposals and the model's own, a pass
        sampled = client.completions.create(model="lm", prompt=PROMPTS[1], max_tokens=8, temperature=1, seed=1)
        assert sampled.usage.completion_tokens == 8
        assert stats(running)["proposed"] == after["proposed"]  # a sampled request makes one a pass


def test_the_draft_field_is_validated_in_one_line(server: ServerThread):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    for model, extra, said in [("twin", {"draft": True}, "has no draft model"),
                               ("lm", {"draft": True, "prompt_lookup": 4}, "one of the two"),
                               ("lm", {"draft": "yes"}, "draft")]:
        with pytest.raises(openai.BadRequestError, match=said) as caught:
            client.completions.create(model=model, prompt="w1", extra_body=extra)
        assert "\n" not in caught.value.body["message"]


def test_a_draft_that_is_no_model_of_the_repository_is_refused_at_start(hf_folder: Path):
    repo = hf_folder.parent / "repo"
    with pytest.raises(LayerfitError, match="the repository has no model 'nothing'"):
        ServerThread(settings(repo, draft=["lm=nothing"])).start()
    with pytest.raises(LayerfitError, match="MODEL=DRAFT"):
        settings(repo, draft=["lm"])


def test_a_draft_that_does_not_generate_is_left_out_and_the_model_serves(hf_folder: Path, caplog):
    repo = hf_folder.parent / "repo"
    with ServerThread(settings(repo, request_memory="4MB", draft=["lm=chain"])) as running:
        client = openai.OpenAI(base_url=running.url + "/v1", api_key="unused", max_retries=0)
        done = client.completions.create(model="lm", prompt=PROMPTS[0], max_tokens=8, temperature=0)
        assert done.choices[0].text == words(reference_tokens(hf_folder, PROMPTS[0], 8))
        assert stats(running)["draft_passes"] == 0
    assert any("decodes without its draft 'chain'" in r.getMessage() for r in caplog.records)


def test_a_pass_failing_for_one_sequence_ends_it_alone_and_the_drafts_go_on(hf_folder: Path):
    """The failed pass's proposals are forgotten by each draft (its cache cut back to the
    sequence's ids), so the sequences run alone again and still make their greedy tokens."""
    import threading

    import layerfit.engine
    from layerfit.schedule.decoding.batching import DecodeLoop, Finish, Sequence
    from layerfit.schedule.decoding.draft import Drafter
    from layerfit.schedule.decoding.sampling import Sampling
    from layerfit.schedule.ledger import MemoryLedger

    repo = hf_folder.parent / "repo"
    prompts = [PROMPTS[0], [7, 63, 8], PROMPTS[2]]
    made: list[list[int]] = [[] for _ in prompts]
    errors: list[BaseException | None] = [None] * len(prompts)
    done = [threading.Event() for _ in prompts]

    def sink(i: int):
        def on_token(token: int | None, finish: Finish | None, error: BaseException | None) -> None:
            if token is not None:
                made[i].append(token)
            else:
                errors[i] = error
                done[i].set()
        return on_token

    with layerfit.engine.load(repo / "lm", pipeline="async") as engine:
        draft_engine = layerfit.engine.load(repo / "small", pipeline="preload")
        ledger = MemoryLedger(10**8)
        loop = DecodeLoop("lm", engine, ledger, max_waiting=8,
                          drafter=Drafter("small", draft_engine, draft_engine.memory.weight_bytes, 3))
        verify = loop.step.verify_run

        def poisoned(rows: list) -> tuple:
            if len(rows) > 1 and any(63 in row.feed for row in rows):
                raise RuntimeError("a sequence this pass cannot take")
            if any(63 in row.feed for row in rows):
                raise RuntimeError("alone, it still fails")
            return verify(rows)

        loop.step.verify_run = poisoned  # type: ignore[method-assign]
        try:
            with ledger.condition:  # all three join the first step
                for i, prompt in enumerate(prompts):
                    loop.submit(Sequence(prompt, 12, Sampling(), frozenset({1}), sink(i), draft=True))
            assert all(event.wait(60) for event in done)
            assert loop.stats()["draft_passes"] > 0
        finally:
            loop.close()
    assert isinstance(errors[1], RuntimeError) and made[1] == []
    for i in (0, 2):
        assert errors[i] is None and made[i] == reference_tokens(hf_folder, prompts[i], 12)
