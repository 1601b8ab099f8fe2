"""``layerfit generate`` as users drive it (issue 56): a chat made by the folder's own chat
template (ids equal to transformers' ``apply_chat_template``), several tokens per pass
(``--prompt-lookup``, ``--draft``) with greedy tokens equal to plain decoding and fewer
passes, the count rule (the end token the model made counts), and every bad input one
line with exit status 2."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import tinymodels
import torch

from layerfit.cli import main
from layerfit.errors import InputError
from layerfit.schedule.decoding.rules import Speculation
from layerfit.store import prepare

PROMPT_IDS = [44, 17, 83, 9, 61, 30]
NEW = 24  # tiny_llama's greedy text from PROMPT_IDS repeats itself: lookup's guesses are taken
TEMPLATE = (
    "{% for m in messages %}<s> {{ m['role'] }} {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s> assistant\n{% endif %}"
)
MESSAGES = [{"role": "system", "content": "w3 w4"}, {"role": "user", "content": "w1 w2"}]


def _chat_tokenizer(template: str | None = TEMPLATE):
    """A word-level tokenizer of tiny_llama's 100 ids whose spaces and newlines are tokens
    (a lost trailing newline changes the ids), with ``template`` as its chat template."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3, " ": 4, "\n": 5, "system": 6, "user": 7, "assistant": 8,
             **{f"w{i}": i + 9 for i in range(91)}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Split(Regex(r"[ \n]"), behavior="isolated")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=words, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    tokenizer.chat_template = template
    return tokenizer


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """tiny_llama prepared bare (``llama``), with a chat tokenizer saved in it (``chat``),
    with a tokenizer of no template (``no-template``); a second copy as a draft (``draft``)."""
    root = tmp_path_factory.mktemp("chat")
    made = {name: root / name for name in ("llama", "chat", "no-template", "draft")}
    prepare("tinymodels:tiny_llama", made["llama"], input_shape=(1, 8), input_dtype="int64")
    for name in ("chat", "no-template", "draft"):
        shutil.copytree(made["llama"], made[name])
    _chat_tokenizer().save_pretrained(made["chat"])
    _chat_tokenizer(None).save_pretrained(made["no-template"])
    return made


def _run(capsys, *args: object) -> dict:
    assert main(["generate", *map(str, args), "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _counted_model():
    """tiny_llama itself, counting its forward passes (``model.calls``)."""
    model = tinymodels.tiny_llama()
    model.calls = 0
    forward = model.forward

    def counted(*args, **kwargs):
        model.calls += 1
        return forward(*args, **kwargs)

    model.forward = counted
    return model


def _expected(prompt: list[int], new: int = NEW, **options) -> tuple[list[int], int]:
    """The model's own new tokens from ``prompt`` and the forward passes they took."""
    model = _counted_model()
    out = model.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False, **options)
    return out[0, len(prompt):].tolist(), model.calls


def test_chat_ids_are_transformers_own_and_the_tokens_the_models(folders, capsys, tmp_path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folders["chat"], local_files_only=True)
    expected_ids = list(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False))
    assert expected_ids[-2:] == [8, 5]  # "assistant\n": the template's trailing newline is a token
    report = _run(capsys, folders["chat"], "--chat", "--system", "w3 w4", "--prompt", "w1 w2", "--max-new-tokens", 6)
    assert report["prompt_ids"] == expected_ids and report["messages"] == MESSAGES
    assert report["token_ids"] == _expected(expected_ids, 6)[0]
    file = tmp_path / "messages.json"
    file.write_text(json.dumps(MESSAGES))
    from_file = _run(capsys, folders["chat"], "--messages", file, "--max-new-tokens", 6)
    assert from_file["prompt_ids"] == expected_ids and from_file["token_ids"] == report["token_ids"]
    user_only = _run(capsys, folders["chat"], "--chat", "--prompt", "w1 w2", "--max-new-tokens", 1)
    assert user_only["prompt_ids"] == list(tokenizer.apply_chat_template(
        MESSAGES[1:], add_generation_prompt=True, tokenize=True, return_dict=False))


def test_prompt_lookup_keeps_greedy_tokens_in_transformers_own_fewer_passes(folders, capsys) -> None:
    plain_tokens, plain_passes = _expected(PROMPT_IDS)
    lookup_tokens, lookup_passes = _expected(PROMPT_IDS, prompt_lookup_num_tokens=8)
    assert lookup_tokens == plain_tokens and plain_passes == NEW and lookup_passes < NEW  # the premise
    ids = ",".join(map(str, PROMPT_IDS))
    plain = _run(capsys, folders["llama"], "--ids", ids, "--max-new-tokens", NEW, "--budget", "50%")
    assert plain["token_ids"] == plain_tokens and plain["passes"] == NEW and plain["tokens_per_pass"] == 1.0
    report = _run(capsys, folders["llama"], "--ids", ids, "--max-new-tokens", NEW, "--budget", "50%", "--prompt-lookup", 8)
    assert report["token_ids"] == plain_tokens and report["new_tokens"] == NEW
    assert report["passes"] == lookup_passes and report["tokens_per_pass"] == NEW / lookup_passes
    assert report["prompt_lookup"] == 8 and report["draft"] is None


def test_a_draft_keeps_greedy_tokens_cuts_passes_and_counts_in_the_budget(folders, capsys) -> None:
    from layerfit.engine import load

    with load(folders["draft"], pipeline="preload") as draft:
        draft_bytes = draft.memory.weight_bytes
    plain_tokens, _ = _expected(PROMPT_IDS)
    ids = ",".join(map(str, PROMPT_IDS))
    budget = draft_bytes + draft_bytes // 2  # the model is the draft's size: half of it is left for the model
    report = _run(capsys, folders["llama"], "--ids", ids, "--max-new-tokens", NEW, "--draft", folders["draft"],
                  "--budget", budget)
    assert report["token_ids"] == plain_tokens  # the draft is the model itself: every guess is right
    assert report["passes"] < NEW and report["tokens_per_pass"] > 1
    assert report["draft"]["weights_bytes"] == draft_bytes and report["draft"]["passes"] > 0
    assert report["budget_bytes"] == budget - draft_bytes  # the draft's bytes came out of the budget
    assert report["weights_peak_bytes"] <= report["budget_bytes"]


def test_the_end_token_the_model_made_counts_in_every_mode(folders, capsys, tmp_path) -> None:
    plain_tokens, _ = _expected(PROMPT_IDS, 8)
    folder = tmp_path / "ends"
    shutil.copytree(folders["llama"], folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": plain_tokens[2]}))
    ids = ",".join(map(str, PROMPT_IDS))
    for extra in ([], ["--prompt-lookup", "4"], ["--draft", folders["draft"]]):
        report = _run(capsys, folder, "--ids", ids, "--max-new-tokens", 8, *extra)
        assert report["token_ids"] == plain_tokens[:3] and report["new_tokens"] == 3 and report["ended"], extra
    assert report["passes"] <= 3
    assert main(["generate", str(folder), "--ids", ids, "--max-new-tokens", "8"]) == 0
    assert "3 new (the last the end token) in 3 passes" in capsys.readouterr().err


def test_sampling_with_prompt_lookup_repeats_with_its_seed(folders, capsys) -> None:
    args = [folders["llama"], "--ids", ",".join(map(str, PROMPT_IDS)), "--max-new-tokens", 12, "--do-sample",
            "--top-k", 20, "--seed", 3, "--prompt-lookup", 4]
    assert _run(capsys, *args)["token_ids"] == _run(capsys, *args)["token_ids"]


def _bad_files(tmp_path: Path) -> dict[str, Path]:
    """Messages files each wrong in one way."""
    files = {name: tmp_path / f"{name}.json" for name in ("not-json", "bad-role", "no-list", "large")}
    files["not-json"].write_text("[{")
    files["bad-role"].write_text(json.dumps([{"role": "robot", "content": "w1"}]))
    files["no-list"].write_text(json.dumps({"role": "user", "content": "w1"}))
    files["large"].write_text(" " * (4 * 2**20 + 1))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text(json.dumps(MESSAGES))
    inside = tmp_path / "inside"
    inside.mkdir()
    os.symlink(outside / "secret.json", inside / "link.json")
    files["link-out"] = inside / "link.json"
    return files


BAD = {
    "no template": (["no-template", "--chat", "--prompt", "w1"], "tokenizer has no chat template"),
    "chat with ids": (["chat", "--chat", "--ids", "5,6"], "--chat makes a chat of text with the chat template"),
    "system without chat": (["chat", "--system", "w1", "--prompt", "w2"], "--system is a chat's system message: add --chat"),
    "system with messages": (["chat", "--system", "w1", "--messages", "bad-role"], "put the system message in the messages file"),
    "messages and prompt": (["chat", "--messages", "bad-role", "--prompt", "w1"], "not --prompt and --messages together"),
    "chat without tokenizer": (["llama", "--chat", "--prompt", "w1"], "--chat needs a tokenizer and"),
    "not json": (["chat", "--messages", "not-json"], "is not valid JSON"),
    "bad role": (["chat", "--messages", "bad-role"], "message 1 has role 'robot'"),
    "not a list": (["chat", "--messages", "no-list"], "must be a non-empty list"),
    "too large": (["chat", "--messages", "large"], "more than the 4,194,304 it may have"),
    "link out of its folder": (["chat", "--messages", "link-out"], "outside the folder"),
    "missing file": (["chat", "--messages", "missing"], "cannot read"),
    "lookup and draft": (["llama", "--ids", "5", "--prompt-lookup", "4", "--draft", "draft"], "two ways to guess tokens: give one"),
    "lookup zero": (["llama", "--ids", "5", "--prompt-lookup", "0"], "--prompt-lookup must be a number of tokens from 1 to 64"),
    "draft missing": (["llama", "--ids", "5", "--draft", "missing"], "--draft "),
    "budget below the draft": (["llama", "--ids", "5", "--draft", "draft", "--budget", "1KB"], "cannot hold both the draft"),
    "beams": (["beams", "--ids", "5", "--prompt-lookup", "4"], "asks for beam search (num_beams 2)"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_and_status_2(folders, capsys, tmp_path, case: str) -> None:
    beams = tmp_path / "beams"
    shutil.copytree(folders["llama"], beams)
    (beams / "generation_config.json").write_text(json.dumps({"num_beams": 2}))
    named = {**folders, **_bad_files(tmp_path), "beams": beams, "missing": tmp_path / "missing"}
    args, needle = BAD[case]
    assert main(["generate", *(str(named.get(a, a)) for a in args)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert err.startswith("error:") and "Traceback" not in err and "\n" not in err, err
    assert needle in err, err


def test_a_draft_of_another_vocabulary_is_refused() -> None:
    from layerfit.cli.speculation import check

    def engine(rows: int) -> SimpleNamespace:
        embedding = SimpleNamespace(num_embeddings=rows)
        return SimpleNamespace(model=SimpleNamespace(get_input_embeddings=lambda: embedding), directory="d")

    config = SimpleNamespace(num_beams=1, num_return_sequences=1)
    check(engine(100), engine(100), config, Speculation(draft="d"))
    with pytest.raises(InputError, match="--draft d has a vocabulary of 50 ids and the model 100"):
        check(engine(100), engine(50), config, Speculation(draft="d"))


def test_a_memory_limit_reserves_the_drafts_kv_cache_beside_the_models(folders, capsys) -> None:
    """Under ``--memory-limit`` the draft's KV cache grows with the model's positions (the
    prompt and every new token): the limit reserves it beside the model's, so the weights
    get the room neither cache takes. The tokens are the model's own either way."""
    from layerfit.engine import load
    from layerfit.engine.fit_memory import kv_bytes_per_position
    from layerfit.memory_limit import machine_memory_bytes

    with load(folders["llama"], pipeline="preload") as model, load(folders["draft"], pipeline="preload") as draft:
        per_position, draft_per_position = kv_bytes_per_position(model), kv_bytes_per_position(draft)
    assert per_position > 0 and draft_per_position > 0
    ids, limit = ",".join(map(str, PROMPT_IDS)), f"{machine_memory_bytes() // 2}B"
    positions = len(PROMPT_IDS) + NEW
    plain = _run(capsys, folders["llama"], "--ids", ids, "--max-new-tokens", NEW, "--memory-limit", limit)
    drafted = _run(capsys, folders["llama"], "--ids", ids, "--max-new-tokens", NEW, "--memory-limit", limit,
                   "--draft", folders["draft"])
    assert plain["memory_limit"]["kv_reserved_bytes"] == positions * per_position
    assert drafted["memory_limit"]["kv_reserved_bytes"] == positions * (per_position + draft_per_position)
    assert drafted["token_ids"] == plain["token_ids"] == _expected(PROMPT_IDS)[0]
