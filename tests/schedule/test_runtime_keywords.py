"""A model prepared from keyword arguments (Whisper: features and decoder ids) in the
runtime: a job gives a mapping of them and gets exactly ``model(**kwargs)``; a job that
gives anything else is refused at submission, naming what the model takes."""

from __future__ import annotations

import pytest
import tinymodels
import torch

from layerfit.engine import flat_outputs
from layerfit.errors import InputError
from layerfit.schedule.experiments.realrun import run_workload
from layerfit.schedule.experiments.workload import load_workload
from layerfit.schedule.runtime.executor import InferenceJob, Runtime
from layerfit.schedule.runtime.profiler import measure_contention, measure_profile
from layerfit.store import ModelSpec, example_input, prepare

FEATURES = (1, 8, 32)  # 8 mel bins, 32 frames
IDS = (1, 3)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("keywords")
    example = {"input_features": example_input(FEATURES, seed=6), "decoder_input_ids": torch.tensor([[0, 5, 7]])}
    prepare("tinymodels:tiny_whisper", root / "whisper", example=example)
    prepare(ModelSpec("factory", "tinymodels:tiny_cnn", {}), root / "cnn", input_shape=(1, 3, 8, 8))
    return root


@pytest.fixture(scope="module")
def whisper():
    return tinymodels.tiny_whisper()


def keywords(seed: int, batch: int = 1) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 100, (batch, IDS[1]), generator=torch.Generator().manual_seed(seed))
    return {"input_features": example_input((batch, *FEATURES[1:]), seed=seed), "decoder_input_ids": ids}


def assert_model_output(out, model, kwargs) -> None:
    with torch.no_grad():
        expected = flat_outputs(model(**kwargs))
    got = flat_outputs(out)
    assert len(got) == len(expected) == 2  # logits and the encoder's output (the cache is no tensor)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


@pytest.fixture(scope="module")
def whisper_minimum(repo) -> int:
    with Runtime(repo, "16MB", workers=1) as rt:
        return rt.profile_set()["whisper"].min_budget


@pytest.mark.parametrize("tight", [False, True])
@pytest.mark.parametrize("workers", [1, 2])
def test_a_mapping_of_keyword_arguments_gives_the_models_output(repo, whisper, whisper_minimum, workers, tight):
    # at its minimum budget the model's units are loaded one or two at a time
    with Runtime(repo, whisper_minimum if tight else "16MB", workers=workers, trace=True) as rt:
        futures = [rt.infer("whisper", keywords(seed)) for seed in range(4)]
        for seed, future in enumerate(futures):
            assert_model_output(future.result(timeout=60), whisper, keywords(seed))
        report = rt.run_report()
    assert report.budget_violations == 0 and report.to_dict()["jobs_by_status"] == {"done": 4}


def test_a_batch_of_keyword_arguments_and_a_job_of_two_models(repo, whisper):
    cnn = tinymodels.tiny_cnn().eval()
    x = example_input((2, 3, 8, 8), seed=3)
    with Runtime(repo, "16MB", workers=2) as rt:
        batch = keywords(5, batch=2)  # the batch size is free, as for a single input
        assert_model_output(rt.infer("whisper", batch).result(timeout=60), whisper, batch)
        out = rt.submit(InferenceJob(("whisper", "cnn"), {"whisper": keywords(7), "cnn": x})).result(timeout=60)
    assert_model_output(out["whisper"], whisper, keywords(7))
    with torch.no_grad():
        assert torch.equal(out["cnn"], cnn(x))


def test_the_example_input_is_a_mapping_of_the_prepared_keywords(repo, whisper):
    with Runtime(repo, "16MB", workers=1) as rt:
        example = rt.example_input("whisper")
        assert {k: (tuple(v.shape), v.dtype) for k, v in example.items()} == {
            "input_features": (FEATURES, torch.float32), "decoder_input_ids": (IDS, torch.int64)
        }
        assert_model_output(rt.infer("whisper", example).result(timeout=60), whisper, example)
        assert isinstance(rt.example_input("cnn"), torch.Tensor)


GIVES_KEYWORDS = "takes keyword arguments input_features \\(N, 8, 32\\) float32, decoder_input_ids \\(N, 3\\) int64"


@pytest.mark.parametrize(
    ("model", "value", "message"),
    [
        ("whisper", example_input(FEATURES), GIVES_KEYWORDS + ": give a mapping of them, not a Tensor"),
        ("whisper", {"input_features": example_input(FEATURES)}, GIVES_KEYWORDS + "; the job gives input_features$"),
        ("whisper", {**keywords(0), "attention_mask": torch.ones(IDS)},
         GIVES_KEYWORDS + "; the job gives input_features, decoder_input_ids, attention_mask$"),
        ("whisper", {"cnn": example_input((1, 3, 8, 8))},
         "the job gives no input for model 'whisper' \\(inputs for: cnn\\); it " + GIVES_KEYWORDS + "$"),
        ("whisper", {**keywords(0), "decoder_input_ids": torch.zeros(IDS)},
         "expects decoder_input_ids of shape \\(N, 3\\) and dtype int64, got shape \\(1, 3\\) and dtype float32"),
        ("whisper", {**keywords(0), "input_features": example_input((1, 8, 16))},
         "expects input_features of shape \\(N, 8, 32\\)"),
        ("whisper", {**keywords(0), "decoder_input_ids": [[0, 5, 7]]}, "'whisper''s decoder_input_ids must be a tensor"),
        ("cnn", keywords(0), "the job gives no input for model 'cnn' \\(inputs for: input_features, decoder_input_ids\\)"),
    ],
)
def test_a_wrong_call_is_refused_and_the_runtime_runs_on(repo, whisper, model: str, value, message: str):
    with Runtime(repo, "16MB", workers=1) as rt:
        with pytest.raises(InputError, match=message):
            rt.infer(model, value)
        assert_model_output(rt.infer("whisper", keywords(1)).result(timeout=60), whisper, keywords(1))


def test_profiled_estimates_and_contention_run_the_prepared_keywords(repo, whisper):
    profile = measure_profile(repo / "whisper", "whisper", repeats=1, warmup=0)
    assert len(profile.layers) > 1 and all(layer.exec_time > 0 for layer in profile.layers)
    assert measure_contention([repo / "whisper", repo / "cnn"], repeats=1).source == "measured"
    with Runtime(repo, "16MB", workers=2, estimates="profile") as rt:
        assert_model_output(rt.infer("whisper", keywords(2)).result(timeout=60), whisper, keywords(2))


def test_a_workload_of_a_keyword_model_runs_on_the_real_executor(repo, tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("name: speech\nmode: open\narrivals:\n"
                    "  - {at: 0.0, networks: [whisper, cnn]}\n  - {at: 0.01, networks: [whisper]}\n")
    with Runtime(repo, "16MB", workers=2, trace=True) as rt:
        workload = load_workload(path, rt.profile_set())
        report = run_workload(rt, workload)
    assert report.to_dict()["jobs_by_status"] == {"done": 2}
