"""Generation over HTTP with the clients people have: Triton's generate extension and the
OpenAI routes (the ``openai`` client), against a real server on a loopback port.

Greedy text equals transformers' own ``generate`` on the same checkpoint; seeded
sampling repeats; stop strings, max_tokens and usage are the APIs'; bad input is refused
with the status and the field or reason."""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tritonclient.http as triton
from generate_helpers import make_repository, reference_tokens, word_tokenizer
from serve_helpers import settings, wait_until

from layerfit.serve.server import ServerThread

openai = pytest.importorskip("openai")  # the test extra has it; the compatibility legs do not

pytestmark = pytest.mark.timeout(120)

PROMPT = "w3 w8 w13 w21 w34"


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repository(tmp_path_factory.mktemp("generate"))


@pytest.fixture(scope="module")
def server(hf_folder: Path) -> Iterator[ServerThread]:
    with ServerThread(settings(hf_folder.parent / "repo", memory_budget="4MB", request_memory="4MB")) as running:
        yield running


@pytest.fixture()
def client(server: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def expected_text(hf_folder: Path, prompt: str, n: int) -> str:
    tokenizer = word_tokenizer()
    return tokenizer.decode(reference_tokens(hf_folder, tokenizer(prompt)["input_ids"], n), skip_special_tokens=True)


def loop_stats(server: ServerThread) -> dict[str, int]:
    return server.built.runtime.decoding_stats("lm")


def test_triton_generate_gives_transformers_greedy_text(server: ServerThread, hf_folder: Path):
    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    assert client.is_model_ready("lm")
    r = httpx.post(f"{server.url}/v2/models/lm/generate", json={"text_input": PROMPT, "max_tokens": 8})
    assert r.status_code == 200, r.text
    assert r.json() == {"model_name": "lm", "model_version": "1", "text_output": expected_text(hf_folder, PROMPT, 8)}
    versioned = httpx.post(f"{server.url}/v2/models/lm/versions/1/generate",
                           json={"text_input": PROMPT, "parameters": {"max_tokens": 8, "temperature": 0}})
    assert versioned.json()["text_output"] == r.json()["text_output"]


def test_triton_generate_stream_sends_one_event_per_token(server: ServerThread, hf_folder: Path):
    events = []
    with httpx.stream("POST", f"{server.url}/v2/models/lm/generate_stream",
                      json={"text_input": PROMPT, "max_tokens": 6}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line.removeprefix("data: ")))
    expected = expected_text(hf_folder, PROMPT, 6)
    assert len(events) == len(expected.split())  # a word per token, and no end token here
    assert all(e["model_name"] == "lm" for e in events)
    assert " ".join(e["text_output"].strip() for e in events) == expected


def test_openai_completion_text_usage_and_finish(client: openai.OpenAI, hf_folder: Path):
    done = client.completions.create(model="lm", prompt=PROMPT, max_tokens=8, temperature=0)
    assert done.choices[0].text == expected_text(hf_folder, PROMPT, 8)
    assert done.choices[0].finish_reason == "length"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (5, 8, 13)


def test_openai_streamed_completion_equals_the_whole(client: openai.OpenAI):
    whole = client.completions.create(model="lm", prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text
    chunks = list(client.completions.create(model="lm", prompt=PROMPT, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 8


def test_chat_applies_the_tokenizers_template(client: openai.OpenAI, hf_folder: Path):
    messages = [{"role": "system", "content": "w1 w2"}, {"role": "user", "content": "w5 w9"}]
    templated = word_tokenizer().apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    reply = client.chat.completions.create(model="lm", messages=messages, max_tokens=6, temperature=0)
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == expected_text(hf_folder, templated, 6)
    assert reply.usage.prompt_tokens == len(templated.split())
    streamed = client.chat.completions.create(model="lm", messages=messages, max_tokens=6, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == reply.choices[0].message.content


def test_seeded_sampling_repeats(client: openai.OpenAI):
    def sample(seed: int) -> str:
        return client.completions.create(model="lm", prompt=PROMPT, max_tokens=12, temperature=1.5,
                                         top_p=0.95, seed=seed).choices[0].text

    assert sample(7) == sample(7)
    assert len({sample(s) for s in range(4)}) > 1  # the seed matters


def test_stop_strings_end_the_text_before_them(client: openai.OpenAI, hf_folder: Path):
    words = expected_text(hf_folder, PROMPT, 8).split()
    stop = words[3]
    done = client.completions.create(model="lm", prompt=PROMPT, max_tokens=8, temperature=0, stop=[stop, "w99"])
    cut = " ".join(words).index(stop)
    assert done.choices[0].text == " ".join(words)[:cut]
    assert done.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model="lm", prompt=PROMPT, max_tokens=8, temperature=0, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == done.choices[0].text


def test_models_lists_the_language_models_only(client: openai.OpenAI):
    assert [m.id for m in client.models.list()] == ["lm"]


# --- bad input ---------------------------------------------------------------------------


def test_an_unknown_model_is_404_model_not_found(client: openai.OpenAI, server: ServerThread):
    for create in (lambda: client.completions.create(model="nope", prompt=PROMPT),
                   lambda: client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "w1"}])):
        with pytest.raises(openai.NotFoundError, match="'nope' is not in the repository") as caught:
            create()
        assert (caught.value.type, caught.value.code) == ("invalid_request_error", "model_not_found")
    for route in ("generate", "generate_stream"):
        r = httpx.post(f"{server.url}/v2/models/nope/{route}", json={"text_input": "w1"})
        assert r.status_code == 404 and "'nope' is not in the repository" in r.json()["error"], r.text


def test_a_model_that_cannot_generate_is_400_saying_why(client: openai.OpenAI, server: ServerThread):
    with pytest.raises(openai.BadRequestError, match="chain.*not prepared from a Hugging Face"):
        client.chat.completions.create(model="chain", messages=[{"role": "user", "content": "w1"}])
    r = httpx.post(f"{server.url}/v2/models/chain/generate", json={"text_input": "w1"})
    assert r.status_code == 400 and "cannot generate with 'chain'" in r.json()["error"]


def test_a_prompt_past_the_models_positions_is_413(client: openai.OpenAI, server: ServerThread):
    with pytest.raises(openai.APIStatusError, match="has 64 \\(max_position_embeddings\\)") as caught:
        client.completions.create(model="lm", prompt=" ".join(["w4"] * 60), max_tokens=10)
    assert caught.value.status_code == 413 and caught.value.code == "context_length_exceeded"
    r = httpx.post(f"{server.url}/v2/models/lm/generate", json={"text_input": " ".join(["w4"] * 70)})
    assert r.status_code == 413 and "max_position_embeddings" in r.json()["error"]


@pytest.mark.parametrize(
    ("extra", "field"),
    [({"temperature": "hot"}, "temperature"), ({"n": 2}, "n:"), ({"top_p": 0}, "top_p"),
     ({"max_tokens": 0}, "max_tokens"), ({"best_tokens": 3}, "best_tokens"), ({"seed": -1}, "seed")],
)
def test_malformed_openai_parameters_are_400_naming_the_field(server: ServerThread, extra: dict, field: str):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError, match=field):
        client.completions.create(model="lm", prompt=PROMPT, extra_body=extra)


def test_malformed_triton_parameters_are_400_naming_the_field(server: ServerThread):
    for body, field in [({"text_input": PROMPT, "parameters": {"top_k": -1}}, "top_k"),
                        ({"text_input": 3}, "text_input"), ({"prompt": PROMPT}, "text_input"),
                        ({"text_input": PROMPT, "stop": [1]}, "stop"),
                        ({"text_input": PROMPT, "stop": ["w1"] * 5}, "stop: give at most 4"),
                        ({"text_input": PROMPT, "parameters": {"stop": "w" * 1025}}, "stop: give at most 4")]:
        r = httpx.post(f"{server.url}/v2/models/lm/generate", json=body)
        assert r.status_code == 400 and field in r.json()["error"], (body, r.text)


def test_a_client_leaving_mid_stream_leaves_the_batch_quietly(
    server: ServerThread, client: openai.OpenAI, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.WARNING)
    before = loop_stats(server)
    stream = client.completions.create(model="lm", prompt=PROMPT, max_tokens=55, temperature=0, stream=True)
    next(iter(stream))
    stream.close()
    wait_until(lambda: loop_stats(server)["in_flight"] == 0 and loop_stats(server)["held_bytes"] == 0)
    after = loop_stats(server)
    assert after["cancelled"] == before["cancelled"] + 1  # it left; it did not run to its 55 tokens
    assert server.built.runtime.ledger.used == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert client.completions.create(model="lm", prompt=PROMPT, max_tokens=2, temperature=0).choices[0].text


def test_a_bad_id_is_refused_alone_and_the_request_beside_it_finishes(server: ServerThread, hf_folder: Path):
    # the probe: {"prompt": [-1]} joined the batch of a valid request and failed both (IndexError)
    prompt = [5, 10, 15]
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60,
                      json={"model": "lm", "prompt": prompt, "max_tokens": 40, "temperature": 0, "stream": True}) as good:
        lines = good.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))  # in flight now
        for bad in ([-1], [64], [5, 2**40]):
            r = httpx.post(f"{server.url}/v1/completions", json={"model": "lm", "prompt": bad, "max_tokens": 4})
            assert r.status_code == 400 and "the vocabulary of 'lm' has ids 0-63" in r.json()["error"]["message"], r.text
        events = [first, *(line for line in lines if line.startswith("data: "))]
    assert events[-1] == "data: [DONE]", events[-2:]
    text = "".join(json.loads(e.removeprefix("data: "))["choices"][0]["text"] for e in events[:-1])
    expected = word_tokenizer().decode(reference_tokens(hf_folder, prompt, 40), skip_special_tokens=True)
    assert text == expected


def test_a_vanishing_temperature_is_greedy_not_nan(client: openai.OpenAI, hf_folder: Path):
    # the probe: temperature 1e-300 made the probabilities inf/NaN and the request (and its batch) fail
    done = client.completions.create(model="lm", prompt=PROMPT, max_tokens=8, temperature=1e-300, seed=3)
    assert done.choices[0].text == expected_text(hf_folder, PROMPT, 8)


BROKEN_TOKENIZERS = {  # the probe's three, and one that is JSON but not a tokenizer transformers loads
    "notjson": ("tokenizer_config.json", "{this is not JSON", "tokenizer_config.json is not valid JSON"),
    "automap": ("tokenizer_config.json", json.dumps({"auto_map": {"AutoTokenizer": ["tok.Mine", None]},
                                                     "tokenizer_class": "Mine"}), "auto_map"),
    "nested": ("tokenizer.json", "[" * 100_000, "tokenizer.json is not valid JSON: it nests"),
    "schema": ("tokenizer.json", json.dumps({"model": {"type": "Nope"}}), "its tokenizer does not load"),
}


def test_a_broken_tokenizer_is_a_503_saying_why_never_a_500_or_a_traceback(
    hf_folder: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    repo = tmp_path / "repo"
    for name, (file, text, _) in BROKEN_TOKENIZERS.items():
        shutil.copytree(hf_folder.parent / "repo" / "lm", repo / name)
        (repo / name / file).write_text(text)
    caplog.set_level(logging.WARNING)
    with ServerThread(settings(repo, request_memory="4MB")) as running:
        index = {row["name"]: row for row in httpx.post(f"{running.url}/v2/repository/index").json()}
        for name, (_, _, why) in BROKEN_TOKENIZERS.items():
            if name != "schema":  # checked when the model loads: it is not served at all
                assert index[name]["state"] == "UNAVAILABLE" and why in index[name]["reason"], index[name]
            r = httpx.post(f"{running.url}/v2/models/{name}/generate", json={"text_input": "w1"})
            assert r.status_code == 503 and why in r.json()["error"], r.text
            r = httpx.post(f"{running.url}/v1/completions", json={"model": name, "prompt": "w1"})
            assert r.status_code == 503 and why in r.json()["error"]["message"], r.text
            assert "\n" not in r.json()["error"]["message"]
        metrics = httpx.get(f"{running.url}/metrics").text
    assert 'status="500"' not in metrics
    assert "Traceback" not in caplog.text and not [r for r in caplog.records if r.exc_info], caplog.text


def test_a_streaming_completion_holds_its_prompt_not_the_work_of_tokenizing_it(server: ServerThread):
    from layerfit.serve.generate_body import TOKENIZING_BYTES_PER_BYTE

    requests = server.built.dataplane.requests
    assert requests.in_use == 0
    text = " ".join(["w5"] * 40)
    with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60,
                      json={"model": "lm", "prompt": text, "max_tokens": 20, "stream": True}) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        held = requests.in_use
        assert 0 < held < TOKENIZING_BYTES_PER_BYTE * len(text)  # its parsed body and its 40 ids
        assert requests.peak >= TOKENIZING_BYTES_PER_BYTE * len(text)  # reserved while it was tokenized
        rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"
    wait_until(lambda: requests.in_use == 0)
