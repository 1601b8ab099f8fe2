"""A memory limit bounds the whole process: parsed strictly, the cgroup's own limit found,
the footprint measured, and what it leaves spent on weights (issue #55)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import layerfit
from layerfit import memory_limit
from layerfit.errors import BudgetError, LayerfitError
from layerfit.memory_limit import (
    MIN_HEADROOM,
    Footprint,
    effective_limit,
    kv_bytes_per_token,
    machine_memory_bytes,
    parse_memory_limit,
)
from layerfit.sizes import parse_bytes

MB = 1000**2


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("800", "has no unit"),
        ("800.5", "has no unit"),
        ("40%", "is a share"),
        ("0MB", "holds nothing"),
        ("12 parsecs", "cannot read"),
        ("9000TB", "more than this machine's memory"),
    ],
)
def test_a_limit_that_means_nothing_is_one_line(text: str, says: str) -> None:
    with pytest.raises(BudgetError, match=says) as caught:
        parse_memory_limit(text)
    assert "\n" not in str(caught.value)


@given(st.integers(1, 4096), st.sampled_from(["MB", "MiB", "kB", "GB"]))
def test_a_size_with_its_unit_is_its_bytes_up_to_the_machine(number: int, unit: str) -> None:
    text = f"{number}{unit}"
    if parse_bytes(text) <= machine_memory_bytes():
        assert parse_memory_limit(text) == parse_bytes(text)
    else:
        with pytest.raises(BudgetError, match="more than this machine's memory"):
            parse_memory_limit(text)


def _cgroups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lines: str, limits: dict[str, str]) -> None:
    proc = tmp_path / "proc_cgroup"
    proc.write_text(lines)
    root = tmp_path / "cgroup"
    for relative, value in limits.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(value)
    monkeypatch.setattr(memory_limit, "_PROC_CGROUP", proc)
    monkeypatch.setattr(memory_limit, "_CGROUP_ROOT", root)


def test_the_lowest_limit_of_a_v1_cgroup_and_its_ancestors_holds(tmp_path, monkeypatch) -> None:
    _cgroups(tmp_path, monkeypatch, "5:cpu,cpuacct:/x\n4:memory:/user/job\n", {
        "memory/memory.limit_in_bytes": str(2**63 - 4096),  # the root: no limit
        "memory/user/memory.limit_in_bytes": str(700 * MB),
        "memory/user/job/memory.limit_in_bytes": str(900 * MB),
    })
    limit, where = memory_limit.cgroup_limit_bytes()
    assert limit == 700 * MB and where.parent.name == "user"
    assert effective_limit(800 * MB)[0] == 700 * MB
    assert "below the 800.0 MB asked: using 700.0 MB" in effective_limit(800 * MB)[1]
    assert effective_limit(600 * MB) == (600 * MB, None)


def test_the_room_left_is_the_least_over_the_cgroups_that_set_a_limit(tmp_path, monkeypatch) -> None:
    _cgroups(tmp_path, monkeypatch, "4:memory:/user/job\n", {
        "memory/memory.limit_in_bytes": str(2**63 - 4096),
        "memory/memory.usage_in_bytes": str(5000 * MB),
        "memory/user/memory.limit_in_bytes": str(900 * MB),
        "memory/user/memory.usage_in_bytes": str(700 * MB),
        "memory/user/job/memory.limit_in_bytes": str(800 * MB),
        "memory/user/job/memory.usage_in_bytes": str(500 * MB),
    })
    assert memory_limit.cgroup_room_bytes() == 200 * MB  # the parent's: 900 - 700, below the job's 300
    _cgroups(tmp_path, monkeypatch, "0::/app\n", {"memory.max": "max", "app/memory.max": str(512 * MB),
                                                   "app/memory.current": str(500 * MB)})
    assert memory_limit.cgroup_room_bytes() == 12 * MB


def test_a_v2_cgroup_says_max_for_no_limit(tmp_path, monkeypatch) -> None:
    _cgroups(tmp_path, monkeypatch, "0::/app\n", {"memory.max": "max", "app/memory.max": str(512 * MB)})
    assert memory_limit.cgroup_limit_bytes()[0] == 512 * MB
    _cgroups(tmp_path, monkeypatch, "0::/app\n", {"memory.max": "max", "app/memory.max": "max"})
    assert memory_limit.cgroup_limit_bytes() is None
    assert effective_limit(600 * MB) == (600 * MB, None)


def test_without_procfs_a_limit_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(memory_limit, "_STATUS", tmp_path / "no-status")
    with pytest.raises(BudgetError, match="needs Linux's /proc/self/status"):
        effective_limit(600 * MB)


def _footprint(limit: int, minimum: int = 30 * MB) -> Footprint:
    return Footprint(limit, anon_bytes=300 * MB, file_bytes=100 * MB, activation_bytes=10 * MB, kv_bytes=5 * MB,
                     headroom_bytes=MIN_HEADROOM, minimum_weight_bytes=minimum)


def test_the_weights_get_what_the_footprint_leaves_and_a_budget_within_it() -> None:
    footprint = _footprint(600 * MB)
    left = 600 * MB - (415 * MB + MIN_HEADROOM)
    assert footprint.weight_budget_bytes == left and footprint.check(None) == left
    assert footprint.check(50 * MB) == 50 * MB
    with pytest.raises(BudgetError, match="does not fit memory limit 600.0 MB") as caught:
        footprint.check(left + 1)
    assert "\n" not in str(caught.value)


def test_a_limit_below_what_the_model_needs_says_what_it_needs() -> None:
    footprint = _footprint(440 * MB)
    with pytest.raises(BudgetError, match=r"needs at least 461\.8 MB .* give 476MB or more") as caught:
        footprint.check(None)
    assert "\n" not in str(caught.value)


def test_kv_cache_per_position_from_a_config() -> None:
    from transformers import LlamaConfig

    config = LlamaConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)
    assert kv_bytes_per_token(config, 4) == 3 * 2 * 2 * 16 * 4
    assert kv_bytes_per_token(object(), 4) == 0  # no attention: nothing to reserve


# --- an engine within a limit -----------------------------------------------------------------


def _unlimited_footprint_need(directory: Path) -> Footprint:
    with layerfit.load(directory, memory_limit=machine_memory_bytes()) as engine:
        return engine.footprint


def test_an_engine_spends_what_its_measured_footprint_leaves_and_computes_the_same(lm) -> None:
    directory, manifest, model, ids = lm
    with torch.no_grad():
        expected = model(ids).logits
    need = _unlimited_footprint_need(directory)
    assert need.anon_bytes > 50 * MB and need.file_bytes > 10 * MB  # the interpreter and its libraries
    # a limit that leaves the weights a little more than their minimum: they stream
    limit = need.beside_weights_bytes + need.minimum_weight_bytes + 64 * 1024 + 4 * MB
    with layerfit.load(directory, memory_limit=limit) as engine:
        assert engine.footprint.limit_bytes == limit
        budget = engine.plan.budget_bytes
        assert budget == engine.footprint.weight_budget_bytes
        assert engine.memory.weight_bytes <= budget
        assert torch.equal(engine(ids).logits, expected)
        # a later budget is held to the limit too
        with pytest.raises(BudgetError, match="does not fit memory limit"):
            engine.reconfigure(budget=budget * 4 + 64 * MB)
        assert torch.equal(engine(ids).logits, expected)


def test_a_limit_the_process_fills_is_refused_before_any_weight_is_read(lm) -> None:
    directory, manifest, _, _ = lm
    with pytest.raises(BudgetError, match="cannot run this model: the process holds .* before its weights") as caught:
        layerfit.load(directory, memory_limit="100MB")
    assert "\n" not in str(caught.value) and "it needs more than" in str(caught.value)


def test_a_generation_reserves_its_kv_cache(lm) -> None:
    directory, manifest, model, ids = lm
    with layerfit.load(directory, memory_limit=machine_memory_bytes(), kv_positions=40) as engine:
        per_token = kv_bytes_per_token(engine.model.config, 4)
        assert per_token > 0 and engine.footprint.kv_bytes == 40 * per_token


def test_a_memory_limit_is_for_the_host(lm) -> None:
    with pytest.raises(LayerfitError, match="host memory"):
        layerfit.engine.EngineConfig.parse(memory_limit="1GB", device="cuda")
