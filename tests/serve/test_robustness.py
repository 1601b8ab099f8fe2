"""Robustness: bounded queue (429), per-request timeout, draining, SIGTERM.

The ``slow`` model takes about 0.5 s per inference (two 0.25 s layers), which makes
"a request is in flight" a state the tests can create and observe.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import torch
from serve_helpers import child_env, json_body, reference, wait_until

from layerfit.serve.server import ServerThread


def slow_body(x: torch.Tensor, **extra: object) -> dict:
    return json_body(x.reshape(1, 4), **extra)


def in_background(
    url: str, bodies: list[dict], model: str = "slow"
) -> tuple[list[httpx.Response | BaseException], list[threading.Thread]]:
    """POST every body to ``model`` on its own thread; results land in the list."""
    results: list[httpx.Response | BaseException] = [RuntimeError("no answer")] * len(bodies)

    def post(i: int, body: dict) -> None:
        try:
            results[i] = httpx.post(f"{url}/v2/models/{model}/infer", json=body, timeout=60)
        except BaseException as exc:  # an unanswered request: the test reports it
            results[i] = exc

    threads = [threading.Thread(target=post, args=(i, b), daemon=True) for i, b in enumerate(bodies)]
    for t in threads:
        t.start()
    return results, threads


def join(threads: list[threading.Thread], timeout: float = 60.0) -> None:
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a client never got an answer"


def test_full_queue_answers_429(make_server: Callable[..., ServerThread]) -> None:
    running = make_server(workers=1, queue_limit=1)
    x = torch.randn(1, 4)
    results, threads = in_background(running.url, [slow_body(x)])
    wait_until(lambda: running.built.dataplane.inflight == 1)
    response = httpx.post(f"{running.url}/v2/models/slow/infer", json=slow_body(x), timeout=30)
    assert response.status_code == 429 and "queue is full" in response.json()["error"]
    join(threads)
    (first,) = results
    assert first.status_code == 200
    y = torch.tensor(first.json()["outputs"][0]["data"]).reshape(1, 4)
    assert torch.equal(y, reference("slow", x))
    metrics = httpx.get(f"{running.url}/metrics").text
    assert 'status="429"' in metrics


def test_timeout_cancels_queued_work_and_frees_memory(make_server: Callable[..., ServerThread]) -> None:
    running = make_server(workers=1)
    x = torch.randn(1, 4)
    results, threads = in_background(running.url, [slow_body(x)])
    wait_until(lambda: running.built.dataplane.inflight == 1)
    # 100 ms (the protocol's timeout parameter is in microseconds) for 0.5 s of work
    response = httpx.post(f"{running.url}/v2/models/slow/infer", timeout=30,
                          json=slow_body(x, parameters={"timeout": 100_000}))
    assert response.status_code == 503 and "timeout" in response.json()["error"]
    join(threads)
    assert results[0].status_code == 200
    runtime = running.built.runtime
    assert runtime.stats()["jobs"]["timed_out"] == 1
    # a task of the cancelled job that was running returns its memory when it ends; what
    # stays is the weight cache's (units of the finished request, evictable at any time)

    def only_cached_weights_held() -> bool:
        stats = runtime.stats()
        cache = stats["weight_cache"]
        return (stats["in_use_bytes"] == cache["reserved_bytes"]
                and stats["unit_buffer_bytes"] == cache["bytes"] and stats["tasks_running"] == 0)

    wait_until(only_cached_weights_held)
    assert runtime.stats()["queue_length"] == 0


def test_stop_finishes_admitted_requests_and_refuses_new(make_server: Callable[..., ServerThread]) -> None:
    running = make_server(workers=1, shutdown_grace=30.0)
    x = torch.randn(1, 4)
    results, threads = in_background(running.url, [slow_body(x), slow_body(x)])
    wait_until(lambda: running.built.dataplane.inflight == 2)
    stopper = threading.Thread(target=running.stop, daemon=True)
    stopper.start()
    wait_until(lambda: running.built.dataplane.draining)
    late = httpx.post(f"{running.url}/v2/models/slow/infer", json=slow_body(x), timeout=30)
    assert late.status_code == 503 and "shutting down" in late.json()["error"]
    join(threads)
    stopper.join(60)
    assert [r.status_code for r in results] == [200, 200]  # within the grace period: finished


def test_sigterm_answers_every_accepted_request(repository: Path) -> None:
    """A `layerfit serve` process: SIGTERM with requests in flight, a short grace period."""
    env = child_env()
    command = [sys.executable, "-m", "layerfit.cli", "serve", "--repository", str(repository),
               "--budget", "4MB", "--workers", "1", "--port", "0", "--shutdown-grace", "0.3",
               "--log-level", "warning"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        url = _wait_for_url(proc, timeout=120)
        x = torch.randn(1, 4)
        assert httpx.post(f"{url}/v2/models/slow/infer", json=slow_body(x), timeout=60).status_code == 200
        # three 2 s requests on one worker: 6 s of work, far beyond the 0.3 s grace period
        results, threads = in_background(url, [slow_body(x) for _ in range(3)], model="sleepy")
        wait_until(lambda: "layerfit_inflight_requests 3.0" in httpx.get(f"{url}/metrics", timeout=30).text)
        proc.send_signal(signal.SIGTERM)
        join(threads)
        assert proc.wait(timeout=60) in (0, -signal.SIGTERM)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    statuses = [r.status_code if isinstance(r, httpx.Response) else repr(r) for r in results]
    assert all(s in (200, 503) for s in statuses) and 503 in statuses, statuses
    for r in results:
        if r.status_code == 503:
            assert "shut down" in r.json()["error"]
        else:
            assert torch.equal(torch.tensor(r.json()["outputs"][0]["data"]).reshape(1, 4), reference("sleepy", x))


def _wait_for_url(proc: subprocess.Popen, timeout: float) -> str:
    """The server's URL from its first line of output (read on a thread, bounded)."""
    found: list[str] = []
    lines: list[str] = []

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            match = re.search(r"at (http://\S+)/v2", line)
            if match:
                found.append(match.group(1))
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    assert found, f"the server did not start: {''.join(lines)}"
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # drain output
    return found[0]


def test_a_warm_up_a_busy_server_cannot_run_is_a_503_and_a_later_load_works(
    repository: Path, tmp_path: Path, make_server: Callable[..., ServerThread]
) -> None:
    import shutil

    shutil.copytree(repository / "slow", tmp_path / "repo" / "slow")
    running = make_server(repository=tmp_path / "repo", workers=1, queue_limit=1, warm_up=True)
    assert running.built is not None and running.built.load_errors == {}
    results, threads = in_background(running.url, [slow_body(torch.randn(1, 4))])
    wait_until(lambda: running.built.dataplane.inflight == 1)
    busy = httpx.post(f"{running.url}/v2/repository/models/slow/load", timeout=30)
    assert busy.status_code == 503, busy.text
    assert "warm-up request failed" in busy.json()["error"] and "load it again" in busy.json()["error"]
    join(threads)
    assert results[0].status_code == 200  # the request in flight finished on the old engines
    assert httpx.post(f"{running.url}/v2/repository/models/slow/load", timeout=30).status_code == 200
    assert httpx.get(f"{running.url}/v2/models/slow/ready", timeout=30).status_code == 200
