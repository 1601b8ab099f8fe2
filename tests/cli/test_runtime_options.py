"""The runtime's options are declared once: `layerfit serve` and `layerfit schedule run`
build their RuntimeConfig from the same option group, so the same options give the same
config, and each default is RuntimeConfig's (a server's differ by SERVER_OVERRIDES only)."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest

from layerfit.cli import main
from layerfit.cli.runtime_options import OPTIONS, runtime_default
from layerfit.errors import LayerfitError
from layerfit.schedule.runtime.config import SERVER_OVERRIDES, RuntimeConfig, server_config
from layerfit.sizes import parse_bytes

SHARED = ["--workers", "3", "--policy", "masa", "--units", "merge:auto", "--cache-weights",
          "--return-freed-memory", "eagerly"]


@pytest.fixture
def configs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Run ``serve`` or ``schedule run`` up to the runtime, and return the config it built."""
    pytest.importorskip("fastapi")
    from layerfit.schedule.experiments import realrun
    from layerfit.serve import server

    built: list[RuntimeConfig] = []

    def fake_serve(settings, on_ready=None):
        built.append(settings.runtime)

    def fake_run_real(workload, config, **kwargs):
        built.append(config)
        raise LayerfitError("stopped before the run")

    monkeypatch.setattr(server, "serve", fake_serve)
    monkeypatch.setattr(realrun, "run_real", fake_run_real)
    repository = str(tmp_path)

    def config(command: str, *options: str) -> RuntimeConfig:
        if command == "serve":
            assert main(["serve", "--repository", repository, "--budget", "1MB", *options]) == 0
        else:
            args = ["schedule", "run", "--workload", "w.yaml", "--repository", repository, "--budget", "1MB"]
            assert main([*args, *options]) == 2  # stopped
        return built.pop()

    return config, repository


def test_the_same_options_give_the_same_config(configs) -> None:
    config, _ = configs
    served, ran = config("serve", *SHARED), config("schedule", *SHARED)
    # schedule run has no --queue-limit (a server's: 429 beyond it); both read --budget into bytes
    assert served == dataclasses.replace(ran, queue_limit=SERVER_OVERRIDES["queue_limit"])
    assert served.memory_budget == ran.memory_budget == parse_bytes("1MB")


def test_defaults_are_runtime_configs_and_a_servers_overrides(configs) -> None:
    config, repository = configs
    assert config("schedule") == RuntimeConfig(repository, parse_bytes("1MB"))
    assert config("serve") == server_config(repository, memory_budget="1MB")
    # what --help shows is the config's default, or a server's override of it
    from layerfit.cli.schedule import run_command
    from layerfit.cli.serve import serve_command

    defaults = {f.name: f.default for f in dataclasses.fields(RuntimeConfig)}
    for command, overrides in ((run_command, {}), (serve_command, SERVER_OVERRIDES)):
        declared = {
            name: param.default.default
            for name, param in inspect.signature(command).parameters.items() if name in OPTIONS
        }
        assert declared and declared == {name: overrides.get(name, defaults[name]) for name in declared}
        assert all(runtime_default(name, overrides) == value for name, value in declared.items())


def test_the_options_map_one_to_one_onto_config_fields() -> None:
    fields = {f.name for f in dataclasses.fields(RuntimeConfig)}
    assert set(OPTIONS) <= fields
    for name, option in OPTIONS.items():
        flag = option.flags[0].split("/")[0]
        assert flag == "--" + name.replace("_", "-"), name
