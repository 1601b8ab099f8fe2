"""The zoo's Vision Transformers: torchvision's layout, any patch grid, attention streamed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from layerfit import capture, zoo
from layerfit.engine import load
from layerfit.store import prepare
from layerfit.zoo.vit import VisionTransformer


def test_parameter_names_are_torchvisions() -> None:
    with torch.device("meta"):
        names = [n for n, _ in zoo.get("vit_b16").factory().named_parameters()]
    assert names[:4] == ["class_token", "conv_proj.weight", "conv_proj.bias", "encoder.pos_embedding"]
    assert "encoder.layers.encoder_layer_11.self_attention.in_proj_weight" in names
    assert "encoder.layers.encoder_layer_11.self_attention.out_proj.weight" in names
    assert "encoder.layers.encoder_layer_0.mlp.0.weight" in names
    assert names[-4:] == ["encoder.ln.weight", "encoder.ln.bias", "heads.head.weight", "heads.head.bias"]


def test_position_embedding_is_unchanged_at_the_native_grid_and_resampled_elsewhere() -> None:
    torch.manual_seed(0)
    model = VisionTransformer("s", image=64)  # a 4 x 4 grid
    pos = model.encoder.pos_embedding
    with torch.no_grad():
        assert torch.equal(model.encoder._position(torch.Size([4, 4])), pos)
        other = model.encoder._position(torch.Size([2, 6]))
    assert other.shape == (1, 1 + 2 * 6, 384)
    assert torch.equal(other[:, :1], pos[:, :1])  # the class token's own embedding is kept
    assert not torch.equal(other[:, 1:5], pos[:, 1:5])


def test_unknown_size_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown ViT size 'x'"):
        VisionTransformer("x")


def test_attention_streams_and_only_the_embeddings_stay_resident() -> None:
    model = zoo.build("vit_s16")
    graph = capture(model, torch.randn(1, 3, 64, 64))
    resident = {r.name for r in graph.resident}
    assert resident == {"class_token", "encoder.pos_embedding"}
    attention = [u for u in graph.units if u.name.endswith("self_attention")]
    assert len(attention) == 12
    assert all(u.d == 4 for u in attention)  # in_proj weight and bias, out_proj's two


@pytest.mark.parametrize("shape", [(1, 3, 64, 64), (2, 3, 48, 80)])
def test_streamed_at_its_minimum_budget_it_gives_exactly_model_outputs(tmp_path: Path, shape: tuple) -> None:
    model = zoo.build("vit_s16")
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model(x)
    m = prepare("vit_s16", tmp_path / "vit", input_shape=shape, module=model)
    del model
    minimum = m.resident_bytes + m.largest_unit_bytes
    for pipeline, budget in (("sequential", minimum), ("async", minimum + m.largest_unit_bytes)):
        with load(tmp_path / "vit", pipeline=pipeline, budget=budget) as engine:
            assert torch.equal(engine(x), expected), pipeline
            assert engine.last_weights_peak <= budget
