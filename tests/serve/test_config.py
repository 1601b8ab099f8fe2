"""Server configuration: bad settings are refused with one line naming the option to
change, and a memory budget too small for a model makes that model UNAVAILABLE (503)
rather than a request error — or, for every model, stops the server from starting.
"""

from __future__ import annotations

import math
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import torch
from serve_helpers import child_env, json_body, reference, settings

from layerfit.errors import JobRejectedError, LayerfitError
from layerfit.schedule.runtime import repository as repository_module
from layerfit.schedule.runtime.profiler import estimate_profile
from layerfit.serve.errors import status_of
from layerfit.serve.server import ServerThread
from layerfit.sizes import format_bytes
from layerfit.store import read_manifest

LOADABLE = ("chain", "cnn", "slow", "sleepy")  # the repository's models but `corrupt`


def refusal(repository: Path, **overrides: object) -> str:
    """The error a server with these settings fails to start with."""
    running = ServerThread(settings(repository, **overrides))
    try:
        running.start()
    except LayerfitError as exc:
        return str(exc)
    running.stop()
    raise AssertionError(f"the server started with {overrides}")


def needs(repository: Path) -> dict[str, int]:
    """The least budget each loadable model runs within (what the server asks of it)."""
    return {
        name: estimate_profile(read_manifest(repository / name), name).min_budget
        for name in LOADABLE
    }


def run_cli(repository: Path, *args: str) -> subprocess.CompletedProcess:
    """`layerfit serve` in its own process (it must exit by itself)."""
    env = child_env()
    command = [sys.executable, "-m", "layerfit.cli", "serve", "--repository", str(repository), "--port", "0", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize(
    ("overrides", "option"),
    [
        ({"shutdown_grace": -1.0}, "--shutdown-grace"),
        ({"shutdown_grace": math.inf}, "--shutdown-grace"),
        ({"shutdown_grace": math.nan}, "--shutdown-grace"),
        ({"timeout": math.inf}, "--timeout"),
        ({"log_level": "bogus"}, "--log-level must be one of critical, error, warning, info, debug, trace"),
        ({"port": 70000}, "--port"),
        ({"units": "merge:lots"}, "--units: unit granularity 'merge:lots'"),
        ({"return_freed_memory": "often"}, "--return-freed-memory must be one of after-pass, eagerly, never"),
        ({"threads": 0}, "--threads must be a whole number of threads, 1 or more, not 0"),
    ],
)
def test_bad_settings_are_refused(repository: Path, overrides: dict, option: str) -> None:
    assert option in refusal(repository, **overrides)


def test_log_level_is_case_insensitive(make_server: Callable[..., ServerThread]) -> None:
    running = make_server(log_level="WARNING")
    assert httpx.get(f"{running.url}/v2/health/live", timeout=30).status_code == 200


def test_unresolvable_host_points_at_host(repository: Path) -> None:
    message = refusal(repository, host="999.1.1.1")
    assert "--host" in message and "--port" not in message


def test_port_in_use_points_at_port(repository: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        message = refusal(repository, port=taken.getsockname()[1])
    assert "--port" in message and "--host" not in message


def test_model_over_budget_is_unavailable_not_a_bad_request(
    repository: Path, make_server: Callable[..., ServerThread], monkeypatch: pytest.MonkeyPatch
) -> None:
    need = needs(repository)
    budget = need["cnn"] - 1
    assert max(need["chain"], need["slow"], need["sleepy"]) <= budget
    pooled, pool_class = [], repository_module.EnginePool  # a model gets its pool as it becomes READY

    def pool(new_engine: Callable[[], object], engine: object) -> object:
        pooled.append(Path(new_engine.args[0]).name)
        return pool_class(new_engine, engine)

    monkeypatch.setattr(repository_module, "EnginePool", pool)
    running = make_server(memory_budget=budget)
    assert "cnn" in running.built.load_errors
    assert "cnn" not in pooled and "chain" in pooled  # never READY, not even for a moment
    with httpx.Client(base_url=running.url, timeout=30) as http:
        index = {row["name"]: row for row in http.post("/v2/repository/index").json()}
        assert index["chain"]["state"] == "READY"
        cnn = index["cnn"]
        assert cnn["state"] == "UNAVAILABLE" and format_bytes(need["cnn"]) in cnn["reason"]
        assert "--budget" in cnn["reason"]
        assert http.get("/v2/models/cnn/ready").status_code == 503
        body = {"inputs": [{"name": "input", "shape": [1, 3, 8, 8], "datatype": "FP32",
                            "data": [0.5] * (3 * 8 * 8)}]}
        response = http.post("/v2/models/cnn/infer", json=body)
        assert response.status_code == 503
        assert f"at least {format_bytes(need['cnn'])}" in response.json()["error"]
        response = http.post("/v2/repository/models/cnn/load")
        assert response.status_code == 503 and "--budget" in response.json()["error"]
        x = torch.randn(1, 8)
        response = http.post("/v2/models/chain/infer", json=json_body(x))
        assert response.status_code == 200
        assert torch.equal(torch.tensor(response.json()["outputs"][0]["data"]).reshape(1, 4), reference("chain", x))
    # should a job still reach the runtime's budget check, it is the server's problem too
    assert status_of(JobRejectedError("rejected", min_budget=1)) == 503


def test_budget_no_model_fits_refuses_to_start(repository: Path) -> None:
    need = needs(repository).values()
    message = refusal(repository, memory_budget="1B")
    assert "--budget" in message
    assert f"at least {format_bytes(min(need))} ({min(need)} bytes)" in message
    assert f"{format_bytes(max(need))} ({max(need)} bytes) to serve all" in message


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--log-level", "bogus"), "--log-level must be one of"),
        (("--budget", "1B"), "is too small for every model"),
        (("--shutdown-grace", "-1"), "--shutdown-grace must be"),
        (("--units", "chunks"), "--units: unknown unit granularity 'chunks'"),
        (("--return-freed-memory", "often"), "--return-freed-memory must be one of after-pass, eagerly"),
        (("--threads", "0"), "--threads must be a whole number of threads, 1 or more, not 0"),
        # a size is read once, where its text enters, and a refusal names its flag
        (("--budget", "lots"), "--budget: cannot read 'lots' as a size"),
        (("--budget", "0"), "a memory budget must be positive, got 0 bytes (--budget)"),
        (("--max-body", "64 parsecs"), "--max-body: cannot read '64 parsecs' as a size"),
        (("--min-body-rate", "50%"), "--min-body-rate: 50% is a share"),
    ],
)
def test_cli_exits_2_with_one_line(repository: Path, args: tuple[str, ...], expected: str) -> None:
    result = run_cli(repository, *args)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_threads_set_the_kernels_thread_count_and_metrics_report_it(
    make_server: Callable[..., ServerThread],
) -> None:
    before = torch.get_num_threads()
    try:
        running = make_server(threads=1)
        assert running.built.runtime.stats()["compute_threads"] == 1
        metrics = httpx.get(f"{running.url}/metrics", timeout=30).text
        assert "layerfit_compute_threads 1.0" in metrics
        x = torch.randn(1, 3, 8, 8)
        answer = httpx.post(f"{running.url}/v2/models/cnn/infer", json=json_body(x), timeout=30).json()
        out = answer["outputs"][0]
        assert torch.equal(torch.tensor(out["data"]).reshape(out["shape"]), reference("cnn", x))
    finally:
        torch.set_num_threads(before)
