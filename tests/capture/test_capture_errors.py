"""A model that fails on the example input is a CaptureError naming the input, not a
traceback from inside the model."""

from __future__ import annotations

from pathlib import Path

import pytest
import tinymodels
import torch

from layerfit.capture import capture
from layerfit.cli import main
from layerfit.errors import CaptureError


def test_model_that_rejects_the_example_input():
    with pytest.raises(CaptureError, match=r"float32 \(1, 3\).*Expected 3D \(unbatched\) or 4D"):
        capture(tinymodels.tiny_cnn(), torch.zeros(1, 3))
    with pytest.raises(CaptureError, match="refuses every input"):
        capture(tinymodels.raises_in_forward(), torch.zeros(1, 4))


@pytest.mark.parametrize(
    "args",
    [["--input-shape", "1,3"], ["--input-shape", "1,3,8,8", "--input-dtype", "int64"]],
)
def test_prepare_with_an_input_the_model_rejects(tmp_path: Path, capsys, args):
    assert main(["prepare", "tinymodels:tiny_cnn", "-o", str(tmp_path / "m"), *args]) == 2
    err = capsys.readouterr().err
    assert "fails on the example input" in err and "--input-shape" in err
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def _dynamically_quantized() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")  # torch.ao.quantization
def test_packed_quantized_weights_are_refused_not_left_out(tmp_path: Path, capsys, monkeypatch):
    # Their weights live in packed TorchScript objects: stored as nothing, the prepared
    # model would have had no weights at all.
    with pytest.raises(CaptureError, match=r"submodule 0\._packed_params \(LinearPackedParams\) keeps its weights packed"):
        capture(_dynamically_quantized(), torch.zeros(1, 8))
    monkeypatch.setattr(tinymodels, "quantized_mlp", _dynamically_quantized, raising=False)
    assert main(["prepare", "tinymodels:quantized_mlp", "-o", str(tmp_path / "m"), "--input-shape", "1,8"]) == 2
    err = capsys.readouterr().err
    assert "prepare the model before quantization" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
