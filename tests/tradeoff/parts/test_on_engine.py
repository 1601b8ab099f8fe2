"""Processing by parts on the engine: a loaded model's layers by parts give model(x), and
a stage runs as its own pass of the engine, with only its units."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from layerfit.engine.engine import Engine
from layerfit.errors import LayerfitError, TradeoffError
from layerfit.store import prepare
from layerfit.tradeoff.parts.cnn import CNN
from layerfit.tradeoff.parts.executor import TOLERANCE, PartsExecutor, PartsSpec, stage_of
from layerfit.tradeoff.parts.kernels import cnn_from_engine
from layerfit.tradeoff.parts.pipeline import TwoStagePipeline

from .single_thread import single_thread  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("single_thread")

SHAPE = (1, 3, 32, 32)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("parts") / "mobilenet_v2"
    prepare("mobilenet_v2", out, input_shape=SHAPE)
    return out


def EngineStage(engine: Engine, cnn: CNN, parts: PartsSpec, first: int = 0, stop: int | None = None) -> PartsExecutor:  # noqa: N802
    """Layers ``[first, stop)`` run as a pass of ``engine``."""
    return PartsExecutor(cnn, parts, stage=stage_of(cnn, first, len(cnn.layers) if stop is None else stop), engine=engine)


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    rtol, atol = TOLERANCE
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol * max(1.0, expected.abs().max().item()))


def test_by_parts_on_the_engine_equals_the_model_whole_and_in_two_stages(folder: Path) -> None:
    with Engine(folder, pipeline="preload") as engine:
        cnn = cnn_from_engine(engine)
        (x,) = cnn.runner.example
        reference = engine(x)
        close(EngineStage(engine, cnn, "all").run(x), reference)
        assert torch.equal(EngineStage(engine, cnn, "none").run(x), reference)
        cut = len(cnn.layers) // 2
        first, second = EngineStage(engine, cnn, "all", 0, cut), EngineStage(engine, cnn, "all", cut)
        assert first.units.stop == second.units.start  # the stages' units split the model's
        assert (first.units.start, second.units.stop) == (0, len(engine.blocks))
        (out,) = second.run(*first.run(x))
        close(out, reference)


@pytest.mark.parametrize("pipeline", ["async", "sync"])
def test_a_streaming_engine_runs_layers_whole_and_by_parts(folder: Path, pipeline: str) -> None:
    """Under a streaming policy, the units of a chain of layers by parts are bound as one
    from its first phase to its last: outputs equal the model's, whole and in two stages."""
    with Engine(folder, pipeline=pipeline, budget="90%") as engine:
        cnn = cnn_from_engine(engine)
        (x,) = cnn.runner.example
        reference = engine(x)
        cut = len(cnn.layers) // 2
        first, second = EngineStage(engine, cnn, "none", 0, cut), EngineStage(engine, cnn, "none", cut)
        (out,) = second.run(*first.run(x))
        assert torch.equal(out, reference)
        by_parts = EngineStage(engine, cnn, "all")
        assert by_parts.spans and all(len(units) >= 1 for _, _, units in by_parts.spans)
        close(by_parts.run(x), reference)
        assert not engine.stream.kernels.held  # every unit let go
        first, second = EngineStage(engine, cnn, "all", 0, cut), EngineStage(engine, cnn, "all", cut)
        (out,) = second.run(*first.run(x))
        close(out, reference)
        second.units = first.units  # a pass may run only its own units: the engine says so
        with pytest.raises(LayerfitError, match="units"):
            second.run(*first.run(x))


def test_by_parts_is_refused_where_a_chain_cannot_be_bound_at_once(folder: Path) -> None:
    with Engine(folder, pipeline="sequential") as engine:
        cnn = cnn_from_engine(engine)
        EngineStage(engine, cnn, "none")  # whole layers: each unit bound by its hooks
        with pytest.raises(LayerfitError, match="sequential"):
            EngineStage(engine, cnn, "all")


def test_a_unit_across_the_cut_is_refused(folder: Path) -> None:
    with Engine(folder, pipeline="preload", units="blocks:4") as engine:
        cnn = cnn_from_engine(engine)
        with pytest.raises(TradeoffError, match="cannot run as their own pass"):
            EngineStage(engine, cnn, "all", 0, len(cnn.layers) // 2 + 1)


@pytest.mark.parametrize(("pipeline", "parts"), [("async", "none"), ("async", "all"), ("preload", "all")])
def test_a_two_stage_pipeline_on_two_engines_equals_the_model(folder: Path, pipeline: str, parts: str) -> None:
    """Each stage a pass of its own engine of the one prepared model, on its own thread:
    a streaming engine reads only its stage's units."""
    options = {"budget": "50%"} if pipeline == "async" else {}
    with Engine(folder, pipeline=pipeline, **options) as first, Engine(folder, pipeline=pipeline, **options) as second:
        cnn = cnn_from_engine(first)
        frames = [cnn.runner.example[0] + k for k in range(3)]
        references = [first(x) for x in frames]
        staged = TwoStagePipeline(cnn, len(cnn.layers) // 2, parts, engines=(first, second))
        assert staged.first.units.stop == staged.second.units.start
        piped = staged.run(frames)
        for out, sequential, reference in zip(piped, staged.run_sequential(frames), references, strict=True):
            assert torch.equal(out, sequential)
            close(out, reference)
            if parts == "none":
                assert torch.equal(out, reference)


@pytest.mark.parametrize("pipeline", ["preload", "async"])
def test_measured_throughput_runs_a_cnn_on_its_engine(folder: Path, pipeline: str) -> None:
    """The measured estimator runs each partition as a pass of the CNN's engine: the
    application's CNN (from the zoo's module) and the engine's have the same layers."""
    from layerfit import zoo
    from layerfit.tradeoff.parts.application import Application, split_partitions
    from layerfit.tradeoff.parts.kernels import cnn_from_module
    from layerfit.tradeoff.parts.throughput import MeasuredThroughput

    cnn = cnn_from_module("mobilenet_v2", zoo.build("mobilenet_v2"), torch.randn(SHAPE))
    app = Application([cnn], split_partitions(cnn, 2))
    options = {"budget": "90%"} if pipeline == "async" else {}
    with Engine(folder, pipeline=pipeline, **options) as engine:
        estimator = MeasuredThroughput(repeats=1, warmup=0, engines={"mobilenet_v2": engine})
        bits = [cnn.tileable(i) for i in range(len(cnn.layers))]
        fps = estimator.throughput(app, app.derive(bits))
        assert fps["mobilenet_v2"] > 0
        assert estimator.runs(cnn) is not cnn and estimator.runs(cnn).layers == cnn.layers
        other = cnn_from_module("mobilenet_v2", zoo.build("mobilenet_v2"), torch.randn(1, 3, 64, 64))
        with pytest.raises(TradeoffError, match="another model"):
            MeasuredThroughput(engines={"mobilenet_v2": engine}).runs(other)
