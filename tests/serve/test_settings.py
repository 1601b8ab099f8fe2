"""ServeSettings embeds the runtime's RuntimeConfig instead of repeating its fields: given
as ``runtime=``, or built from the runtime's keywords with a server's defaults."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from layerfit.errors import LayerfitError
from layerfit.schedule.runtime.config import RuntimeConfig, server_config
from layerfit.serve.server import ServeSettings


def test_no_runtime_setting_is_repeated() -> None:
    own = {f.name for f in dataclasses.fields(ServeSettings)}
    assert "runtime" in own and not own & {f.name for f in dataclasses.fields(RuntimeConfig)}


def test_keywords_build_a_servers_config(tmp_path: Path) -> None:
    settings = ServeSettings(repository=tmp_path, memory_budget="4MB", workers=1, port=0)
    assert settings.runtime == server_config(tmp_path, memory_budget="4MB", workers=1)
    assert (settings.port, settings.host, settings.timeout) == (0, "127.0.0.1", 60.0)
    assert ServeSettings(tmp_path).runtime == server_config(tmp_path)
    assert dataclasses.replace(settings, port=9).runtime is settings.runtime


def test_a_config_is_taken_as_given(tmp_path: Path) -> None:
    config = RuntimeConfig(tmp_path, "4MB")
    assert ServeSettings(runtime=config, port=0).runtime is config
    with pytest.raises(LayerfitError, match="--queue-limit must be at least 1, not None"):
        ServeSettings(runtime=config).validate()  # a server always has a queue limit
    with pytest.raises(TypeError, match="not both"):
        ServeSettings(runtime=config, workers=2)
    with pytest.raises(TypeError, match="unexpected keyword arguments: colour"):
        ServeSettings(tmp_path, colour="red")
    with pytest.raises(TypeError, match="needs a repository"):
        ServeSettings()


def test_sizes_are_read_once_into_bytes_when_the_settings_are_made(tmp_path: Path) -> None:
    settings = ServeSettings(tmp_path, max_body="1MiB", min_body_rate="2kB", request_memory="3MB")
    assert (settings.max_body, settings.min_body_rate, settings.request_memory) == (1_048_576, 2_000, 3_000_000)
    assert settings.request_memory_bytes == 3_000_000
    defaults = ServeSettings(tmp_path, max_body=1000)
    assert (defaults.max_body, defaults.request_memory, defaults.min_body_rate) == (1000, None, 16_000)
    assert defaults.request_memory_bytes == 2000  # twice max_body, whatever max_body becomes
    assert dataclasses.replace(defaults, max_body=5000).request_memory_bytes == 10_000
    assert ServeSettings(tmp_path).max_body == 64_000_000
    assert dataclasses.replace(settings, port=9) == dataclasses.replace(settings, port=9)


@pytest.mark.parametrize("option", ["max_body", "request_memory", "min_body_rate"])
@pytest.mark.parametrize("text", ["lots", "-1", "50%", "1.5B"])
def test_a_size_that_is_no_size_is_refused_naming_its_flag(tmp_path: Path, option: str, text: str) -> None:
    with pytest.raises(LayerfitError, match=f"^--{option.replace('_', '-')}: ") as info:
        ServeSettings(tmp_path, **{option: text})
    assert "\n" not in str(info.value)


def test_each_runtime_rule_is_checked_once_naming_the_servers_flag(tmp_path: Path) -> None:
    """ServeSettings.validate asks RuntimeConfig.validate (naming flags) instead of
    repeating its rules; the server adds only its own (a queue limit is required)."""
    for change, message in (
        ({"workers": 0}, "need at least one worker, got 0 (--workers)"),
        ({"queue_limit": 0}, "--queue-limit must be a positive whole number, got 0"),
        ({"verify": "sometimes"}, "--verify must be one of"),
        ({"units": "merge:lots"}, "--units: unit granularity 'merge:lots'"),
        ({"memory_budget": 0}, "a memory budget must be positive, got 0 bytes (--budget)"),
        ({"estimate_factor": 0.0}, "--estimate-factor must be"),
        ({"cache_weights": "yes"}, "--cache-weights must be True or False"),
    ):
        config = dataclasses.replace(server_config(tmp_path), **change)
        with pytest.raises(LayerfitError) as info:
            ServeSettings(runtime=config).validate()
        assert message in str(info.value)
    with pytest.raises(LayerfitError, match=r"--request-memory \(1.0 kB\) must be at least --max-body \(2.0 kB\)"):
        ServeSettings(tmp_path, max_body="2kB", request_memory="1kB").validate()
