"""The zoo registry: names, published parameter counts, errors, meta construction, fx."""

from __future__ import annotations

import pytest
import torch
import torch.fx
from zoo_expected import DEFAULT_OUTPUT, PARAMS

from layerfit import zoo
from layerfit.errors import LayerfitError, UnknownModelError

REQUIRED = [
    "resnet50", "resnet101", "resnet152", "vgg16", "vgg19", "densenet121", "densenet201",
    "mobilenet_v1", "mobilenet_v1_025", "mobilenet_v2", "inception_v3", "efficientnet_b0",
    "yolov3", "yolov4", "tiny_yolov3", "deeplab_v3", "fcn8s", "blazeface", "posenet",
    "agenet", "gendernet", "alexnet", "vgg_s", "googlenet",
]


# Classifiers ending in adaptive pooling; their default shapes need no separate check.
ADAPTIVE_CLASSIFIERS = {
    "resnet50", "resnet101", "resnet152", "vgg16", "vgg19", "densenet121", "densenet201",
    "mobilenet_v1", "mobilenet_v1_025", "mobilenet_v2", "efficientnet_b0", "alexnet", "googlenet",
}


def _meta(name: str) -> torch.nn.Module:
    entry = zoo.get(name)
    with torch.device("meta"):
        return entry.factory(**entry.kwargs)


def test_every_required_network_is_registered_with_lowercase_names() -> None:
    assert set(REQUIRED) <= set(zoo.names())
    assert all(n == n.lower() for n in zoo.names())
    assert len(set(zoo.names())) == len(zoo.names())
    assert set(zoo.names()) == set(PARAMS)


@pytest.mark.parametrize("name", zoo.names())
def test_parameter_count_matches_published_figure(name: str) -> None:
    entry = zoo.get(name)
    count = zoo.param_count(name)
    assert count == PARAMS[name]
    if entry.published_params is not None:
        rel = abs(count / 1e6 - entry.published_params) / entry.published_params
        assert rel < 0.01, f"{name}: {count:,} vs published {entry.published_params} M"
    else:
        assert "no published count" in entry.source
    assert entry.source, f"{name} does not say where its figures come from"


@pytest.mark.parametrize(
    ("name", "millions"),
    [("resnet152", 60.2), ("vgg19", 143.7), ("mobilenet_v2", 3.5), ("densenet201", 20.0),
     ("inception_v3", 23.8), ("efficientnet_b0", 5.3), ("resnet50", 25.6), ("resnet101", 44.5),
     ("vgg16", 138.4), ("densenet121", 8.0), ("mobilenet_v1", 4.2), ("mobilenet_v1_025", 0.47),
     ("yolov3", 61.9), ("yolov4", 64.4), ("tiny_yolov3", 8.86), ("alexnet", 61.1)],
)
def test_issue_figures_within_one_percent(name: str, millions: float) -> None:
    assert abs(PARAMS[name] / 1e6 - millions) / millions < 0.01


@pytest.mark.parametrize("name", zoo.names())
def test_meta_construction_traces_and_runs_at_default_shape(name: str) -> None:
    """Built on meta (as the store's skeleton is): fx traces it; the default shape is valid."""
    model = _meta(name).eval()
    assert all(p.is_meta for p in model.parameters())
    assert all(b.is_meta for b in model.buffers())
    for module in model.modules():  # all tensor state is registered
        stray = [k for k, v in vars(module).items() if isinstance(v, torch.Tensor)]
        assert not stray, f"{name}: plain tensor attributes {stray} in {type(module).__name__}"
    torch.fx.symbolic_trace(model)
    if name in ADAPTIVE_CLASSIFIERS:  # global pooling: any size from the small one up works
        return
    entry = zoo.get(name)
    with torch.no_grad():
        out = model(torch.empty(entry.input_shape, device="meta"))
    assert tuple(out.shape) == DEFAULT_OUTPUT[name]


def test_default_input_shapes_follow_the_papers() -> None:
    shapes = {n: zoo.get(n).input_shape for n in zoo.names()}
    assert shapes["yolov3"] == shapes["yolov4"] == (1, 3, 608, 608)  # Demand Layering
    assert shapes["resnet152"] == shapes["densenet201"] == (1, 3, 608, 608)  # Demand Layering
    assert shapes["inception_v3"] == (1, 3, 299, 299)
    assert shapes["deeplab_v3"] == (1, 3, 257, 257)
    assert shapes["blazeface"] == (1, 3, 128, 128)
    assert shapes["agenet"] == shapes["gendernet"] == (1, 3, 227, 227)
    assert shapes["mobilenet_v2"] == shapes["efficientnet_b0"] == (1, 3, 224, 224)


def test_darknet_layer_numbering_matches_the_cfg_files() -> None:
    """Demand Layering counts YOLOv4 as 162 layers (110 conv, 21 route, 23 shortcut …)."""
    from layerfit.zoo import yolo

    v4 = _meta("yolov4").layers
    kinds = [type(m).__name__ for m in v4]
    assert len(v4) == 162
    assert sum(k.startswith("DarknetConv") or k == "DarknetResidualConv" for k in kinds) == 110
    assert kinds.count("Route") == 21 and kinds.count("Shortcut") == 23
    assert kinds.count("DarknetMaxPool") == 3 and kinds.count("Upsample") == 2
    assert kinds.count("DetectionOutput") == 3
    assert len(_meta("yolov3").layers) == 107
    assert isinstance(v4[161], yolo.DetectionOutput) and v4[153].sources == (152, 116)


def test_unknown_name_lists_close_matches() -> None:
    with pytest.raises(UnknownModelError) as info:
        zoo.get("resnet15")
    msg = str(info.value)
    assert "resnet15" in msg and "resnet152" in msg and "Did you mean" in msg
    assert isinstance(info.value, LayerfitError)
    with pytest.raises(UnknownModelError, match="mobilenet_v2"):
        zoo.build("mobilenetv2")
    with pytest.raises(UnknownModelError) as info:
        zoo.get("completely-different")
    assert "Did you mean" not in str(info.value)


def test_get_accepts_case_and_dashes() -> None:
    assert zoo.get("ResNet152").name == "resnet152"
    assert zoo.get("deeplab-v3").name == "deeplab_v3"


def test_table_rows() -> None:
    rows = zoo.table()
    assert [r["name"] for r in rows] == zoo.names()
    for r in rows:
        assert r["params"] == PARAMS[r["name"]]
        assert r["param_mb"] == pytest.approx(r["params"] * 4 / 1e6, abs=0.01)
        assert tuple(r["input_shape"]) == zoo.get(r["name"]).input_shape


def test_factory_kwargs_override() -> None:
    assert zoo.get("mobilenet_v1_025").kwargs == {"width_mult": 0.25}
    with torch.device("meta"):
        model = zoo.get("mobilenet_v1").factory(width_mult=0.25)
    assert sum(p.numel() for p in model.parameters()) == PARAMS["mobilenet_v1_025"]
