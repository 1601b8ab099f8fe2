"""A text model's varying axes and its activations at each shape, measured at prepare time.

The estimate the runtime admits a request by must be at least what the pass really holds
(:class:`PassAllocations`, the capture's own measure) at shapes that were *not* sampled,
and not wildly more; the manifest keeps measurements only, and refuses malformed ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

from layerfit.capture.allocations import PassAllocations
from layerfit.errors import InputError, ManifestError, RequestTooLargeError
from layerfit.store import prepare, read_manifest
from layerfit.store.shape_samples import sample_sizes
from layerfit.store.variable_shapes import ShapeSample, VariableShapes

LLAMA = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128}
BERT = {"vocab_size": 80, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "max_position_embeddings": 64, "type_vocab_size": 2}


def _prepared(root: Path, model: transformers.PreTrainedModel, name: str) -> Path:
    model.save_pretrained(root / name)
    prepare("hf:" + str(root / name), root / f"{name}-prepared")
    return root / f"{name}-prepared"


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, transformers.PreTrainedModel]:
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).eval()
    return _prepared(tmp_path_factory.mktemp("vs"), model, "llama"), model


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(**BERT)).eval()
    return _prepared(tmp_path_factory.mktemp("vs"), model, "bert")


def measured_peak(model: torch.nn.Module, x: torch.Tensor) -> int:
    allocations = PassAllocations(weights=[*model.parameters(), *model.buffers()], inputs=((x,), {}))
    with torch.no_grad(), allocations:
        model(x)
    return allocations.peak


def test_a_decoder_varies_batch_and_sequence_within_its_positions(llama):
    directory, _ = llama
    shapes = read_manifest(directory).variable_shapes
    assert shapes.symbols == ("batch", "sequence")
    assert set(shapes.axes) == {("", 0, "batch"), ("", 1, "sequence")}
    assert shapes.limit("sequence") == 128
    assert {(0, 0, "batch"), (0, 1, "sequence")} <= set(shapes.outputs)  # the logits follow both
    lengths = {s.sizes[1] for s in shapes.samples}
    assert {8, 16, 32, 64, 128} <= lengths and max(lengths) <= 128  # 8 × 32 is past the positions
    assert {s.sizes[0] for s in shapes.samples} == {1, 2, 3}


@pytest.mark.parametrize("shape", [(1, 5), (1, 48), (1, 100), (2, 77), (5, 20)])
def test_the_estimate_covers_a_pass_at_a_shape_never_sampled(llama, shape):
    directory, model = llama
    shapes = read_manifest(directory).variable_shapes
    assert shape not in {s.sizes for s in shapes.samples}
    x = torch.randint(0, 96, shape)
    real = measured_peak(model, x)
    estimate = shapes.activation_bytes({"batch": shape[0], "sequence": shape[1]})
    assert real <= estimate <= 1.25 * real + 4096, (shape, real, estimate)


def test_the_estimate_is_at_least_every_measured_sample(llama):
    shapes = read_manifest(llama[0]).variable_shapes
    for sample in shapes.samples:
        assert shapes.activation_bytes(dict(zip(shapes.symbols, sample.sizes, strict=True))) >= sample.activation_bytes


def test_an_encoder_names_its_keyword_axes_and_checks_they_agree(bert):
    manifest = read_manifest(bert)
    shapes = manifest.variable_shapes
    names = {n for n, _, _ in shapes.axes}
    assert names == {"input_ids", "attention_mask", "token_type_ids"}
    assert manifest.graph.output_names == ["last_hidden_state", "pooler_output"]
    sizes = shapes.sizes_of({n: (2, 9) for n in names}, "bert")
    assert sizes == {"batch": 2, "sequence": 9}
    with pytest.raises(InputError, match="must be equal"):
        shapes.sizes_of({"input_ids": (2, 9), "attention_mask": (2, 8), "token_type_ids": (2, 9)}, "bert")
    with pytest.raises(RequestTooLargeError, match="64 positions"):
        shapes.sizes_of({n: (1, 65) for n in names}, "bert")


def test_the_manifest_refuses_malformed_variable_shapes(llama, tmp_path):
    import json
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(llama[0], copy)
    original = json.loads((copy / "manifest.json").read_text())
    for change in (
        lambda v: v.update(symbols=["sequence", "batch"]),
        lambda v: v.update(samples=v["samples"][:2]),
        lambda v: v.update(axes=[["", 5, "batch"]]),
        lambda v: v.update(axes=[["", 1, "nonsense"]]),
        lambda v: v["samples"][0].__setitem__(1, -3),
    ):
        data = json.loads(json.dumps(original))
        change(data["input"]["variable"])
        (copy / "manifest.json").write_text(json.dumps(data))
        with pytest.raises(ManifestError):
            read_manifest(copy)


@settings(max_examples=60, deadline=None)
@given(
    linear=st.integers(1, 10_000), square=st.integers(0, 500), fixed=st.integers(0, 10**6),
    noise=st.lists(st.floats(0.9, 1.1), min_size=10, max_size=10),
)
def test_the_fit_never_underestimates_a_sample_and_survives_the_manifest(linear, square, fixed, noise):
    sizes = sample_sizes(("batch", "sequence"), (1, 32), {"sequence": 512})
    samples = tuple(
        ShapeSample(s, int((fixed + s[0] * (linear * s[1] + square * s[1] ** 2)) * noise[i % len(noise)]))
        for i, s in enumerate(sizes)
    )
    shapes = VariableShapes(("batch", "sequence"), (("", 0, "batch"), ("", 1, "sequence")),
                            (("sequence", 512),), (1, 32), samples)
    again = VariableShapes.from_dict(shapes.to_dict())
    assert again == shapes
    for sample in samples:
        assert again.activation_bytes({"batch": sample.sizes[0], "sequence": sample.sizes[1]}) >= sample.activation_bytes


def test_fixed_shape_skips_the_samples_and_keeps_the_prepared_shape(tmp_path):
    from typer.testing import CliRunner

    from layerfit.cli import app

    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).save_pretrained(tmp_path / "llama")
    out = CliRunner().invoke(app, ["prepare", f"hf:{tmp_path / 'llama'}", "-o", str(tmp_path / "p"), "--fixed-shape"])
    assert out.exit_code == 0, out.output
    assert read_manifest(tmp_path / "p").variable_shapes is None
    refused = CliRunner().invoke(app, ["prepare", "blazeface", "-o", str(tmp_path / "z"), "--fixed-shape"])
    assert refused.exit_code != 0 and "for a Hugging Face folder" in str(refused.exception)
