"""SwapNet at run time: profile, partitioned runs, adaptation, several models, CLI.

Every mode must give exactly ``model(x)``; every run must stay within its budget as
the budget counts it (weights ledger + reserve).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import tinymodels
import torch

from layerfit.cli import main
from layerfit.errors import BudgetError, LayerfitError, PartitionError, ProfileError, ProfileWarning
from layerfit.store import ModelSpec, example_input, prepare
from layerfit.tradeoff.swapnet.budget_split import model_names, split_between_models
from layerfit.tradeoff.swapnet.model import SwapNet, set_budgets
from layerfit.tradeoff.swapnet.partition import SwapNetPlan
from layerfit.tradeoff.swapnet.profile import (
    device_fingerprint,
    load_profile,
    model_key,
    profile_for,
    profile_models,
)

WIDTHS = [64, 256, 32, 200, 48, 128, 16]


@pytest.fixture(scope="module")
def chain(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("swapnet") / "chain"
    prepare(ModelSpec("factory", "tinymodels:chain", {"widths": WIDTHS}), out, input_shape=(2, WIDTHS[0]))
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("swapnet") / "tiny"
    prepare("tinymodels:tiny_cnn", out, input_shape=(1, 3, 16, 16))
    return out


@pytest.fixture(scope="module")
def profile(chain: Path, tiny: Path):
    return profile_models([chain, tiny], repeats=1, warmup=0)


@pytest.fixture(scope="module")
def profile_file(profile, tmp_path_factory) -> Path:
    return profile.save(tmp_path_factory.mktemp("profile") / "device-profile.json")


def chain_reference():
    x = example_input((2, WIDTHS[0]))
    with torch.no_grad():
        return x, tinymodels.chain(WIDTHS).eval()(x)


def tiny_reference():
    x = example_input((1, 3, 16, 16))
    with torch.no_grad():
        return x, tinymodels.tiny_cnn().eval()(x)


# --- profile ---------------------------------------------------------------------------


def test_profile_fits_every_coefficient_and_round_trips(profile, profile_file: Path):
    for c in (profile.alpha, profile.beta, profile.gamma, profile.eta, profile.kappa_read, profile.kappa_exec):
        assert c >= 0
    assert set(profile.fits) == {"t_in", "t_in_paper", "t_ex", "t_out"}
    assert profile.fits["t_in"].samples == 6 + 6  # six layers in each model
    assert len(profile.models) == 2
    again = load_profile(profile_file)
    assert again.alpha == profile.alpha and again.kappa_exec == profile.kappa_exec
    assert again.device == device_fingerprint()
    times = next(iter(again.models.values()))
    assert len(times.kernel_s) == len(times.read_s) == len(times.bind_s) == len(times.glue_s)


def _rewrite(path: Path, target: Path, **change) -> Path:
    data = json.loads(path.read_text())
    for key, value in change.items():
        if key == "cpu":
            data["device"]["cpu"] = value
        else:
            data[key] = value
    target.write_text(json.dumps(data))
    return target


def test_profile_from_another_device_warns_and_measures(chain: Path, profile_file: Path, tmp_path: Path):
    other = _rewrite(profile_file, tmp_path / "other.json", cpu="Some Other CPU")
    with pytest.warns(ProfileWarning, match="another device"):
        prof = profile_for(chain, other, repeats=1)
    assert prof.device == device_fingerprint()
    assert list(prof.models) == [model_key(SwapNetPlan.build(chain, prof).manifest)]


def test_profile_of_another_format_version_or_missing_warns(chain: Path, profile_file: Path, tmp_path: Path):
    old = _rewrite(profile_file, tmp_path / "old.json", version=99)
    with pytest.warns(ProfileWarning, match="format version 99"):
        profile_for(chain, old, repeats=1)
    with pytest.warns(ProfileWarning, match="no device profile"):
        profile_for(chain, tmp_path / "missing.json", repeats=1)


def test_profiled_model_uses_measured_times_others_the_regression(chain: Path, tiny: Path, profile, tmp_path: Path):
    assert SwapNetPlan.build(chain, profile).costs.exec_source == "measured"
    other = tmp_path / "tiny32"
    prepare("tinymodels:tiny_cnn", other, input_shape=(1, 3, 32, 32))
    assert SwapNetPlan.build(other, profile).costs.exec_source == "regression"


# --- partition ---------------------------------------------------------------------------


def test_every_budget_runs_bit_identical_within_budget(chain: Path, profile):
    x, y = chain_reference()
    plan = SwapNetPlan.build(chain, profile)
    low, high = plan.minimum_budget, plan.demand
    streamed = 0
    for budget in (low, low + 4096, (low + high) // 2, high - 1, high):
        with SwapNet(chain, budget, plan=plan) as model:
            for _ in range(2):
                assert torch.equal(model(x), y)
            assert model.accounted_peak_bytes <= budget
            assert (model.decision.pipeline == "preload") == (budget >= high)
            if model.decision.pipeline == "async":
                streamed += 1
                assert model.decision.choice.blocks >= 2
                assert model.decision.choice.max_pair_bytes <= model.decision.capacity
    assert streamed >= 3


def test_the_reserve_counts_what_the_eager_pass_holds(tiny: Path, profile):
    """SwapNet's engine lets PyTorch allocate: eager batch norm writes its own output,
    which the planner's arena (from the usage records) would reuse."""
    from layerfit.store import read_manifest
    from layerfit.tradeoff.swapnet.partition import planned_arena_bytes

    graph = read_manifest(tiny).graph
    plan = SwapNetPlan.build(tiny, profile)
    assert graph.pass_peak_bytes > planned_arena_bytes(graph)
    assert plan.reserve.activations == graph.pass_peak_bytes


def test_infeasible_budget_names_the_layer_and_the_minimum(chain: Path, profile):
    plan = SwapNetPlan.build(chain, profile)
    with pytest.raises(PartitionError) as info:
        SwapNet(chain, plan.minimum_budget - 1, plan=plan)
    err = info.value
    assert isinstance(err, BudgetError)
    assert err.minimum_budget == plan.minimum_budget
    assert err.layer in plan.costs.names
    assert f"{plan.minimum_budget} bytes" in str(err) and repr(err.layer) in str(err)
    # the named layer is the larger of the heaviest adjacent pair
    s = plan.costs.nbytes
    pair = int((s[:-1] + s[1:]).argmax())
    assert err.layer == plan.costs.names[pair if s[pair] >= s[pair + 1] else pair + 1]


@pytest.mark.parametrize("binding", ["copy", "instantiate"])
def test_ablation_binding_modes_are_bit_identical_and_cost_memory(chain: Path, profile, binding: str):
    x, y = chain_reference()
    plan = SwapNetPlan.build(chain, profile)
    budget = (plan.minimum_budget + plan.demand) // 2
    with SwapNet(chain, budget, plan=plan) as ref, SwapNet(chain, budget, plan=plan, binding=binding) as ablated:
        assert torch.equal(ablated(x), y) and torch.equal(ref(x), y)
        assert ablated.engine.last_weights_peak > ref.engine.last_weights_peak


# --- adaptation --------------------------------------------------------------------------


def test_adaptation_respects_the_budget_before_and_after(chain: Path, profile):
    x, y = chain_reference()
    plan = SwapNetPlan.build(chain, profile)
    first = plan.demand - 4096
    second = plan.minimum_budget + 4096
    with SwapNet(chain, first, plan=plan) as model:
        assert torch.equal(model(x), y)
        assert model.accounted_peak_bytes <= first
        before = model.decision
        change = model.set_budget(second)
        assert change.previous == before and change.current.budget == second
        assert change.seconds > 0 and change.lookup_s < change.seconds
        assert torch.equal(model(x), y)
        assert model.accounted_peak_bytes <= second
        # below the minimum: refused, the old partition keeps running within its budget
        with pytest.raises(PartitionError, match="minimum"):
            model.set_budget(plan.minimum_budget - 4096)
        assert model.decision == change.current
        assert torch.equal(model(x), y)
        assert model.accounted_peak_bytes <= second
        # and back up to everything resident
        model.set_budget(plan.demand)
        assert model.decision.pipeline == "preload"
        assert torch.equal(model(x), y)


# --- several models ----------------------------------------------------------------------


def run_concurrently(calls) -> list:
    """Each call once, all at once, one thread each; their outputs (a thread's error raised here)."""
    outputs, errors = [None] * len(calls), []
    barrier = threading.Barrier(len(calls))

    def work(i: int) -> None:
        try:
            barrier.wait()
            outputs[i] = calls[i]()
        except BaseException as exc:
            barrier.abort()
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return outputs


def test_several_models_run_concurrently_within_the_eq1_split(chain: Path, tiny: Path, profile):
    (xc, yc), (xt, yt) = chain_reference(), tiny_reference()
    plans = [SwapNetPlan.build(chain, profile), SwapNetPlan.build(tiny, profile)]
    urgencies = [2.0, 1.0]
    total = sum(p.minimum_budget for p in plans) + 3 * 4096
    budgets = split_between_models(total, plans, urgencies)
    assert sum(budgets) == total
    for budget, plan in zip(budgets, plans, strict=True):
        assert plan.minimum_budget <= budget <= plan.demand
    assert split_between_models(None, plans) == [p.demand for p in plans]
    with SwapNet(chain, budgets[0], plan=plans[0]) as c, SwapNet(tiny, budgets[1], plan=plans[1]) as t:
        for _ in range(2):
            yc2, yt2 = run_concurrently([lambda: c(xc), lambda: t(xt)])
            assert torch.equal(yc2, yc) and torch.equal(yt2, yt)
            assert c.accounted_peak_bytes <= budgets[0] and t.accounted_peak_bytes <= budgets[1]
        # a larger total: demands that fit are given in full
        budgets = split_between_models(sum(p.demand for p in plans), plans, urgencies)
        assert budgets == [p.demand for p in plans]
        set_budgets([c, t], budgets)
        assert [c.budget, t.budget] == budgets
        yc2, yt2 = run_concurrently([lambda: c(xc), lambda: t(xt)])
        assert torch.equal(yc2, yc) and torch.equal(yt2, yt)
        # a total below the minimums is refused; budgets one model cannot run within
        # leave every model as it was
        with pytest.raises(BudgetError, match="below the sum of the models' minimum budgets"):
            split_between_models(total // 2, plans, urgencies)
        decisions = [c.decision, t.decision]
        with pytest.raises(PartitionError):
            set_budgets([c, t], [plans[0].minimum_budget, plans[1].minimum_budget - 1])
        assert [c.decision, t.decision] == decisions


def test_the_split_refuses_bad_urgencies_and_names_replicas(chain: Path, tiny: Path, profile):
    plans = [SwapNetPlan.build(chain, profile), SwapNetPlan.build(tiny, profile)]
    total = sum(p.minimum_budget for p in plans)
    for bad in (0, -1.0, float("nan"), "high"):
        with pytest.raises(LayerfitError, match="urgency .* finite number above 0"):
            split_between_models(total, plans, [1.0, bad])
    with pytest.raises(LayerfitError, match="1 urgencies for 2 models"):
        split_between_models(total, plans, [1.0])
    assert model_names([plans[0], plans[1], plans[0]]) == [f"{plans[0].name}#1", plans[1].name, f"{plans[0].name}#2"]


# --- command line ------------------------------------------------------------------------


def test_cli_profile_partition_and_run(chain: Path, tmp_path: Path, capsys, monkeypatch):
    prof = tmp_path / "p.json"
    assert main(["profile", str(chain), "--profile", str(prof), "--repeats", "1", "--warmup", "0", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"t_in", "t_ex", "t_out"} <= set(data["fits"]) and prof.is_file()
    plan = SwapNetPlan.build(chain, load_profile(prof))
    budget = str((plan.minimum_budget + plan.demand) // 2)
    assert main(["partition", str(chain), "--budget", budget, "--profile", str(prof), "--repeats", "1", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["decision"]["pipeline"] == "async" and rep["dp"]["predicted_s"] <= rep["decision"]["predicted_s"] + 1e-12
    assert rep["measured"]["chosen"]["accounted_peak_bytes"] <= int(budget)
    assert main(["partition", str(chain), "--budget", "1kB", "--profile", str(prof), "--no-measure"]) == 2
    err = capsys.readouterr().err
    assert "minimum budget" in err and str(plan.minimum_budget) in err
    # run --units swapnet reads the default profile: point it at a fresh cache
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert main(["run", str(chain), "--units", "swapnet", "--budget", budget, "--repeats", "1", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["pipeline"] == "async"
    assert "warning: no device profile" in out.err  # measured instead, and said so
    assert main(["run", str(chain), "--units", "swapnet"]) == 2
    assert "--budget" in capsys.readouterr().err


@pytest.mark.parametrize("replace", [False, True])
def test_cli_profile_never_overwrites_a_file_that_is_not_a_profile(chain: Path, tmp_path: Path, capsys, replace: bool):
    notes = tmp_path / "notes.json"
    notes.write_text('{"my": "notes"}')
    argv = ["profile", str(chain), "--profile", str(notes), "--repeats", "1", "--warmup", "0"]
    assert main(argv + (["--replace"] if replace else [])) == 2
    assert "not a layerfit device profile" in capsys.readouterr().err
    assert notes.read_text() == '{"my": "notes"}'


@pytest.mark.parametrize("target", ["adir", "afile/p.json"])
def test_cli_profile_to_an_unwritable_path_fails_before_measuring(chain: Path, tmp_path: Path, capsys, monkeypatch, target):
    import layerfit.tradeoff.swapnet.profile as swapnet_profile

    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    monkeypatch.setattr(swapnet_profile, "profile_models", lambda *a, **k: pytest.fail("measured before checking"))
    assert main(["profile", str(chain), "--profile", str(tmp_path / target)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and ("is a directory" in err or "is not a directory" in err)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d.update(fits=[]), "fits: expected a mapping"),
        (lambda d: d.update(models=[1]), "models: expected a mapping"),
        (lambda d: d["coefficients"].update(alpha_s_per_byte=float("nan")), "coefficients.alpha_s_per_byte"),
        (lambda d: d["coefficients"].update(gamma_s_per_mac=-1.0), "coefficients.gamma_s_per_mac"),
        (lambda d: d.update(coefficients=None), "coefficients: expected a mapping"),
        (lambda d: next(iter(d["models"].values())).update(kernel_s=[1.0]), r"\.kernel_s: expected a list of 6"),
        (lambda d: next(iter(d["models"].values())).update(glue_s=["x"] * 6), r"\.glue_s\[0\]"),
        (lambda d: next(iter(d["models"].values())).update(colour=1), r"\.colour: unknown field; known: "),
    ],
)
def test_malformed_profile_names_the_file_and_field(chain: Path, profile_file: Path, tmp_path: Path, capsys, change, field):
    data = json.loads(profile_file.read_text())
    change(data)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))  # NaN is written as the bare token NaN, as a hand edit might
    with pytest.raises(ProfileError, match=field):
        load_profile(bad)
    code = main(["partition", str(chain), "--budget", "1MB", "--profile", str(bad), "--no-measure", "--json"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "bad.json is malformed" in err and "Traceback" not in err


# --- a model prepared from keyword arguments ----------------------------------------------


def test_a_model_prepared_from_keyword_arguments_is_profiled_partitioned_and_run(chain: Path, tmp_path: Path):
    # Whisper's forward takes features and decoder ids: profiling, the partition's measured
    # latency and a SwapNet run beside another model call it with the keywords it was
    # prepared from.
    from layerfit.engine import flat_outputs
    from layerfit.store import example_call
    from layerfit.tradeoff.swapnet.model import partition_report

    example = {"input_features": example_input((1, 8, 32), seed=6), "decoder_input_ids": torch.tensor([[0, 5, 7]])}
    manifest = prepare("tinymodels:tiny_whisper", tmp_path / "whisper", example=example)
    profile = profile_models([tmp_path / "whisper", chain], repeats=1, warmup=0)
    assert model_key(manifest) in profile.models
    plan = SwapNetPlan.build(tmp_path / "whisper", profile)
    report = partition_report(tmp_path / "whisper", plan.minimum_budget, profile=profile, repeats=1, warmup=0)
    assert report["measured"]["chosen"]["latency_s"] > 0
    with torch.no_grad():
        model = tinymodels.tiny_whisper()
        expected = [flat_outputs(model(**call)) for call in (dict(example), manifest_call(manifest))]
    (xc, yc) = chain_reference()
    chain_plan = SwapNetPlan.build(chain, profile)
    budgets = split_between_models(plan.minimum_budget + chain_plan.minimum_budget, [plan, chain_plan])
    with SwapNet(tmp_path / "whisper", budgets[0], plan=plan) as w, SwapNet(chain, budgets[1], plan=chain_plan) as c:
        out, yc2 = run_concurrently([lambda: w(**example), lambda: c(xc)])  # keyword arguments
        assert all(torch.equal(a, b) for a, b in zip(flat_outputs(out), expected[0], strict=True))
        assert torch.equal(yc2, yc)
        args, kwargs = example_call(plan.manifest)  # the keyword arguments it was prepared from
        out = w(*args, **kwargs)
        assert all(torch.equal(a, b) for a, b in zip(flat_outputs(out), expected[1], strict=True))
        assert w.accounted_peak_bytes <= budgets[0] and c.accounted_peak_bytes <= budgets[1]


def manifest_call(manifest) -> dict[str, torch.Tensor]:
    from layerfit.store import example_call

    args, kwargs = example_call(manifest)
    assert args == () and set(kwargs) == {"input_features", "decoder_input_ids"}
    return kwargs
