"""``layerfit generate``: a prepared language model's own ``generate`` from the command
line, its tokens bit for bit the model's (greedy, and sampling from the same seed), its
tokenizer the folder's own or ``--tokenizer``'s (a word-level one built here: nothing is
downloaded), and every bad input one line with exit status 2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import tinymodels
import torch

from layerfit.cli import main
from layerfit.store import prepare

MODELS = ("tiny_llama", "tiny_gpt2")
PROMPT_IDS = [44, 17, 83, 9, 61, 30]  # word w{id - 4} of the tokenizer below; no eos in 8 greedy tokens
PROMPT = " ".join(f"w{i - 4}" for i in PROMPT_IDS)
NEW = 6
SAMPLING = ["--do-sample", "--top-k", "20", "--temperature", "0.8"]


def _tokenizer():
    """A word-level tokenizer of the models' 100 ids: 4 special tokens, then w0 ... w95."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3, **{f"w{i}": i + 4 for i in range(96)}}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=words, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Each model prepared bare (``NAME``) and with the tokenizer saved in it
    (``NAME+tok``); the tokenizer alone (``tokenizer``); a CNN (``cnn``)."""
    root = tmp_path_factory.mktemp("generate")
    tokenizer = _tokenizer()
    made = {"tokenizer": root / "tokenizer", "cnn": root / "cnn"}
    tokenizer.save_pretrained(made["tokenizer"])
    prepare("tinymodels:tiny_cnn", made["cnn"], input_shape=(1, 3, 16, 16))
    for name in MODELS:
        made[name] = root / name
        prepare(f"tinymodels:{name}", made[name], input_shape=(1, 8), input_dtype="int64")
        made[f"{name}+tok"] = root / f"{name}+tok"
        shutil.copytree(made[name], made[f"{name}+tok"])
        tokenizer.save_pretrained(made[f"{name}+tok"])
    return made


def _expected(name: str, new: int = NEW, seed: int | None = None, **options) -> list[int]:
    """The new tokens of the model's own ``generate`` on the prompt."""
    model = getattr(tinymodels, name)()
    if seed is not None:
        torch.manual_seed(seed)
    out = model.generate(torch.tensor([PROMPT_IDS]), max_new_tokens=new, **options)
    return out[0, len(PROMPT_IDS):].tolist()


def _ids() -> list[str]:
    return ["--ids", ",".join(map(str, PROMPT_IDS))]


def _generate(capsys, *args: str) -> tuple[str, str]:
    assert main(["generate", *map(str, args)]) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    return captured.out, captured.err


@pytest.mark.parametrize("name", MODELS)
def test_greedy_tokens_are_the_models_own_while_streaming(folders, capsys, name: str) -> None:
    out, err = _generate(capsys, folders[name], *_ids(), "--max-new-tokens", NEW, "--budget", "50%", "--pipeline", "async")
    assert [int(t) for t in out.split()] == _expected(name, do_sample=False)  # no tokenizer: ids
    assert f"prompt {len(PROMPT_IDS)} tokens" in err and "budget" in err and "async" in err


@pytest.mark.parametrize("name", MODELS)
def test_a_text_prompt_reads_the_folders_tokenizer_or_the_one_given(folders, capsys, name: str) -> None:
    text = _tokenizer().decode(_expected(name, do_sample=False), skip_special_tokens=True)
    assert len(text.split()) == NEW
    out, _ = _generate(capsys, folders[f"{name}+tok"], "--prompt", PROMPT, "--max-new-tokens", NEW)
    assert out == text + "\n"
    out, _ = _generate(capsys, folders[name], "--prompt", PROMPT, "--tokenizer", folders["tokenizer"], "--max-new-tokens", NEW)
    assert out == text + "\n"


@pytest.mark.parametrize("name", MODELS)
def test_seeded_sampling_repeats_and_is_the_models_own(folders, capsys, name: str) -> None:
    runs = [_generate(capsys, folders[name], *_ids(), "--max-new-tokens", NEW, *SAMPLING, "--seed", 7)[0] for _ in range(2)]
    assert runs[0] == runs[1]
    assert [int(t) for t in runs[0].split()] == _expected(name, seed=7, do_sample=True, top_k=20, temperature=0.8)
    other = _generate(capsys, folders[name], *_ids(), "--max-new-tokens", NEW, *SAMPLING, "--seed", 8)[0]
    assert [int(t) for t in other.split()] == _expected(name, seed=8, do_sample=True, top_k=20, temperature=0.8)


def test_json_holds_the_tokens_text_timings_and_weights(folders, capsys) -> None:
    out, err = _generate(
        capsys, folders["tiny_llama+tok"], "--prompt", PROMPT, "--max-new-tokens", NEW, "--budget", "50%", "--json"
    )
    report = json.loads(out)
    expected = _expected("tiny_llama", do_sample=False)
    assert report["token_ids"] == expected and report["new_tokens"] == len(expected) == NEW
    assert report["text"] == _tokenizer().decode(expected, skip_special_tokens=True)
    assert report["prompt"] == PROMPT and report["prompt_ids"] == PROMPT_IDS
    assert report["prompt_tokens"] == len(PROMPT_IDS)
    assert report["prompt_latency_s"] > 0 and report["decode_tokens_per_s"] > 0
    assert 0 < report["weights_peak_bytes"] <= report["budget_bytes"] < report["weights_total_bytes"]
    assert report["pipeline"] == "async" and report["pipeline_requested"] == "auto"
    assert report["generation"] == {
        "max_new_tokens": NEW, "do_sample": False, "temperature": None, "top_k": None, "top_p": None, "seed": None,
    }
    assert err == ""


def test_the_folders_generation_config_gives_the_defaults_and_flags_override_it(folders, capsys, tmp_path) -> None:
    greedy = _expected("tiny_llama", new=8, do_sample=False)
    folder = tmp_path / "with-config"
    shutil.copytree(folders["tiny_llama"], folder)
    # sampling and 2 tokens by default, and the third greedy token ends the text
    (folder / "generation_config.json").write_text(
        json.dumps({"do_sample": True, "temperature": 0.5, "max_new_tokens": 2, "eos_token_id": greedy[2]})
    )
    out, _ = _generate(capsys, folder, *_ids(), "--max-new-tokens", 8, "--json")
    assert json.loads(out)["token_ids"] == greedy[:3]  # greedy, not sampled; 8 allowed; stopped by its eos


BAD = {
    "no tokenizer": (["tiny_llama", "--prompt", PROMPT], "pass --tokenizer FOLDER, or give the prompt as token ids with --ids"),
    "too long": (["tiny_gpt2", "--ids", "5,6,7,8,9,10,11,12,13,14", "--max-new-tokens", "7"], "10 tokens and --max-new-tokens 7 make 17 positions; the model has 16 (n_positions)"),
    "prompt alone too long": (["tiny_gpt2", "--ids", ",".join(["5"] * 17)], "the prompt has 17 tokens; the model has 16 positions"),
    "no generate": (["cnn", "--ids", "1,2"], "(TinyCNN), not a language model (it has no Hugging Face generate method)"),
    # issue 52: a text prompt on a CNN said "needs a tokenizer"; what the model is comes first
    "text prompt on a cnn": (["cnn", "--prompt", "hi"], "(TinyCNN), not a language model"),
    "negative tokens": (["tiny_llama", "--ids", "5", "--max-new-tokens", "-1"], "--max-new-tokens must be 1 or more, not -1"),
    "zero temperature": (["tiny_llama", "--ids", "5", "--do-sample", "--temperature", "0"], "--temperature must be above 0"),
    "negative temperature": (["tiny_llama", "--ids", "5", "--do-sample", "--temperature", "-1"], "--temperature must be above 0"),
    "top-p zero": (["tiny_llama", "--ids", "5", "--do-sample", "--top-p", "0"], "--top-p must be in (0, 1]"),
    "top-p above one": (["tiny_llama", "--ids", "5", "--do-sample", "--top-p", "1.5"], "--top-p must be in (0, 1]"),
    "sampling setting without sampling": (["tiny_llama", "--ids", "5", "--temperature", "0.7"], "add --do-sample"),
    "both prompts": (["tiny_llama", "--ids", "5", "--prompt", "w1"], "one of the two"),
    "no prompt": (["tiny_llama"], "give the prompt as --prompt TEXT or as token ids"),
    "unreadable ids": (["tiny_llama", "--ids", "5,x"], "cannot read --ids"),
    "id beyond the vocabulary": (["tiny_llama", "--ids", "5,100"], "token id 100; the model's vocabulary has ids 0-99"),
    "tokenizer not a tokenizer": (["tiny_llama", "--prompt", "w1", "--tokenizer", "cnn"], "is not a folder of tokenizer files"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_and_status_2(folders, capsys, case: str) -> None:
    args, needle = BAD[case]
    args = [str(folders.get(a, a)) if i == 0 or a == "cnn" else a for i, a in enumerate(args)]
    assert main(["generate", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert err.startswith("error:") and "Traceback" not in err and "\n" not in err, err
    assert needle in err, err
