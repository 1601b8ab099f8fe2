"""RuntimeConfig: the runtime's settings, each default stated once.

The runtime takes a config or builds one from its keywords, so the config's defaults
are the runtime's; a server's differ only by SERVER_OVERRIDES; checking a config names
the keyword to change, as the runtime's constructor always did.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from runtime_helpers import runtime_threads

from layerfit.errors import LayerfitError, ScheduleError
from layerfit.schedule.runtime.config import (
    AUTO_UNITS,
    SERVER_OVERRIDES,
    RuntimeConfig,
    server_config,
)
from layerfit.schedule.runtime.executor import Runtime
from layerfit.sizes import MAX_BYTES

LIBRARY_DEFAULTS = {
    "workers": 2,
    "policy": "masa-fair",
    "queue_limit": None,
    "estimates": "capture",
    "estimate_factor": 1.0,
    "trace": False,
    "load": True,
    "direct_io": True,
    "gated": True,
    "return_freed_memory": "after-pass",
    "units": "layers",
    "cache_weights": False,
    "trust_factory": (),
    "verify": "first",
    "dequantize": False,
}


def test_the_defaults_are_the_theses_and_stated_once() -> None:
    config = RuntimeConfig("models", "1MB")
    assert {f.name: getattr(config, f.name) for f in dataclasses.fields(config)} == {
        "repository": "models", "memory_budget": 1_000_000, **LIBRARY_DEFAULTS
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.workers = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        RuntimeConfig("models", "1MB", 2, "masa", 8)  # type: ignore[misc]  # past policy: keywords only


def test_a_server_changes_only_its_overrides() -> None:
    config = server_config("models")
    assert config == RuntimeConfig("models", "512MB", units=AUTO_UNITS, cache_weights=True, queue_limit=64)
    assert dict(SERVER_OVERRIDES) == {
        "memory_budget": "512MB", "units": AUTO_UNITS, "cache_weights": True, "queue_limit": 64
    }
    assert server_config("models", units="layers", memory_budget="1GB").units == "layers"
    changed = {f.name for f in dataclasses.fields(config) if getattr(config, f.name) != f.default}
    assert changed == {"repository", *SERVER_OVERRIDES}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"verify": "sometimes"}, "verify must be one of"),
        ({"workers": 0}, "need at least one worker, got 0"),
        ({"workers": True}, "need at least one worker"),
        ({"queue_limit": 0}, "queue_limit must be a positive whole number"),
        ({"estimates": "guess"}, "estimates must be one of capture, profile"),
        ({"policy": None}, "policy must be a policy's name"),
        ({"units": "merge:lots"}, "granularity"),
        ({"units": 3}, "units must be"),
        ({"cache_weights": "yes"}, "cache_weights must be True or False"),
        ({"return_freed_memory": "often"}, "return_freed_memory must be one of after-pass, eagerly, never"),
        ({"memory_budget": 0}, "a memory budget must be positive"),
        ({"policy": "lifo"}, "unknown policy"),
        ({"estimate_factor": 0}, "estimate_factor must be"),
    ],
)
def test_validate_names_the_keyword(change: dict, message: str) -> None:
    config = dataclasses.replace(RuntimeConfig("models", "1MB"), **change)
    with pytest.raises(ScheduleError, match=message):
        config.validate()


def test_the_budget_is_read_once_into_bytes_when_the_config_is_made() -> None:
    config = RuntimeConfig("models", "1.5MiB")
    assert config.memory_budget == 1_572_864 and type(config.memory_budget) is int
    assert config == RuntimeConfig("models", 1_572_864)
    assert dataclasses.replace(config, workers=3).memory_budget == 1_572_864
    assert server_config("models").memory_budget == 512_000_000  # SERVER_OVERRIDES' "512MB"


@pytest.mark.parametrize("budget", ["lots", "50%", "-1", True, -1, None])
def test_a_budget_that_is_no_size_is_refused_naming_the_keyword(budget: object) -> None:
    with pytest.raises(LayerfitError, match="^memory_budget: ") as info:
        RuntimeConfig("models", budget)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


@given(nbytes=st.integers(0, MAX_BYTES), unit=st.sampled_from(["B", "kB", "MB", "GB", "KiB", "MiB", "GiB"]))
def test_a_budget_in_any_unit_is_the_bytes_it_denotes(nbytes: int, unit: str) -> None:
    """The budget is read once and exactly: a size's text and its bytes make equal configs,
    and reading the bytes again (replace, a second config from it) changes nothing."""
    scale = {"B": 1, "kB": 1000, "MB": 1000**2, "GB": 1000**3, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}[unit]
    whole = nbytes // scale
    config = RuntimeConfig("models", f"{whole}{unit}")
    assert config.memory_budget == whole * scale
    assert config == RuntimeConfig("models", whole * scale) == RuntimeConfig("models", config.memory_budget)
    assert dataclasses.replace(config, units="merge:auto").memory_budget == config.memory_budget


def test_validate_names_each_setting_as_the_caller_spells_it() -> None:
    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    for change, named in (
        ({"workers": 0}, "need at least one worker, got 0 (--workers)"),
        ({"queue_limit": 0}, "--queue-limit must be a positive whole number, got 0"),
        ({"verify": "sometimes"}, "--verify must be one of"),
        ({"units": "merge:lots"}, "--units: unit granularity 'merge:lots'"),
        ({"units": 3}, "--units must be layers"),
        ({"return_freed_memory": "often"}, "--return-freed-memory must be one of"),
        ({"memory_budget": 0}, "a memory budget must be positive, got 0 bytes (--memory-budget)"),
        ({"estimate_factor": 0}, "--estimate-factor must be"),
        ({"estimates": "guess"}, "--estimates must be one of"),
    ):
        config = dataclasses.replace(RuntimeConfig("models", "1MB"), **change)
        with pytest.raises(ScheduleError) as info:
            config.validate(flag)
        assert named in str(info.value), str(info.value)
        with pytest.raises(ScheduleError) as info:
            config.validate()
        assert "--" not in str(info.value), str(info.value)


def test_the_runtime_takes_a_config_or_builds_one_from_keywords(tmp_path: Path) -> None:
    config = RuntimeConfig(tmp_path, "1MB", workers=1, load=False, cache_weights=True)
    with Runtime(config) as rt:
        assert rt.config is config and rt.workers == 1 and rt.stats()["weight_cache"] is not None
    with Runtime(tmp_path, "1MB", 1, load=False, cache_weights=True) as rt:
        assert rt.config == config
    with Runtime(repository=tmp_path, memory_budget="1MB", workers=1, load=False, cache_weights=True) as rt:
        assert rt.config == config
    with Runtime(tmp_path, "1MB", load=False) as rt:  # no default of its own
        assert rt.config == RuntimeConfig(tmp_path, "1MB", load=False)
        assert rt.units == LIBRARY_DEFAULTS["units"] and rt.queue_limit is None
    with pytest.raises(TypeError, match="not both"):
        Runtime(config, workers=2)
    with pytest.raises(ScheduleError, match="at least one worker"):
        Runtime(dataclasses.replace(config, workers=0))
    assert runtime_threads() == []
