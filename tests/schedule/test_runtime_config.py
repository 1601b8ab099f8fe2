"""RuntimeConfig: the runtime's settings, each default stated once.

The runtime takes a config or builds one from its keywords, so the config's defaults
are the runtime's; a server's differ only by SERVER_OVERRIDES; checking a config names
the keyword to change, as the runtime's constructor always did.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from runtime_helpers import runtime_threads

from layerfit.errors import LayerfitError, ScheduleError
from layerfit.schedule.runtime.config import (
    AUTO_UNITS,
    SERVER_OVERRIDES,
    RuntimeConfig,
    server_config,
)
from layerfit.schedule.runtime.executor import Runtime

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
}


def test_the_defaults_are_the_theses_and_stated_once() -> None:
    config = RuntimeConfig("models", "1MB")
    assert {f.name: getattr(config, f.name) for f in dataclasses.fields(config)} == {
        "repository": "models", "memory_budget": "1MB", **LIBRARY_DEFAULTS
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


def test_validate_refuses_a_budget_that_is_no_size() -> None:
    with pytest.raises(LayerfitError, match="cannot read"):
        RuntimeConfig("models", "lots").validate()


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
