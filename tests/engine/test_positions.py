"""An input longer than a text model's positions is refused in one line, the same by the
Python API (``layerfit.load(DIR)(x)``, ``generate``, ``from_pretrained``), ``layerfit
run`` and the runtime, before the pass begins (issue 52 item 12: it was a size mismatch
or an index error deep in the model, 84 lines of traceback from ``run``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tinymodels
import torch
from safetensors.torch import save_file

import layerfit
from layerfit.errors import LayerfitError, RequestTooLargeError
from layerfit.schedule.runtime.executor import Runtime
from layerfit.store import prepare
from layerfit.store.hf_folder import HFOptions

TESTS = Path(__file__).resolve().parents[1]
POSITIONS = 16  # tiny_gpt2's n_positions
BERT_POSITIONS = 24


def _tiny_bert():
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=BERT_POSITIONS,
    )
    return BertForMaskedLM(config).eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A GPT-2 (token ids, positionally) prepared from its folder with varying shapes and
    at a fixed shape, the same from its factory (no limits in its manifest), and a BERT
    (keyword arguments) from its folder; all in ``repo/``, a model repository."""
    root = tmp_path_factory.mktemp("positions")
    raw = {"gpt2": root / "gpt2-raw", "bert": root / "bert-raw"}
    tinymodels.tiny_gpt2().save_pretrained(raw["gpt2"])
    _tiny_bert().save_pretrained(raw["bert"])
    repo = root / "repo"
    made = {
        "gpt2": repo / "gpt2", "fixed": repo / "fixed", "factory": repo / "factory", "bert": repo / "bert",
        "raw_gpt2": raw["gpt2"], "repo": repo,
    }
    prepare(f"hf:{raw['gpt2']}", made["gpt2"], hf=HFOptions(seq_len=8))
    prepare(f"hf:{raw['gpt2']}", made["fixed"], hf=HFOptions(seq_len=8, variable_shapes=False))
    prepare("tinymodels:tiny_gpt2", made["factory"], input_shape=(1, 8), input_dtype="int64")
    prepare(f"hf:{raw['bert']}", made["bert"], hf=HFOptions(seq_len=8))
    return made


def _ids(n: int, batch: int = 1) -> torch.Tensor:
    return torch.arange(batch * n, dtype=torch.long).reshape(batch, n) % 100


def _bert_call(n: int) -> dict[str, torch.Tensor]:
    return {"input_ids": _ids(n), "attention_mask": torch.ones(1, n, dtype=torch.long),
            "token_type_ids": torch.zeros(1, n, dtype=torch.long)}


@pytest.mark.parametrize("name", ["gpt2", "fixed", "factory"])
def test_the_python_api_refuses_ids_past_the_positions_in_one_line(folders, name: str) -> None:
    with layerfit.load(folders[name]) as engine:
        with pytest.raises(RequestTooLargeError) as caught:
            engine(_ids(POSITIONS + 4))
        assert f"input axis 1 is {POSITIONS + 4} tokens, more than the model's {POSITIONS} positions" in str(caught.value)
        assert isinstance(caught.value, LayerfitError) and "\n" not in str(caught.value)
        with pytest.raises(RequestTooLargeError, match=f"{POSITIONS} positions"):  # given by keyword too
            engine(input_ids=_ids(POSITIONS + 1))
        assert engine(_ids(POSITIONS)).logits.shape == (1, POSITIONS, 100)  # the limit itself runs


def test_a_keyword_models_too_long_input_is_refused(folders) -> None:
    with layerfit.load(folders["bert"]) as engine:
        with pytest.raises(RequestTooLargeError, match=f"input_ids axis 1 is 30 tokens, more than the model's {BERT_POSITIONS}"):
            engine(**_bert_call(30))
        assert engine(**_bert_call(BERT_POSITIONS)).logits.shape == (1, BERT_POSITIONS, 100)


def test_generate_and_from_pretrained_refuse_a_prompt_past_the_positions(folders, tmp_path: Path) -> None:
    too_long = pytest.raises(RequestTooLargeError, match=f"{POSITIONS} positions")
    with layerfit.load(folders["gpt2"]) as engine, too_long:
        engine.generate(_ids(POSITIONS + 2), max_new_tokens=1)
    too_long = pytest.raises(RequestTooLargeError, match=f"{POSITIONS} positions")
    with layerfit.from_pretrained(folders["raw_gpt2"], cache=tmp_path, hf=HFOptions(seq_len=8)) as model, too_long:
        model(_ids(POSITIONS + 2))


def test_the_runtime_refuses_with_the_engines_message(folders) -> None:
    runtime = Runtime(folders["repo"], "50MB", workers=1)
    try:
        with layerfit.load(folders["gpt2"]) as engine, pytest.raises(RequestTooLargeError) as direct:
            engine(_ids(POSITIONS + 3))
        with pytest.raises(RequestTooLargeError) as served:
            runtime.infer("gpt2", _ids(POSITIONS + 3)).result(timeout=60)
        assert str(served.value) == str(direct.value).replace("GPT2LMHeadModel", "gpt2")
    finally:
        runtime.shutdown()


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "layerfit.cli", *argv], capture_output=True, text=True, env=env,
                          timeout=300, check=False)


def _one_line(result: subprocess.CompletedProcess[str], needle: str) -> None:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr[-3000:]
    assert needle in result.stderr, result.stderr


def test_run_says_in_one_line_that_the_input_passes_the_positions(folders, tmp_path: Path) -> None:
    long_ids = tmp_path / "long.npy"
    np.save(long_ids, _ids(POSITIONS + 4).numpy())
    _one_line(_cli("run", str(folders["gpt2"]), "--input", str(long_ids)),
              f"input axis 1 is {POSITIONS + 4} tokens, more than the model's {POSITIONS} positions (give at most {POSITIONS})")
    long_call = tmp_path / "long.safetensors"
    save_file(_bert_call(30), long_call)
    _one_line(_cli("run", str(folders["bert"]), "--input", str(long_call)),
              f"input_ids axis 1 is 30 tokens, more than the model's {BERT_POSITIONS} positions")


def test_run_takes_any_length_within_the_positions_of_a_model_prepared_to_vary(folders, tmp_path: Path) -> None:
    ids = tmp_path / "ids.npy"
    np.save(ids, _ids(12, batch=2).numpy())
    result = _cli("run", str(folders["gpt2"]), "--input", str(ids), "--repeats", "1", "--warmup", "0", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)["output_shape"] == [2, 12, 100]
    # a model prepared at a fixed shape says how to prepare it to take other lengths
    _one_line(_cli("run", str(folders["fixed"]), "--input", str(ids)), "prepare it again without it")
