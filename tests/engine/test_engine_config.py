"""EngineConfig and Budget: settings read once at the boundary, one default each; plan()
is the engine's own plan, computed without loading anything."""

from __future__ import annotations

import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from layerfit.engine import load
from layerfit.engine.config import EngineConfig
from layerfit.engine.plan import plan
from layerfit.engine.skeleton import build_skeleton
from layerfit.errors import BudgetError, LayerfitError
from layerfit.sizes import Budget, format_bytes
from layerfit.store import read_manifest


def test_one_default_pipeline_for_the_api_the_engine_and_the_command_line(tiny: Path) -> None:
    from layerfit.cli.engine_options import engine_default

    assert EngineConfig().pipeline == "auto" == engine_default("pipeline")
    with load(tiny) as engine:  # no budget: auto holds every weight
        assert engine.pipeline == "auto" and engine.policy.name == "preload"
    with load(tiny, budget="50%") as engine:
        assert engine.policy.name == "async"


def test_the_command_line_reads_engine_defaults_without_torch() -> None:
    code = (
        "import sys; from layerfit.cli.engine_options import engine_default as d; "
        "assert 'torch' not in sys.modules, 'torch imported'; print(d('pipeline'), d('device'), d('stages'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["auto", "cpu", "None"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"verify": "sometimes"}, "verify must be one of"),
        ({"pipeline": "fast"}, "unknown pipeline"),
        ({"binding": "glue"}, "unknown binding mode"),
        ({"activations": "arena"}, "unknown activations mode"),
        ({"units": "merge:auto"}, "merge:auto"),
        ({"device": "cuda", "activations": "planned"}, "host memory"),
    ],
)
def test_a_bad_setting_is_refused_when_the_config_is_made(options: dict, message: str) -> None:
    with pytest.raises(LayerfitError, match=message):
        EngineConfig(**options)


def test_parse_reads_text_once_into_typed_fields() -> None:
    config = EngineConfig.parse(budget="50%", units=[0, 3], coalesce="1MiB")
    assert config.budget == Budget(percent=Decimal(50)) and config.units == (0, 3)
    assert config.coalesce_bytes == 2**20 and EngineConfig.parse(coalesce="0").coalesce_bytes == 0
    with pytest.raises(BudgetError, match="e.g. 50%"):
        EngineConfig.parse(budget="a lot")


@given(st.integers(min_value=0, max_value=2**62), st.integers(min_value=1, max_value=2**40))
def test_a_byte_budget_is_those_bytes_for_any_model(nbytes: int, weights: int) -> None:
    budget = Budget.parse(nbytes)
    assert not budget.is_share and budget.bytes_for(weights) == nbytes
    assert Budget.parse(str(budget)) == budget == Budget.parse(budget)


@given(st.integers(min_value=0, max_value=10_000), st.integers(min_value=0, max_value=2**40))
def test_a_share_becomes_bytes_only_once_the_model_is_known(hundredths: int, weights: int) -> None:
    budget = Budget.parse(f"{hundredths // 100}.{hundredths % 100:02d}%")
    assert budget.is_share and budget.bytes_for(weights) == hundredths * weights // 10_000
    assert Budget.parse(str(budget)) == budget


def test_a_budget_is_bytes_or_a_share_never_both() -> None:
    with pytest.raises(BudgetError):
        Budget(nbytes=1, percent=Decimal(1))
    with pytest.raises(BudgetError):
        Budget()


@pytest.mark.parametrize("options", [
    {"budget": "50%"}, {"budget": "70%", "units": "blocks:3"}, {"pipeline": "async", "budget": 40_000},
    {"pipeline": "sync"}, {}, {"budget": "90%", "stages": 3},
])
def test_plan_is_the_plan_the_engine_runs(tiny: Path, options: dict) -> None:
    config = EngineConfig.parse(**options)
    manifest = read_manifest(tiny)
    made = plan(manifest, config, build_skeleton(manifest))
    if config.stages == 3:  # a copy stage needs a device copy; plan it only
        assert made.memory.device_buffer_bytes > 0
        return
    with load(tiny, config) as engine:
        assert engine.plan == made
        assert engine.memory == made.memory and engine.kept_units == tuple(sorted(made.weights.kept))


def test_a_share_below_the_minimum_names_the_bytes_it_is(tiny: Path) -> None:
    total = read_manifest(tiny).total_bytes
    with pytest.raises(BudgetError, match=rf"\(1% of its {re.escape(format_bytes(total))} of weights\)"):
        plan(read_manifest(tiny), EngineConfig.parse(budget="1%"))


def test_a_config_and_keyword_options_are_not_mixed(tiny: Path) -> None:
    with pytest.raises(LayerfitError, match="not both"):
        load(tiny, EngineConfig(), budget="50%")


def test_tracing_can_be_switched_between_passes(tiny: Path, reference) -> None:
    x, y = reference
    with load(tiny, pipeline="async", trace=True) as engine:
        assert torch.equal(engine(x), y) and engine.last_timeline is not None
        engine.trace = False
        engine.last_timeline = None
        assert torch.equal(engine(x), y) and engine.last_timeline is None
        assert engine.config.trace is False


def test_reconfigure_to_a_config_changes_budget_units_and_pipeline_only(tiny: Path, reference) -> None:
    x, y = reference
    with load(tiny, pipeline="async") as engine:
        target = engine.config.replace(budget=Budget.parse("80%"), pipeline="auto", units="blocks:2")
        engine.reconfigure(target)
        assert engine.config == target and len(engine.blocks) == 2 and torch.equal(engine(x), y)
        with pytest.raises(LayerfitError, match="binding, verify need a new load"):
            engine.reconfigure(target.replace(verify="always", binding="copy"))
        assert engine.config == target and torch.equal(engine(x), y)


def test_the_commands_that_load_a_model_declare_the_configs_defaults() -> None:
    """``run`` and ``tradeoff delay`` show EngineConfig's defaults (``--coalesce`` as the
    text that parses to EngineConfig.coalesce_bytes), and build the config they show."""
    import inspect

    from layerfit.cli.engine_options import OPTIONS, EngineOptions
    from layerfit.cli.models import run
    from layerfit.cli.tradeoff import tradeoff_delay

    for command in (run, tradeoff_delay):
        declared = {
            name: param.default.default
            for name, param in inspect.signature(command).parameters.items() if name in OPTIONS
        }
        assert declared and EngineOptions(declared, frozenset(), {}).config() == EngineConfig()
