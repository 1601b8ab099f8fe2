"""Clients that trickle, flood, vanish or nest: bounded memory, deadlines, one-line
answers, and a shutdown within its grace period."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pytest
import torch
from serve_helpers import json_body, reference, settings

from layerfit.serve.server import ServerThread


@pytest.fixture()
def start(repository: Path) -> Iterator[Callable[..., ServerThread]]:
    started: list[ServerThread] = []

    def make(**overrides: object) -> ServerThread:
        running = ServerThread(settings(repository, **overrides)).start()
        started.append(running)
        return running

    yield make
    for running in started:
        running.stop()


def slow_sender(url: str, path: str, body: bytes, every: float, stop: threading.Event) -> dict:
    """Send ``body`` one byte every ``every`` seconds on a raw connection; what came back."""
    parsed = urlparse(url)
    result: dict = {"status": None}

    def run() -> None:
        with socket.create_connection((parsed.hostname, parsed.port), timeout=60) as sock:
            sock.sendall(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode()
            )
            try:
                for byte in body:
                    if stop.is_set():
                        break
                    sock.sendall(bytes([byte]))
                    if stop.wait(every):
                        break
                    sock.settimeout(0.0)
                    try:
                        reply = sock.recv(65536)
                    except BlockingIOError:
                        reply = b""
                    finally:
                        sock.settimeout(60)
                    if reply:
                        result["status"] = int(reply.split()[1])
                        result["body"] = reply
                        return
                sock.settimeout(10)
                reply = sock.recv(65536)
                if reply:
                    result["status"] = int(reply.split()[1])
                    result["body"] = reply
            except OSError as exc:  # the server closed the connection
                result["error"] = repr(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    result["thread"] = thread
    return result


def request_body(x: torch.Tensor) -> bytes:
    return json.dumps(json_body(x)).encode()


def test_a_trickling_body_gets_408_and_holds_no_queue_slot(start) -> None:
    server = start(queue_limit=1, body_timeout=20.0, min_body_rate="1kB")
    stop = threading.Event()
    body = request_body(torch.randn(1, 8))
    slow = [slow_sender(server.url, "/v2/models/chain/infer", body, 0.5, stop) for _ in range(3)]
    try:
        time.sleep(1.0)  # the slow bodies are arriving: the one queue slot is still free
        x = torch.randn(1, 8)
        with httpx.Client(base_url=server.url, timeout=30) as http:
            response = http.post("/v2/models/chain/infer", json=json_body(x))
            assert response.status_code == 200, response.text
            assert torch.equal(torch.tensor(response.json()["outputs"][0]["data"]).reshape(1, 4), reference("chain", x))
        for s in slow:
            s["thread"].join(15)
            assert s["status"] == 408, s
            assert b"--min-body-rate" in s["body"]
    finally:
        stop.set()


def test_a_body_past_its_deadline_gets_408(start) -> None:
    server = start(body_timeout=1.5, min_body_rate="1")
    stop = threading.Event()
    slow = slow_sender(server.url, "/v2/models/chain/infer", request_body(torch.randn(1, 8)), 0.2, stop)
    try:
        slow["thread"].join(15)
        assert slow["status"] == 408 and b"--body-timeout of 1.5 s" in slow["body"], slow
    finally:
        stop.set()


def stop_with_slow_clients(server: ServerThread, slow: list[dict[str, Any]], most: float) -> None:
    """Stop ``server`` (a 1 s grace) a second after ``slow`` began trickling: it must exit
    within ``most`` seconds, each slow client answered 503 or its connection closed."""
    time.sleep(1.0)
    began = time.monotonic()
    server.stop()
    took = time.monotonic() - began
    assert took < most, f"shutdown took {took:.1f} s with a 1 s grace"
    for s in slow:
        s["thread"].join(15)
        assert s["status"] in (503, None), s


def test_sigterm_with_slow_clients_stops_within_the_grace(start) -> None:
    server = start(shutdown_grace=1.0, body_timeout=120.0, min_body_rate="1", queue_limit=64)
    stop = threading.Event()
    slow = [slow_sender(server.url, "/v2/models/chain/infer", request_body(torch.randn(1, 8)), 0.5, stop)
            for _ in range(16)]
    try:
        stop_with_slow_clients(server, slow, most=1.0 + 5.0)
    finally:
        stop.set()


def test_json_with_more_values_than_the_model_takes_is_refused_unparsed(start) -> None:
    server = start(max_body="8MB")
    flood = b'{"inputs": [{"name": "input", "shape": [1, 8], "datatype": "FP32", "data": [' + b"0," * 2_000_000 + b"0]}]}"
    with httpx.Client(base_url=server.url, timeout=60) as http:
        response = http.post("/v2/models/chain/infer", content=flood)
        assert response.status_code == 400
        assert "refused before parsing" in response.json()["error"]
        metrics = http.get("/metrics").text
    peak = next(float(line.split()[-1]) for line in metrics.splitlines()
                if line.startswith('layerfit_request_bytes{kind="peak"}'))
    assert len(flood) <= peak < len(flood) + 1_000_000  # the body, never its 2 M parsed values


def test_request_memory_bounds_what_requests_hold(start) -> None:
    server = start(max_body="64kB", request_memory="100kB", body_timeout=30.0, min_body_rate="1")
    stop = threading.Event()
    big = b'{"inputs": [{"name": "input", "shape": [1, 8], "datatype": "FP32", "data": [' + b" " * 60_000 + b"0]}]}"
    slow_sender(server.url, "/v2/models/chain/infer", big, 0.2, stop)  # reserves its 60 kB now
    try:
        time.sleep(0.5)
        with httpx.Client(base_url=server.url, timeout=30) as http:
            busy = http.post("/v2/models/chain/infer", content=big)
            assert busy.status_code == 429, busy.text
            assert "request memory" in busy.json()["error"]
            x = torch.randn(1, 8)
            assert http.post("/v2/models/chain/infer", json=json_body(x)).status_code == 200  # a small one fits
            stats = http.get("/metrics").text
        assert 'layerfit_request_bytes{kind="limit"} 100000.0' in stats
        assert "layerfit_request_memory_refusals_total 1.0" in stats
    finally:
        stop.set()


def test_a_deeply_nested_body_is_a_400(start) -> None:
    server = start(max_body="1MB")
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for body in (b"[" * 100_000, b'{"a":' * 50_000):
            response = http.post("/v2/models/chain/infer", content=body)
            assert response.status_code == 400, response.text
            assert "not valid JSON" in response.json()["error"]
            response = http.post("/v2/repository/index", content=body)
            assert response.status_code == 400, response.text


def test_a_client_leaving_mid_body_is_not_a_server_error(start, caplog: pytest.LogCaptureFixture) -> None:
    server = start()
    parsed = urlparse(server.url)
    for path in ("/v2/models/chain/infer", "/v2/repository/index", "/v1/completions", "/v1/chat/completions"):
        with socket.create_connection((parsed.hostname, parsed.port), timeout=10) as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{{\"in".encode())
            time.sleep(0.3)
    time.sleep(0.5)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        metrics = http.get("/metrics").text
    assert 'status="500"' not in metrics
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


def test_the_repository_api_can_be_switched_off(start) -> None:
    server = start(repository_api=False)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for path in ("/v2/repository/index", "/v2/repository/models/chain/load", "/v2/repository/models/chain/unload"):
            response = http.post(path)
            assert response.status_code == 404, path
        assert http.get("/v2/models/chain/ready").status_code == 200


# --- the generation routes: the same bounds as /infer ---------------------------------------


@pytest.fixture(scope="module")
def lm_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository of ``lm`` (a tiny Llama with a tokenizer, 64 positions) and ``chain``."""
    from generate_helpers import make_repository

    return make_repository(tmp_path_factory.mktemp("lm")).parent / "repo"


def request_peak(http: httpx.Client) -> float:
    metrics = http.get("/metrics").text
    return next(float(line.split()[-1]) for line in metrics.splitlines()
                if line.startswith('layerfit_request_bytes{kind="peak"}'))


MIB3 = 3 * 2**20


def generation_floods() -> list[tuple[str, bytes]]:
    """3 MiB bodies of every shape the probe sent: ids, a text, a prompt list, chat
    messages, ``text_input``."""
    ids = b'{"model": "lm", "max_tokens": 1, "prompt": [' + b"7," * (MIB3 // 2) + b"7]}"
    words = b"w4 " * (MIB3 // 3)
    chat = b'{"model": "lm", "messages": [' + b",".join([b'{"role": "user", "content": "w1"}'] * (MIB3 // 34)) + b"]}"
    return [
        ("/v1/completions", ids),
        ("/v1/completions", b'{"model": "lm", "prompt": "' + words + b'"}'),
        ("/v1/completions", b'{"model": "lm", "prompt": ["' + words + b'"]}'),
        ("/v1/completions", ids.replace(b'"lm"', b'"chain"')),  # no language model by that name
        ("/v1/chat/completions", chat),
        ("/v2/models/lm/generate", b'{"text_input": "' + words + b'"}'),
        ("/v2/models/lm/generate_stream", b'{"text_input": "' + words + b'"}'),
    ]


def test_generation_bodies_are_read_into_request_memory_and_refused_unparsed(lm_repository: Path) -> None:
    # the probe: 3 MiB of ids (1.5 M values) OOM-killed a server in a 700 MB cgroup; the
    # body was read and parsed outside --request-memory on every generation route
    with ServerThread(settings(lm_repository, max_body="4MB", request_memory="8MB")) as server, \
            httpx.Client(base_url=server.url, timeout=60) as http:
        for path, body in generation_floods():
            response = http.post(path, content=body)
            assert response.status_code == 413, (path, response.text[:300])
            message = response.json()["error"]
            message = message["message"] if isinstance(message, dict) else message
            assert "request memory" in message and "--request-memory" in message, message
            if path.startswith("/v1/"):  # not the prompt's length: OpenAI clients branch on the code
                assert response.json()["error"]["code"] == "request_too_large", response.text[:300]
        peak = request_peak(http)
        assert MIB3 <= peak < MIB3 + 2**20  # the bodies, never what parsing would have made of them
        over = http.post("/v1/completions", content=b" " * (5 * 2**20))  # past --max-body: refused unread
        assert over.status_code == 413 and "--max-body" in over.json()["error"]["message"], over.text
        assert over.json()["error"]["code"] == "request_too_large"
        assert request_peak(http) == peak
        # ids that fit the memory but not the model's 64 positions: 413 before any tensor
        many = http.post("/v1/completions", json={"model": "lm", "prompt": [7] * 1000, "max_tokens": 1})
        assert many.status_code == 413 and "has 64 positions (max_position_embeddings)" in many.text
        assert many.json()["error"]["code"] == "context_length_exceeded"
        assert http.post("/v1/completions", json={"model": "lm", "prompt": [7, 8], "max_tokens": 2}).status_code == 200
        assert server.built.dataplane.requests.in_use == 0


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/v2/models/lm/generate",
                                  "/v2/models/lm/generate_stream", "/v2/repository/index"])
def test_a_trickling_generation_body_gets_408(lm_repository: Path, path: str) -> None:
    body = json.dumps({"model": "lm", "prompt": "w1 w2", "text_input": "w1 w2",
                       "messages": [{"role": "user", "content": "w1"}]}).encode()
    stop = threading.Event()
    with ServerThread(settings(lm_repository, body_timeout=20.0, min_body_rate="1kB")) as server:
        slow = slow_sender(server.url, path, body, 0.5, stop)
        try:
            slow["thread"].join(15)
            assert slow["status"] == 408 and b"--min-body-rate" in slow["body"], slow
        finally:
            stop.set()


def test_sigterm_with_trickling_generation_clients_stops_within_the_grace(lm_repository: Path) -> None:
    # the probe: 64 trickling clients held the shutdown 11.4 s past a 1.6 s grace
    server = ServerThread(settings(lm_repository, shutdown_grace=1.0, body_timeout=120.0, min_body_rate="1",
                                   queue_limit=64)).start()
    stop = threading.Event()
    body = json.dumps({"model": "lm", "prompt": "w1 w2", "text_input": "w1 w2"}).encode()
    paths = ["/v1/completions", "/v1/chat/completions", "/v2/models/lm/generate", "/v2/models/lm/generate_stream"]
    slow = [slow_sender(server.url, paths[i % 4], body, 0.5, stop) for i in range(16)]
    try:
        # uvicorn's own backstop is the grace + 5 s: a drain that waited for it failed
        stop_with_slow_clients(server, slow, most=1.0 + 4.0)
    finally:
        stop.set()


def test_sigterm_ends_a_stream_still_decoding_within_the_grace(lm_repository: Path, monkeypatch) -> None:
    """A completion still decoding when the grace runs out ends with a last error event
    (the server shut down), its sequence cancelled: the shutdown waits for no decode."""
    from layerfit.schedule.decoding.batch_step import BatchStep

    run = BatchStep.run

    def slow_step(self, rows):  # 0.2 s a step: 60 tokens would take 12 s
        time.sleep(0.2)
        return run(self, rows)

    monkeypatch.setattr(BatchStep, "run", slow_step)
    server = ServerThread(settings(lm_repository, shutdown_grace=1.0, request_memory="4MB")).start()
    events: list[str] = []

    def read() -> None:
        with httpx.stream("POST", f"{server.url}/v1/completions", timeout=30,
                          # greedy: sampled at the API's temperature 1, the end token came early now and then
                          json={"model": "lm", "prompt": "w1 w2", "max_tokens": 60, "stream": True,
                                "temperature": 0}) as r:
            events.extend(line for line in r.iter_lines() if line.startswith("data: "))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 30
    while not events and time.monotonic() < deadline:  # decoding now
        time.sleep(0.05)
    began = time.monotonic()
    server.stop()
    took = time.monotonic() - began
    reader.join(15)
    assert took < 1.0 + 4.0, f"shutdown took {took:.1f} s with a 1 s grace"
    assert events and "shut down" in events[-1], events[-2:]
