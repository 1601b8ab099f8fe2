"""Prompt lookup inside continuous batching: greedy sequences propose tokens from their own
n-grams and a shared pass verifies them, so they take fewer passes and still make
transformers' own greedy tokens, beside sequences that do not speculate; usage counts the
end token the model made, as the command line does."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import torch
import transformers
from generate_helpers import CONFIG, make_repository, reference_tokens, word_tokenizer, words
from generate_helpers import decoding_stats as stats
from serve_helpers import settings

import layerfit.engine
from layerfit.cli import main
from layerfit.schedule.decoding.batching import DecodeLoop, Finish, Sequence
from layerfit.schedule.decoding.sampling import Sampling
from layerfit.schedule.ledger import MemoryLedger
from layerfit.serve.server import ServerThread
from layerfit.store import prepare

openai = pytest.importorskip("openai")  # the test extra has it; the compatibility legs do not

pytestmark = pytest.mark.timeout(180)

# The seeded model's greedy tokens fall into cycles a lookup can guess (and the prompts
# differ in length, so the rows of a step are padded differently)
PROMPTS = [[5, 10, 15, 23, 36], [7, 8], [9, 11, 13, 4, 6, 8, 10, 12, 14], [42], [20, 21, 22, 20, 21, 22, 20, 21]]
TOKENS = 30
END = 18  # the end token of ``lm_end``: its greedy reply to "w5 w6" is w47 w18 and then this


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``lm`` (and ``chain``), and ``lm_end``: the same weights with end token 18."""
    folder = make_repository(tmp_path_factory.mktemp("lookup"))
    ending = folder.parent / "hf-llama-end"
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**CONFIG, "eos_token_id": END})).save_pretrained(ending)
    word_tokenizer().save_pretrained(ending)
    prepare("hf:" + str(ending), folder.parent / "repo" / "lm_end")
    return folder


@pytest.fixture(scope="module")
def server(hf_folder: Path) -> Iterator[ServerThread]:
    with ServerThread(settings(hf_folder.parent / "repo", request_memory="4MB", prompt_lookup=["lm_end=4"])) as running:
        yield running


def test_the_loop_verifies_proposals_in_shared_passes_and_makes_plain_greedy_tokens(hf_folder: Path):
    done = {i: threading.Event() for i in range(len(PROMPTS))}
    made: dict[int, list[int]] = {i: [] for i in done}

    def sink(i: int):
        def on_token(token: int | None, finish: Finish | None, error: BaseException | None) -> None:
            assert error is None
            made[i].append(token) if token is not None else done[i].set()
        return on_token

    with layerfit.engine.load(hf_folder.parent / "repo" / "lm", pipeline="async") as engine:
        ledger = MemoryLedger(10**8)
        loop = DecodeLoop("lm", engine, ledger, max_waiting=8)
        try:
            with ledger.condition:  # all join the first step: every pass mixes the two kinds
                for i, prompt in enumerate(PROMPTS):
                    loop.submit(Sequence(prompt, TOKENS, Sampling(), frozenset({1}), sink(i), lookup=8 * (i % 2)))
            assert all(event.wait(60) for event in done.values())
            stats = loop.stats()
        finally:
            loop.close()
    for i, prompt in enumerate(PROMPTS):
        assert made[i] == reference_tokens(hf_folder, prompt, TOKENS), i
    assert stats["most_in_flight"] == len(PROMPTS)
    assert stats["accepted"] > 0 and stats["sequence_steps"] == len(PROMPTS) * TOKENS
    # those without lookup took a pass per token; the others rode along and finished sooner
    assert stats["steps"] == TOKENS


def test_concurrent_openai_requests_with_and_without_lookup_equal_transformers_greedy(
    server: ServerThread, hf_folder: Path
):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    before = stats(server)

    def complete(i: int) -> tuple[str, int]:
        lookup = {"prompt_lookup": 8} if i % 2 == 0 else {}
        done = client.completions.create(model="lm", prompt=PROMPTS[i], max_tokens=TOKENS, temperature=0,
                                         extra_body=lookup)
        return done.choices[0].text, done.usage.completion_tokens

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(complete, range(len(PROMPTS))))
    for prompt, (text, count) in zip(PROMPTS, results, strict=True):
        assert text == words(reference_tokens(hf_folder, prompt, TOKENS))
        assert count == TOKENS
    after = stats(server)
    assert after["accepted"] > before["accepted"]
    assert after["sequence_steps"] - before["sequence_steps"] == len(PROMPTS) * TOKENS
    metrics = httpx.get(server.url + "/metrics").text
    assert f'layerfit_decode_passes_total{{model="lm"}} {float(after["steps"])}' in metrics
    assert f'layerfit_decode_accepted_tokens_total{{model="lm"}} {float(after["accepted"])}' in metrics


def test_lookup_alone_cuts_passes_over_triton_and_chat(server: ServerThread, hf_folder: Path):
    prompt = PROMPTS[1]
    expected = words(reference_tokens(hf_folder, prompt, TOKENS))
    text = words(prompt)
    before = stats(server)
    r = httpx.post(f"{server.url}/v2/models/lm/generate", json={"text_input": text, "max_tokens": TOKENS,
                                                                 "parameters": {"prompt_lookup": 8}}, timeout=60)
    assert r.status_code == 200 and r.json()["text_output"] == expected
    after = stats(server)
    assert after["steps"] - before["steps"] < TOKENS / 2  # a cycle of three, guessed whole
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    chat = [{"role": "user", "content": "w1 w2"}]
    plain = client.chat.completions.create(model="lm", messages=chat, max_tokens=TOKENS, temperature=0)
    looked = client.chat.completions.create(model="lm", messages=chat, max_tokens=TOKENS, temperature=0,
                                            extra_body={"prompt_lookup": 6})
    assert looked.choices[0].message.content == plain.choices[0].message.content
    assert looked.usage == plain.usage


def test_a_stop_string_ends_the_text_and_the_count_where_it_does_without_lookup(server: ServerThread):
    # several tokens verified in one step: those after the stop string's are made but not counted
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    stop = "w8 w4 w22 w8 w4"  # inside the cycle w4 w22 w8 that lookup guesses whole
    answers = [client.completions.create(model="lm", prompt=PROMPTS[3], max_tokens=TOKENS, temperature=0,
                                         stop=[stop], extra_body={"prompt_lookup": n}) for n in (0, 8)]
    text = answers[0].choices[0].text
    assert answers[1].choices[0].text == text and len(text.split()) == 12  # cut before the stop string
    assert answers[0].usage == answers[1].usage and answers[0].usage.completion_tokens == 12 + 5


def test_sampled_requests_and_lookup_zero_do_not_speculate(server: ServerThread):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    before = stats(server)
    client.completions.create(model="lm", prompt=PROMPTS[1], max_tokens=TOKENS, temperature=1, seed=3,
                              extra_body={"prompt_lookup": 8})
    client.completions.create(model="lm_end", prompt=PROMPTS[1], max_tokens=TOKENS, temperature=0,
                              extra_body={"prompt_lookup": 0})  # over the server's lm_end=4
    after = stats(server)
    assert after["proposed"] == before["proposed"]
    assert after["steps"] - before["steps"] == TOKENS  # one token a pass


@pytest.mark.parametrize("value", [-1, 65, "8", 2.5, True])
def test_a_bad_prompt_lookup_is_a_one_line_400_naming_the_field(server: ServerThread, value: object):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="prompt_lookup") as caught:
        client.completions.create(model="lm", prompt="w1", extra_body={"prompt_lookup": value})
    assert "\n" not in caught.value.body["message"]
    r = httpx.post(f"{server.url}/v2/models/lm/generate", json={"text_input": "w1", "prompt_lookup": value})
    assert r.status_code == 400 and "prompt_lookup" in r.json()["error"] and "\n" not in r.json()["error"]


def test_usage_counts_the_end_token_as_the_command_line_does(server: ServerThread, hf_folder: Path, capsys):
    repo = hf_folder.parent / "repo"
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    done = client.completions.create(model="lm_end", prompt="w5 w6", max_tokens=16, temperature=0)
    assert (done.choices[0].text, done.choices[0].finish_reason) == ("w47 w18", "stop")
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (2, 3)  # w47, w18 and the end token
    streamed = list(client.completions.create(model="lm_end", prompt="w5 w6", max_tokens=16, temperature=0,
                                              stream=True, stream_options={"include_usage": True}))
    assert streamed[-1].usage.completion_tokens == 3
    assert main(["generate", str(repo / "lm_end"), "--prompt", "w5 w6", "--max-new-tokens", "16", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["new_tokens"] == done.usage.completion_tokens


def test_the_servers_setting_for_a_model_is_its_requests_default(server: ServerThread, hf_folder: Path):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    before = stats(server, "lm_end")
    done = client.completions.create(model="lm_end", prompt=PROMPTS[3], max_tokens=20, temperature=0)
    assert done.choices[0].text == words(reference_tokens(hf_folder, PROMPTS[3], 20))  # no end token in them
    after = stats(server, "lm_end")
    assert after["proposed"] > before["proposed"]  # --prompt-lookup lm_end=4
    assert after["steps"] - before["steps"] < 20


def test_the_python_api_takes_prompt_lookup_too(server: ServerThread, hf_folder: Path):
    assert server.built is not None
    before = stats(server)
    tokens = server.built.runtime.generate("lm", PROMPTS[1], TOKENS, prompt_lookup=8)
    assert tokens == reference_tokens(hf_folder, PROMPTS[1], TOKENS)
    assert stats(server)["steps"] - before["steps"] < TOKENS / 2
