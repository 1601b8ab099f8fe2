"""Encoder-decoders and passes that skip units: an encoder run as its own pass
(``Engine.part``), ``generate`` on a BART (the encoder once, then decoder steps that skip
their cached cross-attention projections), and any pattern of skipped units."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import tinymodels
import torch
from engine_helpers import finish_read_ahead
from hypothesis import given, settings
from hypothesis import strategies as st

from layerfit.engine import load
from layerfit.engine.gather import streamed_minimum
from layerfit.errors import InputError, LayerfitError
from layerfit.store import example_input, prepare
from layerfit.store.model_spec import ModelSpec

PIPELINES = ["sequential", "sync", "async", "auto"]


@pytest.fixture(scope="module")
def bart(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("encoder_decoder") / "bart"
    manifest = prepare("tinymodels:tiny_bart", directory, input_shape=(1, 8), input_dtype="int64")
    ids = example_input((2, 8), "int64", seed=4) % 100
    return directory, manifest, tinymodels.tiny_bart(), ids


def _budget(manifest, pipeline: str) -> int:
    """Room for two of the largest unit (one for sequential); auto keeps half the rest."""
    budget = manifest.resident_bytes + (1 if pipeline == "sequential" else 2) * manifest.largest_unit_bytes
    if pipeline == "auto":
        budget += (manifest.total_bytes - manifest.resident_bytes) // 2
    return budget


def test_the_encoder_and_decoder_units_are_two_runs(bart):
    directory, manifest, _, _ = bart
    with load(directory, pipeline="async") as engine:
        encoder = engine.part("model.encoder")
        assert encoder.units == range(0, 18)
        assert all(engine.blocks[i].name.startswith("model.encoder.") for i in encoder.units)
        assert all(b.name.startswith("model.decoder.") for b in engine.blocks[18:])
        assert engine.part("model.decoder").units == range(18, len(engine.blocks))
        assert repr(encoder) == "Part('model.encoder', units 0-17)"


@pytest.mark.parametrize("pipeline", [*PIPELINES, "preload"])
def test_a_decoding_loop_of_encoder_part_and_decoder_steps_gives_the_models_logits(bart, pipeline: str):
    directory, manifest, model, ids = bart
    with torch.no_grad():
        encoded = model.model.encoder(ids)
    budget = None if pipeline == "preload" else _budget(manifest, pipeline)
    with load(directory, pipeline=pipeline, budget=budget) as engine:
        got = engine.part("model.encoder")(ids)
        assert torch.equal(got.last_hidden_state, encoded.last_hidden_state)
        tokens = torch.full((2, 1), 2)
        cache = expected_cache = None
        for n in range(4):  # the first step computes cross-attention keys, later ones skip them
            step = tokens[:, -1:]
            out = engine(encoder_outputs=got, decoder_input_ids=step, past_key_values=cache, use_cache=True)
            with torch.no_grad():
                want = model(encoder_outputs=encoded, decoder_input_ids=step, past_key_values=expected_cache, use_cache=True)
            assert torch.equal(out.logits, want.logits)
            if budget is not None:
                assert engine.last_weights_peak <= budget
            if n >= 2:  # as the step before: the reader does not read the projections skipped
                assert engine.last_skipped == (0, 0) if pipeline == "preload" else (4, 0)
            cache, expected_cache = out.past_key_values, want.past_key_values
            tokens = torch.cat([tokens, out.logits[:, -1:].argmax(-1)], dim=1)
        if pipeline != "preload":  # a later step skips each decoder layer's cross-attention k and v
            assert engine.last_skipped[0] == 2 * 2
        assert torch.equal(engine(ids).logits, model(ids).logits)  # a whole pass still runs


MODES = {
    "greedy": {"do_sample": False},
    "sampling": {"do_sample": True, "top_k": 20, "temperature": 0.8},
    "beams": {"do_sample": False, "num_beams": 3},
}


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("mode", list(MODES))
def test_generate_on_an_encoder_decoder_gives_the_models_tokens_and_scores(bart, pipeline: str, mode: str):
    directory, manifest, model, ids = bart
    options = {**MODES[mode], "max_new_tokens": 6, "min_new_tokens": 6, "output_scores": True,
               "return_dict_in_generate": True}  # fmt: skip
    torch.manual_seed(11)
    expected = model.generate(ids, **options)
    budget = _budget(manifest, pipeline)
    with load(directory, pipeline=pipeline, budget=budget) as engine:
        torch.manual_seed(11)
        got = engine.generate(ids, **options)
        assert engine.last_weights_peak <= budget
        assert "forward" not in vars(engine.model) and "forward" not in vars(engine.model.model.encoder)
    assert got.sequences.shape == (2, 7)
    assert torch.equal(got.sequences, expected.sequences)
    assert len(got.scores) == len(expected.scores) == 6
    for g, e in zip(got.scores, expected.scores, strict=True):
        assert torch.equal(g, e)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_generate_with_a_copy_stage_skips_on_the_device_buffer_too(bart, pipeline: str):
    directory, manifest, model, ids = bart
    options = {"max_new_tokens": 5, "min_new_tokens": 5, "num_beams": 2, "do_sample": False,
               "output_scores": True, "return_dict_in_generate": True}  # fmt: skip
    expected = model.generate(ids, **options)
    budget = _budget(manifest, pipeline) + (1 if pipeline == "sequential" else 2) * manifest.largest_unit_bytes
    with load(directory, pipeline=pipeline, budget=budget, stages=3) as engine:
        got = engine.generate(ids, **options)
        assert engine.memory.device_buffer_bytes > 0
        assert engine.last_weights_peak <= budget
        assert engine.last_skipped[0] == 4
    assert torch.equal(got.sequences, expected.sequences)
    assert all(torch.equal(g, e) for g, e in zip(got.scores, expected.scores, strict=True))


@pytest.mark.parametrize("read_ahead", [False, True])
def test_generate_reads_the_encoder_once_and_the_decoder_per_step(bart, read_ahead):
    directory, manifest, model, ids = bart
    passes: list[tuple[int | None, int, int]] = []
    adopted: list[int] = []
    with load(directory, pipeline="async", budget=_budget(manifest, "async") * 4, read_ahead=read_ahead) as engine:
        run_pass = engine.run_pass

        def spy(source, forward, args, kwargs, units=None):
            finish_read_ahead(engine)  # what a pass adopts does not depend on timing
            out = run_pass(source, forward, args, kwargs, units)
            passes.append((None if units is None else units.stop, *engine.last_skipped))
            adopted.append(engine.last_read_ahead)
            return out

        engine.run_pass = spy
        for _ in range(2):
            engine.generate(ids, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    # the encoder's pass, then a decoder step per token: the first computes the
    # cross-attention keys and values, the later ones skip those 4 units
    assert [(stop, skipped) for stop, skipped, _ in passes] == [(18, 0), (None, 0), (None, 4), (None, 4), (None, 4)] * 2
    # The second generate expects each step's skips (after the encoder's pass: none; after
    # a step: the projections), so the reader reads none of them for nothing.
    if not read_ahead:
        assert [wasted for _, _, wasted in passes[5:]] == [0] * 5, passes
        assert adopted == [0] * 10
        return
    # Read ahead: after the encoder's pass a step's first units, after a step the next
    # step's (without the projections it skips), each adopted and none read for nothing.
    # After the last step of the first generate a step was expected, and the encoder's
    # pass came: what was read ahead for it is given back (the only bytes read for nothing).
    assert [wasted for _, _, wasted in passes[6:]] == [0] * 4, passes
    assert all(a > 0 for a in adopted[6:]), adopted
    assert passes[5][2] > 0 and adopted[5] == 0


@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("encoder_decoder") / "whisper"
    features = example_input((2, 8, 32), seed=6)  # 8 mel bins, 32 frames
    example = {"input_features": features[:1], "decoder_input_ids": torch.tensor([[0, 5, 7]])}
    manifest = prepare("tinymodels:tiny_whisper", directory, example=example)
    assert (manifest.input_shape, manifest.input_dtype) == ((1, 8, 32), "float32")
    return directory, manifest, tinymodels.tiny_whisper(), features


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("mode", ["greedy", "beams"])
def test_whisper_prepared_with_an_example_of_both_inputs_generates_the_models_tokens(whisper, pipeline: str, mode: str):
    directory, manifest, model, features = whisper
    options = {**MODES[mode], "max_new_tokens": 5, "min_new_tokens": 5, "output_scores": True,
               "return_dict_in_generate": True}  # fmt: skip
    expected = model.generate(features, **options)
    budget = _budget(manifest, pipeline)
    with load(directory, pipeline=pipeline, budget=budget) as engine:
        assert engine.part("model.encoder").units.start == 0
        got = engine.generate(features, **options)
        assert engine.last_weights_peak <= budget
    assert torch.equal(got.sequences, expected.sequences)
    for g, e in zip(got.scores, expected.scores, strict=True):
        assert torch.equal(g, e)


@pytest.mark.parametrize(("factory", "encoder"), [("tiny_t5", "encoder"), ("tiny_marian", "model.encoder")])
def test_t5_and_marian_generate_the_models_beams(tmp_path: Path, factory: str, encoder: str):
    ids = example_input((2, 8), "int64", seed=3) % 97 + 3
    example = {"input_ids": ids[:1], "decoder_input_ids": torch.tensor([[0, 4]])}
    manifest = prepare(f"tinymodels:{factory}", tmp_path / factory, example=example)
    model = getattr(tinymodels, factory)()
    options = {"max_new_tokens": 5, "min_new_tokens": 5, "num_beams": 2, "do_sample": False,
               "output_scores": True, "return_dict_in_generate": True}  # fmt: skip
    expected = model.generate(ids, **options)
    for pipeline in ("async", "auto"):
        with load(tmp_path / factory, pipeline=pipeline, budget=_budget(manifest, pipeline)) as engine:
            got = engine.generate(ids, **options)
            assert engine.part(encoder).units.start == 0
            assert engine.last_skipped[0] == 4  # each decoder layer's cross-attention k and v
        assert torch.equal(got.sequences, expected.sequences)
        assert all(torch.equal(g, e) for g, e in zip(got.scores, expected.scores, strict=True))


def test_the_skeleton_reports_the_engines_device_and_other_instances_keep_theirs(whisper):
    directory, _, model, _ = whisper
    with load(directory, pipeline="async") as engine:
        assert engine.model.device == torch.device("cpu")  # its parameters are on meta
        assert next(engine.model.parameters()).device.type == "meta"
        assert type(engine.model).__name__ == "WhisperForConditionalGeneration"
        assert isinstance(engine.model, type(model)) and type(engine.model) is not type(model)
    with torch.device("meta"):
        other = tinymodels.tiny_whisper()
    assert other.device.type == "meta"


def test_a_part_that_is_not_a_submodule_or_not_one_run_of_units_is_refused(bart, tmp_path: Path):
    directory, manifest, model, ids = bart
    with load(directory, pipeline="async") as engine:
        with pytest.raises(InputError, match="no submodule 'model.encoderr' .*children: model, lm_head"):
            engine.part("model.encoderr")
        with (
            load(directory, pipeline="async", units="blocks:3") as merged,
            pytest.raises(InputError, match="holds layers inside and outside model.encoder"),
        ):
            merged.part("model.encoder")
        assert torch.equal(engine(ids).logits, model(ids).logits)  # the engine still runs
    spec = ModelSpec("factory", "tinymodels:borrows", {"interleave": True})
    prepare(spec, tmp_path / "interleaved", input_shape=(2, 8))
    with load(tmp_path / "interleaved", pipeline="async") as engine:
        assert [b.name for b in engine.blocks] == ["first", "outer.x", "mid", "outer.y"]
        with pytest.raises(InputError, match=r"units of outer are not contiguous .*unit 2, mid, runs between"):
            engine.part("outer")


def test_a_part_that_runs_a_unit_outside_it_is_refused_and_the_engine_runs_on(tmp_path: Path):
    prepare("tinymodels:borrows", tmp_path / "m", input_shape=(2, 8))
    model = tinymodels.borrows()
    h = example_input((2, 8))
    with load(tmp_path / "m", pipeline="async") as engine:
        outer = engine.part("outer")
        assert outer.units == range(1, 3)
        with pytest.raises(LayerfitError, match=r"unit 3 \(mid\) runs, but this pass streams units 1-2"):
            outer(h, engine.model.mid)
        with torch.no_grad():
            assert torch.equal(engine(h), model(h))


def test_the_encoder_and_the_cross_attention_projections_run_once_per_input(bart):
    from layerfit.engine.part_units import DECODER_RUNS, unit_runs

    directory, _, _, _ = bart
    with load(directory, pipeline="async") as engine:
        runs = unit_runs(engine.model, engine.blocks)
    once = [b.name for b, r in zip(engine.blocks, runs, strict=True) if r == 1]
    assert once[:18] == [b.name for b in engine.blocks[:18]]  # the encoder
    assert once[18:] == [f"model.decoder.layers.{n}.encoder_attn.{p}_proj" for n in range(2) for p in "kv"]
    assert runs.count(DECODER_RUNS) == len(runs) - 22


def test_auto_keeps_the_decoder_first_as_it_runs_per_token_and_inspect_plans_the_same(bart):
    from typer.testing import CliRunner

    from layerfit.cli import app

    directory, manifest, model, ids = bart
    budget = manifest.resident_bytes + (manifest.total_bytes - manifest.resident_bytes) // 3
    with load(directory, pipeline="auto", budget=budget) as engine:
        encoder = engine.part("model.encoder").units
        kept = engine.kept_units
        decoder_kept = [i for i in kept if i not in encoder]
        assert decoder_kept and sum(engine.blocks[i].nbytes for i in decoder_kept) > sum(
            engine.blocks[i].nbytes for i in kept if i in encoder
        )
        assert torch.equal(engine.generate(ids, max_new_tokens=3, do_sample=False), model.generate(ids, max_new_tokens=3, do_sample=False))
    out = CliRunner().invoke(app, ["inspect", str(directory), "--budget", str(budget), "--json"])
    assert out.exit_code == 0, out.output
    import json

    assert json.loads(out.output)["auto_plan"]["kept_units"] == list(kept)


# --- any pattern of skipped units ---------------------------------------------------------


@pytest.mark.parametrize("read_ahead", [False, True])
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_unit_the_last_pass_skipped_runs_and_is_read_then(skips, pipeline: str, read_ahead: bool):
    directory, manifest, model = skips
    x = example_input((2, 8), seed=9)
    skip_one = x.clone()
    skip_one[0, 1] = 0  # before.1 does not run
    with load(directory, pipeline=pipeline, budget=manifest.total_bytes // 2, trace=True,
              read_ahead=read_ahead) as engine:
        last = None
        for inputs, skipped in [(skip_one, 1), (x, 0), (skip_one, 1), (skip_one, 1), (x, 0)]:
            with torch.no_grad():
                want = model(inputs)
            assert torch.equal(_call(engine, inputs), want)
            assert engine.last_skipped[0] == skipped
            read = 1 in {e.unit for e in engine.last_timeline.events if e.stage == "read"}
            if 1 in engine.kept_units:
                assert not read
            elif skipped == 0:  # it runs: read, at once or (the last pass skipped it) when it runs
                assert read
            elif last == 1:  # skipped as in the last pass: not read at all
                assert not read and engine.last_skipped[1] == 0
            last = skipped


def _call(engine, x: torch.Tensor, seconds: float = 30.0):
    """``engine(x)`` in a thread: a hang fails the test instead of stalling the run, and
    what the call raised is raised here (a thread would only print it)."""
    box: list = []

    def call() -> None:
        try:
            box.append(engine(x))
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            box.append(exc)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the engine hangs"
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


@pytest.fixture(scope="module")
def skips(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("skips") / "m"
    manifest = prepare("tinymodels:skips_layers", directory, input_shape=(2, 8))
    return directory, manifest, tinymodels.skips_layers().eval()


@settings(max_examples=60, deadline=None)
@given(
    pipeline=st.sampled_from(PIPELINES),
    stages=st.sampled_from([2, 3]),
    slack=st.integers(0, 40_000),
    coalesce=st.sampled_from([0, 1 << 20]),
    patterns=st.lists(st.lists(st.booleans(), min_size=9, max_size=9), min_size=1, max_size=4),
    read_ahead=st.booleans(),
)
def test_any_units_skipped_give_the_models_output_within_the_budget(
    skips, pipeline: str, stages: int, slack: int, coalesce: int, patterns: list[list[bool]], read_ahead: bool
):
    directory, manifest, model = skips
    copies = 1 if pipeline == "sequential" else 2
    if stages == 3:  # a read and a device buffer of the largest unit (the table's rows need less)
        copies *= 2
        largest = manifest.largest_unit_bytes
    else:
        largest = streamed_minimum(manifest.units)
    budget = manifest.resident_bytes + copies * largest + slack
    with load(directory, pipeline=pipeline, budget=budget, coalesce=coalesce, stages=stages,
              read_ahead=read_ahead) as engine:
        for runs in patterns:
            x = example_input((2, 8), seed=len(patterns))
            x[0, :5] *= torch.tensor(runs[:5])  # a zero skips that layer
            x[1, :4] *= torch.tensor(runs[5:])
            with torch.no_grad():
                want = model(x)
            assert torch.equal(_call(engine, x), want)
            assert engine.last_weights_peak <= budget
            first = runs.index(True) if any(runs[:5]) else 5  # the table always runs
            streamed_after = [r for r in runs[first:5]] + [True, True] + runs[5:]  # table, head
            # (auto may keep every weight: preload binds them all and counts no skips)
            assert engine.last_skipped[0] == (0 if engine.policy.name == "preload" else streamed_after.count(False))


@pytest.mark.parametrize("read_ahead", [False, True])
def test_a_table_read_by_rows_waits_for_a_skipped_unit_still_being_read(skips, monkeypatch, read_ahead):
    """The table runs while the reader still reads a unit the pass skipped: its rows take
    their place in the ring only once that read is given back (placed after it, they
    were given back first and the ring, oldest first, refused: seen under load as an
    intermittent failure of the test above). Read ahead, the table's place is reserved
    in its turn."""
    directory, manifest, model = skips
    budget = manifest.resident_bytes + 2 * streamed_minimum(manifest.units) + 20_000
    with load(directory, pipeline="async", budget=budget, coalesce=0, read_ahead=read_ahead) as engine:
        last_before = [b.name for b in engine.blocks].index("before.4")
        read_units = engine.units.read_units  # the reader thread's reads

        def slow_read(i: int, stop: int, view: memoryview) -> list[int]:
            if i == last_before:
                time.sleep(0.3)  # the kernels get to the table meanwhile
            return read_units(i, stop, view)

        monkeypatch.setattr(engine.units, "read_units", slow_read)
        for seed in (1, 2, 3):  # the first pass, and passes expecting the skip
            x = example_input((2, 8), seed=seed)
            x[0, 4] = 0  # before.4 is skipped
            with torch.no_grad():
                want = model(x)
            assert torch.equal(_call(engine, x), want)
            engine.stream.drop_read_ahead()  # what it holds after the pass is the next one's
            assert engine.ring.in_use == 0 or read_ahead
            assert engine.last_weights_peak <= budget
