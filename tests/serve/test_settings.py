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
