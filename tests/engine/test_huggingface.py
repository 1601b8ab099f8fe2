"""A Hugging Face transformer goes through the hook fallback and streams exactly."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import tinymodels
import torch

from layerfit.cli import main
from layerfit.engine import load
from layerfit.errors import FactoryImportError
from layerfit.store import example_input, prepare


@pytest.mark.parametrize("pipeline", ["preload", "sequential", "async"])
def test_gpt2_streams_bit_identically(tmp_path: Path, pipeline: str):
    out = tmp_path / "gpt2"
    m = prepare("tinymodels:tiny_gpt2", out, input_shape=(1, 8), input_dtype="int64")
    assert m.graph.method == "hooks"
    tied = {t.name: t for t in m.resident.tensors}
    assert set(tied["transformer.wte.weight"].places) == {"transformer.wte.weight", "lm_head.weight"}
    ids = example_input((1, 8), "int64")
    with torch.no_grad():
        expected = tinymodels.tiny_gpt2()(ids).logits
    budget = None if pipeline == "preload" else m.resident_bytes + 2 * m.largest_unit_bytes
    with load(out, pipeline=pipeline, budget=budget) as engine:
        got = engine(ids).logits
    assert torch.equal(got, expected)


@pytest.fixture()
def saved_llama(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tiny_llama saved to a folder (save_pretrained) that the factories read."""
    folder = tmp_path / "saved"
    tinymodels.tiny_llama().save_pretrained(folder)
    monkeypatch.setenv(tinymodels.SAVED_LLAMA, str(folder))
    return folder


def test_a_factory_that_loads_its_own_weights_is_told_to_build_from_a_config(saved_llama: Path, tmp_path: Path, capsys):
    """It prepares (weights and all), but the engine rebuilds the skeleton on the meta
    device, where from_pretrained refuses to run: the error said the factory had changed."""
    out = tmp_path / "m"
    prepare("tinymodels:pretrained_llama", out, input_shape=(1, 8), input_dtype="int64")
    with pytest.raises(FactoryImportError) as refused:
        load(out)
    message = str(refused.value)
    assert "'tinymodels:pretrained_llama' loads its weights itself (from_pretrained)" in message
    assert "from_config(config)" in message and "layerfit prepare hf:FOLDER" in message
    assert "changed" not in message and "\n" not in message
    capsys.readouterr()  # prepare's progress bars
    assert main(["run", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "loads its weights itself" in err and "Traceback" not in err and "\n" not in err


def test_a_factory_that_reads_only_its_config_rebuilds_and_gets_no_such_hint(saved_llama: Path, tmp_path: Path):
    """AutoConfig.from_pretrained is no model's: the factory rebuilds on the meta device
    and runs bit for bit; when its config is gone the hint is not the weights one."""
    out = tmp_path / "m"
    prepare("tinymodels:llama_from_saved_config", out, input_shape=(1, 8), input_dtype="int64")
    ids = example_input((1, 8), "int64") % 100
    with torch.no_grad():
        expected = tinymodels.llama_from_saved_config()(ids).logits
    with load(out, pipeline="async", budget="50%") as engine:
        assert torch.equal(engine(ids).logits, expected)
    shutil.rmtree(saved_llama)
    with pytest.raises(FactoryImportError) as refused:
        load(out)
    assert "from_pretrained)" not in str(refused.value)
