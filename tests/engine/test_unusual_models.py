"""Unusual but realistic models: the engine gives exactly ``model(x)`` (under no_grad, on
CPU) or refuses with a one-line LayerfitError — never a different output, a crash or a hang.
"""

from __future__ import annotations

import json
import re
import struct
import threading
from pathlib import Path

import pytest
import tinymodels
import torch
from torch import nn

from layerfit.capture import capture
from layerfit.capture.units import UnitRecorder
from layerfit.engine import load
from layerfit.engine.arena import ActivationPlanError
from layerfit.errors import CaptureError, InputError, LayerfitError
from layerfit.store import example_input, prepare, read_manifest
from layerfit.store.model_spec import ModelSpec

PIPELINES = ["preload", "sequential", "sync", "async"]
STREAMING = ["sequential", "sync", "async"]


def _minimum(directory: Path, pipeline: str) -> int:
    m = read_manifest(directory)
    return m.resident_bytes + (m.total_bytes - m.resident_bytes if pipeline == "preload" else
                               (2 if pipeline == "sync" else 1) * m.largest_unit_bytes)  # fmt: skip


def _reference(factory: str, *inputs: torch.Tensor) -> list:
    """``model(x)`` for each input, in turn, on one freshly built model."""
    model = getattr(tinymodels, factory)().eval()
    with torch.no_grad():
        return [model(x) for x in inputs]


def _call(engine, x: torch.Tensor, seconds: float = 20.0):
    """``engine(x)`` in a thread: a hang fails the test instead of stalling the run."""
    box: list = []

    def run() -> None:
        try:
            box.append(engine(x))
        except BaseException as exc:  # handed to the test
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the engine hangs"
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def _x(first: float, positives: int = 2) -> torch.Tensor:
    """A (2, 8) input whose first element has the sign of ``first`` and whose first row
    has ``positives`` positive elements."""
    x = -torch.rand(2, 8) - 0.1
    x[0, :positives] = torch.rand(positives) + 0.1
    x[0, 0] = abs(x[0, 0]) if first > 0 else -abs(x[0, 0])
    return x


# --- control flow that differs from the captured one ------------------------------------


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("budget", ["minimum", "large"])
def test_a_unit_skipped_is_the_models_output_and_one_run_again_is_refused_not_a_hang(
    tmp_path: Path, pipeline: str, budget: str
):
    # Prepared where ``opt`` runs (seed 5: x[0, 0] > 0) and ``step`` runs three times.
    prepare("tinymodels:branch", tmp_path / "branch", input_shape=(2, 8), seed=5)
    prepare("tinymodels:input_loop", tmp_path / "loop", input_shape=(2, 8), seed=1)  # step once
    size = None if budget == "large" else _minimum(tmp_path / "branch", pipeline)
    with load(tmp_path / "branch", pipeline=pipeline, budget=size) as engine:
        inputs = [_x(+1), _x(-1), _x(-1), _x(+1)]  # opt runs, is skipped, twice, runs again
        for x, want in zip(inputs, _reference("branch", *inputs), strict=True):
            assert torch.equal(_call(engine, x), want)
            assert engine.last_weights_peak <= (size or 1 << 40)
    size = None if budget == "large" else _minimum(tmp_path / "loop", pipeline)
    with load(tmp_path / "loop", pipeline=pipeline, budget=size) as engine:
        same_path, other_path = _x(+1, positives=1), _x(+1, positives=3)
        want_same, want_other = _reference("input_loop", same_path, other_path)
        assert torch.equal(_call(engine, same_path), want_same)
        if pipeline == "preload":  # every unit stays bound: any order is the model's
            assert torch.equal(_call(engine, other_path), want_other)
        else:
            with pytest.raises(LayerfitError, match=re.escape("unit 1 (step) runs a second time")) as info:
                _call(engine, other_path)
            assert "control flow differs" in str(info.value) and "\n" not in str(info.value)
        assert torch.equal(_call(engine, same_path), want_same)  # the engine still works


@pytest.mark.parametrize("pipeline", STREAMING)
def test_a_unit_skipped_with_a_copy_stage_is_the_models_output(tmp_path: Path, pipeline: str):
    prepare("tinymodels:branch", tmp_path / "branch", input_shape=(2, 8), seed=5)
    with load(tmp_path / "branch", pipeline=pipeline, stages=3) as engine:
        inputs = [_x(+1), _x(-1), _x(-1), _x(+1)]
        for x, want in zip(inputs, _reference("branch", *inputs), strict=True):
            assert torch.equal(_call(engine, x), want)


@pytest.mark.parametrize("pipeline", STREAMING)
def test_a_block_whose_first_layer_is_skipped_is_refused(tmp_path: Path, pipeline: str):
    prepare("tinymodels:branch", tmp_path / "m", input_shape=(2, 8), seed=5)
    x = _x(+1)
    with load(tmp_path / "m", pipeline=pipeline, units=[0, 1]) as engine:  # blocks: a | opt, b
        with pytest.raises(LayerfitError, match=r"unit 1 \(opt .. b\) runs b, but not its first layer opt"):
            _call(engine, _x(-1))
        assert torch.equal(_call(engine, x), _reference("branch", x)[0])


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_module_that_did_not_run_at_prepare_is_refused_by_name(tmp_path: Path, pipeline: str):
    prepare("tinymodels:branch", tmp_path / "m", input_shape=(2, 8), seed=1)  # opt never runs
    assert read_manifest(tmp_path / "m").graph.unused == ["opt.bias", "opt.weight"]
    with load(tmp_path / "m", pipeline=pipeline) as engine:
        with pytest.raises(LayerfitError, match="module opt runs, but it did not run on the example input"):
            _call(engine, _x(+1))
        x = _x(-1)
        assert torch.equal(_call(engine, x), _reference("branch", x)[0])


# --- state the forward pass writes ------------------------------------------------------


def test_prepare_packs_the_weights_as_given_not_as_the_capture_left_them(tmp_path: Path):
    model = tinymodels.running_state().eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    prepare("tinymodels:running_state", tmp_path / "m", input_shape=(2, 8), module=model)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the capture left no trace
    assert model.state is model._buffers["state"] and model.count.calls.item() == 0
    reasons = {r.name: r.reason for r in read_manifest(tmp_path / "m").graph.resident}
    assert reasons == {
        "count.calls": "the forward pass writes it (in place by add_)",
        "total": "the forward pass writes it (in place by add_)",
        "state": "the forward pass writes it (replaced by a new tensor)",
    }


@pytest.mark.parametrize("units", ["layers", "blocks:3"])
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_written_state_carries_over_calls_as_in_the_model(tmp_path: Path, pipeline: str, units: str):
    prepare("tinymodels:running_state", tmp_path / "m", input_shape=(2, 8))
    xs = [example_input((2, 8), seed=s) for s in range(3)]
    want = _reference("running_state", *xs)  # one model, three calls: the state grows
    with load(tmp_path / "m", pipeline=pipeline, units=units) as engine:
        for x, y in zip(xs, want, strict=True):
            assert torch.equal(engine(x), y)
    with pytest.raises(ActivationPlanError, match="writes .*activations='default'"):
        load(tmp_path / "m", activations="planned")


def test_a_python_attribute_the_forward_changes_is_refused_in_planned_mode(tmp_path: Path):
    prepare("tinymodels:python_counter", tmp_path / "m", input_shape=(2, 8))
    xs = [example_input((2, 8), seed=s) for s in range(2)]
    want = _reference("python_counter", *xs)
    with load(tmp_path / "m") as engine:
        assert all(torch.equal(engine(x), y) for x, y in zip(xs, want, strict=True))
    with pytest.raises(ActivationPlanError, match="changes attribute calls"):
        load(tmp_path / "m", activations="planned")


# --- weights read for their device, kept layouts ----------------------------------------


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_weights_device_read_outside_its_module_keeps_it_resident(tmp_path: Path, pipeline: str):
    prepare("tinymodels:device_probe", tmp_path / "m", input_shape=(2, 8))
    assert [r.name for r in read_manifest(tmp_path / "m").graph.resident] == ["b.weight"]
    x = example_input((2, 8))
    with load(tmp_path / "m", pipeline=pipeline, budget=_minimum(tmp_path / "m", pipeline)) as engine:
        assert torch.equal(_call(engine, x), _reference("device_probe", x)[0])


@pytest.mark.parametrize("units", ["layers", "blocks:3"])
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_channels_last_and_transposed_weights_keep_their_layout(tmp_path: Path, pipeline: str, units: str):
    prepare("tinymodels:layouts", tmp_path / "m", input_shape=(1, 3, 6, 6))
    x = example_input((1, 3, 6, 6))
    with load(tmp_path / "m", pipeline=pipeline, units=units) as engine:
        assert torch.equal(engine(x), _reference("layouts", x)[0])
        bound = engine.model.conv.weight  # preload keeps it bound, in its layout
        assert bound.device.type == ("cpu" if pipeline == "preload" else "meta")
        assert pipeline != "preload" or bound.stride() == (27, 1, 9, 3)
    m = read_manifest(tmp_path / "m")
    strides = {t.name: t.stride for seg in m.segments for t in seg.tensors}
    assert strides["conv.weight"] == (27, 1, 9, 3) and strides["fc.weight"] == (1, 8)
    assert strides["conv2.weight"] is None
    # The weights file stays valid safetensors: each entry in its memory order.
    raw = (tmp_path / "m" / m.weights_file).read_bytes()
    header = json.loads(raw[8 : 8 + struct.unpack("<Q", raw[:8])[0]])
    assert header["conv.weight"]["shape"] == [4, 3, 3, 3] and header["fc.weight"]["shape"] == [16, 8]
    with pytest.raises(ActivationPlanError, match="conv.weight is not row-major"):
        load(tmp_path / "m", activations="planned")


# --- outputs and inputs -----------------------------------------------------------------


@pytest.mark.parametrize("activations", ["default", "planned"])
def test_nested_outputs_keep_their_types(tmp_path: Path, activations: str):
    prepare("tinymodels:outputs", tmp_path / "m", input_shape=(2, 8))
    x = example_input((2, 8))
    (want,) = _reference("outputs", x)
    with load(tmp_path / "m", activations=activations) as engine:
        got = engine(x)
    assert type(got) is dict and type(got["all"]) is list and type(got["all"][1]) is tuple
    assert got["n"] == 3 and got["all"][1][1] is None
    assert torch.equal(got["out"], want["out"]) and torch.equal(got["all"][1][0], want["all"][1][0])


def test_planned_inputs_are_matched_by_name_and_extra_ones_refused(tmp_path: Path):
    prepare("tinymodels:tiny_cnn", tmp_path / "m", input_shape=(1, 3, 8, 8))
    x = example_input((1, 3, 8, 8))
    (want,) = _reference("tiny_cnn", x)
    with load(tmp_path / "m", activations="planned") as engine:
        assert torch.equal(engine(x=x), want)
        with pytest.raises(LayerfitError, match=r"takes inputs \(x\); it was called with 2 positional"):
            engine(x, x)
        with pytest.raises(LayerfitError, match="keyword"):
            engine(x, y=x)
        cl = x.to(memory_format=torch.channels_last)  # another layout than planned: still exact
        assert torch.equal(engine(cl), _reference("tiny_cnn", cl)[0])


# --- refused at prepare or load ---------------------------------------------------------


@pytest.mark.parametrize(
    ("factory", "error", "message"),
    [
        ("plain_tensor", CaptureError, r"reads tensor attribute offset .*register_buffer\('offset'"),
        ("scripted", CaptureError, "submodule s is a TorchScript module"),
        ("complex_weights", InputError, "tensor w has dtype complex64, which layerfit cannot store"),
    ],
)
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # the scripted model
def test_unsupported_models_are_refused_at_prepare(tmp_path: Path, factory: str, error: type, message: str):
    with pytest.raises(error, match=message) as info:
        prepare(f"tinymodels:{factory}", tmp_path / "m", input_shape=(2, 8))
    assert "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("noise", "creates 1 tensor.* from constant arguments"),
        ("item_read", r"cannot be laid out without weights \(RuntimeError"),
    ],
)
def test_graphs_tracing_cannot_reproduce_are_refused_in_planned_mode(tmp_path: Path, factory: str, message: str):
    prepare(f"tinymodels:{factory}", tmp_path / "m", input_shape=(2, 8))
    with pytest.raises(ActivationPlanError, match=message):
        load(tmp_path / "m", activations="planned")
    x = example_input((2, 8))
    with load(tmp_path / "m") as engine:  # the default mode runs the model's own code
        model = getattr(tinymodels, factory)().eval()
        torch.manual_seed(7)
        with torch.no_grad():
            want = model(x)
        torch.manual_seed(7)
        assert torch.equal(engine(x), want)


# --- the engine's own life --------------------------------------------------------------


def test_a_closed_engine_says_so(tmp_path: Path):
    prepare("tinymodels:tiny_cnn", tmp_path / "m", input_shape=(1, 3, 8, 8))
    engine = load(tmp_path / "m")
    engine.close()
    for use in (lambda: engine(example_input((1, 3, 8, 8))), lambda: engine.reconfigure(budget="1MiB")):
        with pytest.raises(LayerfitError, match="this engine is closed"):
            use()
    engine.close()  # closing again is harmless


def test_two_threads_share_one_engine(tmp_path: Path):
    prepare("tinymodels:tiny_cnn", tmp_path / "m", input_shape=(1, 3, 8, 8))
    xs = [example_input((1, 3, 8, 8), seed=s) for s in range(2)]
    want = _reference("tiny_cnn", *xs)
    results: list[bool] = []
    with load(tmp_path / "m", pipeline="async", budget=_minimum(tmp_path / "m", "async")) as engine:

        def work(k: int) -> None:
            for _ in range(20):
                results.append(torch.equal(engine(xs[k]), want[k]))

        threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert len(results) == 40 and all(results)


def test_thousands_of_tiny_layers(tmp_path: Path):
    prepare(ModelSpec("factory", "tinymodels:many_linear", {"n": 1000}), tmp_path / "m", input_shape=(1, 4))
    x = example_input((1, 4))
    with torch.no_grad():
        want = tinymodels.many_linear(1000)(x)
    with load(tmp_path / "m", pipeline="async") as engine:
        assert len(engine.blocks) == 1000
        assert torch.equal(engine(x), want)
        engine.reconfigure(units="blocks:3")
        assert torch.equal(engine(x), want)


def test_owning_ancestors_are_marked_in_one_pass_over_the_modules():
    # The marking was rewritten from all pairs of modules (quadratic: ~10 s of setup for
    # 4000 layers) to each module's ancestors; it must mark exactly the same modules.
    # (Its speed is a prepare-time matter, not asserted here.)
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), nn.Sequential(nn.Linear(2, 2))), nn.ReLU())
    model.register_parameter("scale", nn.Parameter(torch.ones(1)))
    model[1].register_buffer("shift", torch.zeros(1))
    stats = UnitRecorder(model).stats
    owners = {name for name, st in stats.items() if st.places}
    by_pairs = {n for n in owners if any(o != n and (n == "" or o.startswith(n + ".")) for o in owners)}
    assert by_pairs == {"", "1"}  # owners with an owning descendant (1.1 owns nothing itself)
    assert {name for name, st in stats.items() if st.children_owning} == by_pairs
    assert [u.name for u in capture(tinymodels.many_linear(3), torch.zeros(1, 4)).units] == ["0", "1", "2"]


def test_a_strided_layout_is_format_version_2_so_older_readers_refuse_it(tmp_path: Path):
    import json

    from layerfit.errors import ManifestError

    prepare("tinymodels:layouts", tmp_path / "strided", input_shape=(1, 3, 6, 6))
    prepare("tinymodels:tiny_cnn", tmp_path / "plain", input_shape=(1, 3, 6, 6))
    manifests = {name: tmp_path / name / "manifest.json" for name in ("strided", "plain")}
    versions = {name: json.loads(path.read_text())["version"] for name, path in manifests.items()}
    assert versions == {"strided": 2, "plain": 1}  # a layerfit that reads version 1 only refuses the first
    for name, wrong in (("strided", 1), ("plain", 2)):
        data = json.loads(manifests[name].read_text())
        data["version"] = wrong
        manifests[name].write_text(json.dumps(data))
        with pytest.raises(ManifestError, match="tensor strides"):
            read_manifest(tmp_path / name)


@pytest.mark.parametrize("binding", ["reference", "copy", "instantiate"])
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_head_on_a_sliced_batch_rounds_as_the_models_parameters_do(tmp_path: Path, pipeline: str, binding: str):
    """``matmul`` folds a strided batch into one GEMM only when the weight requires grad,
    so a weight bound as a plain tensor (or a view, whose ``.t()`` under no_grad does not
    require grad) gave other bits than the model's parameter here (4e-8 apart)."""
    manifest = prepare("tinymodels:last_token", tmp_path / "lt", input_shape=(3, 8, 32))
    x = example_input((3, 8, 32))
    with torch.no_grad():
        expected = tinymodels.last_token()(x)
    budget = None if pipeline == "preload" else 2 * manifest.largest_unit_bytes
    with load(tmp_path / "lt", pipeline=pipeline, budget=budget, binding=binding) as engine:
        assert torch.equal(engine(x), expected)
