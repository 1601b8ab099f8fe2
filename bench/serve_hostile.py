"""Hostile clients against ``layerfit serve``: memory under flooding bodies on every route,
service under trickling ones, shutdown with them connected, and load/unload churn.

Each server runs as its own process in a memory cgroup (v1, which counts the page cache
too) limited to ``--cgroup-limit`` (700 MB), at a tight ``--memory-budget``, over a
repository prepared for this run by the code it measures: a zoo model (``m``) and a
tiny Llama-like language model (``llm``: built here from a config with a word-level
tokenizer and a chat template, then ``layerfit prepare hf:``; nothing is downloaded).
Every phase is bounded in requests and time, loopback only:

1. **flood**: one, then four concurrent JSON bodies just under ``--max-body`` (the value
   ``0`` repeated: the most Python objects per byte) to ``/v2/models/m/infer``; the
   server's peak RSS (``VmHWM``, reset before the phase) and the cgroup's peak (reset
   too) are read after.
2. **trickle**: ``--slow`` connections each send an infer body one byte every 2 s while
   one client sends real binary requests for ``--duration`` seconds: answers by status.
3. **sigterm**: the slow connections again, mid-body, then SIGTERM with
   ``--shutdown-grace 2``: seconds until the process exited, and what they got.
4. **generation bodies**: to each generation route (``/v1/completions``,
   ``/v1/chat/completions``, ``/v2/models/llm/generate``, ``generate_stream``) a body of
   3 MiB and of 55 MiB of each shape, one at a time: token ids
   (``{"model":"llm","max_tokens":1,"prompt":[7,7,…]}``), text (the route's own text
   field: ``prompt``, one message's ``content``, ``text_input``) and chat messages
   (``{"role":"user","content":"w7"}`` repeated). Per case: the status (or the error a
   client saw), whether the process is alive and ``/v2/health/live`` answers, its peak
   RSS and the cgroup's peak, and the cgroup's OOM kills. A server that died is replaced
   by a fresh one for the next case.
5. **generation trickle** and 6. **generation sigterm**: phases 2 and 3 with the slow
   bodies spread over the four generation routes, the real client sending completions.
7. **churn**: ``POST /v2/repository/models/m/unload`` then ``/load`` in a loop for
   ``--churn-seconds`` while 4 clients infer on ``m``; the server's RSS and anonymous
   RSS after every cycle, and how many cycles it survived.

``--src DIR`` runs the server (and the ``prepare`` of its repository) from another
checkout's ``src`` (the code before a change), so before and after are measured on one
machine in one session; ``--compare NAME`` puts an earlier run's figures beside this
one's in the Markdown.

    .venv/bin/python bench/serve_hostile.py --src /tmp/before/src --name serve_hostile_before --churn-seconds 240
    .venv/bin/python bench/serve_hostile.py --name serve_hostile_after --compare serve_hostile_before
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_limits import Cgroup, vm_hwm  # noqa: E402
from processes import launch_server  # noqa: E402
from reporting import RESULTS, machine, mb, write_results  # noqa: E402

CACHE = Path(__file__).parent / ".cache" / "serve_hostile"
MIB = 2**20
GENERATION_ROUTES = ("/v1/completions", "/v1/chat/completions", "/v2/models/llm/generate",
                     "/v2/models/llm/generate_stream")
SHAPES = ("ids", "text", "chat")
# The language model: a Llama of two small layers whose vocabulary is words w0…w55 and the
# chat roles; max_position_embeddings well below any flooding prompt.
WORDS = [f"w{i}" for i in range(56)] + ["system", "user", "assistant", ":"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant :{% endif %}"
)
LLM_CONFIG = {
    "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
    "eos_token_id": 1, "pad_token_id": 1,
}


# --- the repository ------------------------------------------------------------------------


def build_llm_folder(folder: Path) -> Path:
    """A Hugging Face folder as published: a seeded tiny Llama, its word-level tokenizer
    (built here) and a chat template; what ``prepare hf:`` reads."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLM_CONFIG)).save_pretrained(folder)
    vocab = {"<unk>": 0, "<eos>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    return folder


def server_env(src: str | None) -> dict[str, str]:
    """The environment the server (and its ``prepare``) runs in: ``--src`` first on the path."""
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = str(Path(src).resolve())
    return env


def prepare_repository(args: argparse.Namespace) -> tuple[Path, str]:
    """A fresh repository of ``m`` (the zoo model) and ``llm``, prepared by the code the
    server runs (a folder another version wrote may not load in it); and the path of
    the ``layerfit`` package that code imports from, to show which code ran."""
    repository = CACHE / f"repository-{args.name}"
    if repository.exists():
        shutil.rmtree(repository)
    repository.mkdir(parents=True)
    hf = CACHE / "hf-llama"
    if not (hf / "config.json").is_file():
        shutil.rmtree(hf, ignore_errors=True)
        build_llm_folder(hf)
    env = server_env(args.src)
    cli = [sys.executable, "-m", "layerfit.cli", "prepare"]
    shape = f"1,3,{args.resolution},{args.resolution}"
    for command in ([*cli, args.model, "-o", str(repository / "m"), "--input-shape", shape],
                    [*cli, "hf:" + str(hf), "-o", str(repository / "llm")]):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed: {(done.stderr or done.stdout).strip()[-2000:]}")
    where = subprocess.run([sys.executable, "-c", "import layerfit; print(layerfit.__file__)"], env=env,
                           capture_output=True, text=True, check=True, timeout=120).stdout.strip()
    return repository, where


# --- the server ------------------------------------------------------------------------------


class Server:
    """``layerfit serve`` over ``repository`` in a fresh memory cgroup limited to
    ``args.cgroup_limit`` bytes (where cgroups are available)."""

    def __init__(self, args: argparse.Namespace, repository: Path) -> None:
        self.cgroup = Cgroup()
        if self.cgroup.available:
            (self.cgroup.path / "memory.limit_in_bytes").write_text(str(args.cgroup_limit))
        command = [sys.executable, "-m", "layerfit.cli", "serve", "--repository", str(repository),
                   "--memory-budget", args.memory_budget, "--host", "127.0.0.1", "--port", "0",
                   "--shutdown-grace", str(args.grace), "--log-level", "warning", "--queue-limit", "64"]
        self.started = time.monotonic()
        try:
            self.proc, self.url = launch_server(command, env=server_env(args.src), preexec_fn=self.cgroup.enter_fn())
        except BaseException:
            self.cgroup.remove()
            raise
        self.oom_before = self.cgroup.oom_kills()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def live(self) -> int | str:
        """``/v2/health/live``'s status, or what a client saw instead."""
        try:
            return httpx.get(f"{self.url}/v2/health/live", timeout=10).status_code
        except httpx.HTTPError as exc:
            return type(exc).__name__

    def reset_peaks(self) -> None:
        """``VmHWM`` back to the current RSS, and the cgroup's peak to its current usage."""
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")
        if self.cgroup.available:
            (self.cgroup.path / "memory.max_usage_in_bytes").write_text("0")

    def status(self) -> dict[str, int]:
        """``VmRSS`` and ``RssAnon`` now, in bytes."""
        out = {}
        with open(f"/proc/{self.pid}/status") as fh:
            for line in fh:
                key = line.split(":", 1)[0]
                if key in ("VmRSS", "RssAnon"):
                    out[key] = int(line.split()[1]) * 1024
        return out

    def memory(self) -> dict[str, Any]:
        """Peak RSS (None if the process is gone), the cgroup's peak, its OOM kills since start."""
        alive = self.alive()
        peak = None
        if alive:
            try:
                peak = vm_hwm(self.pid)
            except (OSError, RuntimeError):
                peak = None
        return {"vm_hwm": peak, "cgroup_peak": self.cgroup.peak_bytes(),
                "oom_kills": self.cgroup.oom_kills() - self.oom_before}

    def stop(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait()
        for _ in range(50):  # the cgroup empties as the process is torn down
            self.cgroup.remove()
            if not self.cgroup.path.exists():
                break
            time.sleep(0.1)


# --- bodies and clients --------------------------------------------------------------------


def flood_body(input_name: str, shape: list[int], max_body: int) -> bytes:
    head = f'{{"inputs": [{{"name": "{input_name}", "shape": {shape}, "datatype": "FP32", "data": ['.encode()
    tail = b"0]}]}"
    count = (max_body - len(head) - len(tail) - 1024) // 2
    return head + b"0," * count + tail


def generation_body(route: str, shape: str, size: int) -> bytes:
    """A body of about ``size`` bytes for ``route``: token ids, the route's own text field,
    or chat messages (parsed the same on every route: a field a route does not take is
    refused only once the body is read)."""
    if shape == "ids":
        head, unit, tail = b'{"model":"llm","max_tokens":1,"prompt":[', b"7,", b"7]}"
    elif shape == "chat":
        head = b'{"model":"llm","max_tokens":1,"messages":['
        unit, tail = b'{"role":"user","content":"w7"},', b'{"role":"user","content":"w7"}]}'
    elif route == "/v1/completions":
        head, unit, tail = b'{"model":"llm","max_tokens":1,"prompt":"', b"w7 ", b'w7"}'
    elif route == "/v1/chat/completions":
        head, unit, tail = b'{"model":"llm","max_tokens":1,"messages":[{"role":"user","content":"', b"w7 ", b'w7"}]}'
    else:
        head, unit, tail = b'{"max_tokens":1,"text_input":"', b"w7 ", b'w7"}'
    return head + unit * ((size - len(head) - len(tail)) // len(unit)) + tail


def slow_clients(url: str, count: int, stop: threading.Event, paths: tuple[str, ...] = ("/v2/models/m/infer",),
                 every: float = 2.0) -> list[dict]:
    """``count`` connections, spread over ``paths``, each announcing a 100 kB body and
    sending one byte of it every ``every`` seconds until answered or ``stop``."""
    host, port = url.removeprefix("http://").split(":")
    results: list[dict] = []

    def run(result: dict, path: str) -> None:
        try:
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             "Content-Length: 100000\r\n\r\n".encode())
                sock.settimeout(every)
                while not stop.is_set():
                    sock.sendall(b" ")
                    try:
                        reply = sock.recv(4096)
                    except TimeoutError:
                        continue
                    result["status"] = int(reply.split()[1]) if reply else "closed"
                    return
        except OSError as exc:
            result["status"] = f"error: {type(exc).__name__}"

    for k in range(count):
        result: dict = {"status": None}
        results.append(result)
        threading.Thread(target=run, args=(result, paths[k % len(paths)]), daemon=True).start()
    return results


def _count(results: list[dict]) -> dict[str, int]:
    return dict(Counter(str(r["status"]) for r in results))


def post(url: str, body: bytes, timeout: float, headers: dict[str, str] | None = None) -> int | str:
    """The status of a POST, or the name of the error a client saw instead."""
    try:
        return httpx.post(url, content=body, timeout=timeout,
                          headers={"Content-Type": "application/json", **(headers or {})}).status_code
    except httpx.HTTPError as exc:
        return type(exc).__name__


def binary_request(url: str) -> tuple[bytes, dict[str, str]]:
    """A real binary infer request for ``m`` (its input of random values) and its headers."""
    spec = httpx.get(f"{url}/v2/models/m", timeout=30).json()["inputs"][0]
    binary = np.random.default_rng(0).standard_normal(spec["shape"]).astype(np.float32).tobytes()
    header = (f'{{"inputs": [{{"name": "{spec["name"]}", "shape": {spec["shape"]}, "datatype": "FP32", '
              f'"parameters": {{"binary_data_size": {len(binary)}}}}}]}}').encode()
    return header + binary, {"Inference-Header-Content-Length": str(len(header))}


# --- phases ------------------------------------------------------------------------------------


def flood(server: Server, out: dict[str, Any]) -> bool:
    """Phase 1; False if the server died."""
    spec = httpx.get(f"{server.url}/v2/models/m", timeout=30).json()["inputs"][0]
    body = flood_body(spec["name"], spec["shape"], 64_000_000 - 400_000)
    time.sleep(1.0)
    out["idle_rss"] = vm_hwm(server.pid)
    for concurrent in (1, 4):
        server.reset_peaks()
        statuses: list[int | str] = []

        def send(statuses: list[int | str] = statuses) -> None:
            statuses.append(post(f"{server.url}/v2/models/m/infer", body, 120))

        threads = [threading.Thread(target=send) for _ in range(concurrent)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        alive = server.alive()
        out[f"flood_{concurrent}"] = {"body_mb": len(body) / 1e6, "statuses": statuses, "server_alive": alive,
                                      **server.memory()}
        print(concurrent, out[f"flood_{concurrent}"], flush=True)
        if not alive:
            return False
    return True


def trickle(server: Server, args: argparse.Namespace, paths: tuple[str, ...], real: tuple[str, bytes, dict]) -> dict:
    """Phases 2 and 5: slow bodies on ``paths`` while one client sends ``real`` requests."""
    stop = threading.Event()
    slow = slow_clients(server.url, args.slow, stop, paths)
    time.sleep(2.0)
    route, body, headers = real
    tally: Counter[str] = Counter()
    end = time.monotonic() + args.duration
    sent = 0
    while time.monotonic() < end and sent < 10_000:
        sent += 1
        tally[str(post(server.url + route, body, 30, headers))] += 1
    stop.set()
    time.sleep(2.5)
    return {"slow_connections": args.slow, "paths": list(paths), "seconds": args.duration, "sent": sent,
            "answers": dict(tally), "slow_answers": _count(slow), "server_alive": server.alive()}


def sigterm(server: Server, args: argparse.Namespace, paths: tuple[str, ...]) -> dict:
    """Phases 3 and 6: SIGTERM with slow connections mid-body on ``paths``."""
    stop = threading.Event()
    slow = slow_clients(server.url, args.slow, stop, paths)
    time.sleep(0.7)  # all connected and mid-body, before a minimum rate could cut them
    began = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(args.sigterm_wait)
        result: dict[str, Any] = {"exit_s": round(time.monotonic() - began, 2)}
    except subprocess.TimeoutExpired:
        result = {"exit_s": None, "still_running_after_s": args.sigterm_wait}
    stop.set()
    time.sleep(2.5)
    return {**result, "grace_s": args.grace, "paths": list(paths), "slow_answers": _count(slow)}


def generation_cases(args: argparse.Namespace, repository: Path) -> list[dict]:
    """Phase 4: every route × shape × size, one body at a time, a fresh server after a death."""
    cases: list[dict] = []
    server: Server | None = None
    try:
        for size_mib in (float(v) for v in args.sizes_mib.split(",")):
            for shape in SHAPES:
                for route in GENERATION_ROUTES:
                    if server is None:
                        server = Server(args, repository)
                        time.sleep(0.5)
                    body = generation_body(route, shape, int(size_mib * MIB))
                    server.reset_peaks()
                    began = time.monotonic()
                    status = post(server.url + route, body, args.case_timeout)
                    seconds = time.monotonic() - began
                    del body
                    time.sleep(0.5)
                    alive = server.alive()
                    case = {"route": route, "body": shape, "body_mib": size_mib, "status": status,
                            "seconds": round(seconds, 2), "server_alive": alive,
                            "live": server.live() if alive else None, **server.memory()}
                    cases.append(case)
                    print(case, flush=True)
                    if not alive or case["live"] != 200:
                        server.stop()
                        server = None
    finally:
        if server is not None:
            server.stop()
    return cases


def churn(server: Server, args: argparse.Namespace) -> dict:
    """Phase 7: unload and load ``m`` in a loop while 4 clients infer on it."""
    body, headers = binary_request(server.url)
    stop = threading.Event()
    answers: Counter[str] = Counter()
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            while not stop.is_set():
                try:
                    key = str(http.post("/v2/models/m/infer", content=body, headers=headers).status_code)
                except httpx.HTTPError as exc:
                    key = type(exc).__name__
                    if not server.alive():
                        return
                with lock:
                    answers[key] += 1

    clients = [threading.Thread(target=client, daemon=True) for _ in range(4)]
    for t in clients:
        t.start()
    server.reset_peaks()
    start = server.status()
    changes: Counter[str] = Counter()
    seconds: list[float] = []
    rss: list[int] = []
    anon: list[int] = []
    began = time.monotonic()
    with httpx.Client(base_url=server.url, timeout=120) as http:
        while time.monotonic() - began < args.churn_seconds and server.alive():
            try:
                for action in ("unload", "load"):
                    changes[f"{action} {http.post(f'/v2/repository/models/m/{action}').status_code}"] += 1
                now = server.status()
            except (httpx.HTTPError, OSError) as exc:
                changes[type(exc).__name__] += 1
                continue
            seconds.append(round(time.monotonic() - began, 2))
            rss.append(now["VmRSS"])
            anon.append(now["RssAnon"])
    stop.set()
    for t in clients:
        t.join(90)
    alive = server.alive()
    return {"seconds": args.churn_seconds, "cycles": len(rss), "survived": alive,
            "live": server.live() if alive else None, "start_rss": start["VmRSS"], "start_anon": start["RssAnon"],
            **server.memory(), "loads_and_unloads": dict(changes), "infer_answers": dict(answers),
            "summary": churn_summary(rss, anon), "cycle_seconds": seconds, "rss_bytes": rss, "anon_bytes": anon}


def churn_summary(rss: list[int], anon: list[int]) -> dict[str, Any]:
    """RSS after the first tenth of the cycles (warmed up), at the end, its most, and the
    anonymous RSS's least-squares slope over the second half, per 100 cycles."""
    if not rss:
        return {}
    warm = max(len(rss) // 10, 1) - 1
    half = anon[len(anon) // 2:]
    slope = None
    if len(half) >= 10:
        xs = list(range(len(half)))
        mx, my = statistics.fmean(xs), statistics.fmean(half)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, half, strict=True)) / sum((x - mx) ** 2 for x in xs) * 100
    return {"rss_warm": rss[warm], "rss_end": rss[-1], "rss_max": max(rss), "anon_warm": anon[warm],
            "anon_end": anon[-1], "anon_max": max(anon), "anon_slope_bytes_per_100_cycles": slope}


def run(args: argparse.Namespace) -> dict[str, Any]:
    repository, module = prepare_repository(args)
    probe = Cgroup()
    probe.remove()
    out: dict[str, Any] = {"machine": machine(), "args": vars(args), "cgroup": probe.available,
                           "code": code_version(args.src), "server_module": module}
    phases = set(args.phases.split(","))
    # phases 1-3 on one server (SIGTERM ends it)
    server = Server(args, repository) if "infer" in phases else None
    try:
        if server is not None and httpx.get(f"{server.url}/v2/models/m/ready", timeout=30).status_code != 200:
            raise SystemExit(f"model m is not ready: {httpx.post(server.url + '/v2/repository/index').json()}")
        if server is not None and flood(server, out):
            out["trickle"] = trickle(server, args, ("/v2/models/m/infer",), ("/v2/models/m/infer",
                                                                               *binary_request(server.url)))
            print(out["trickle"], flush=True)
            out["sigterm"] = sigterm(server, args, ("/v2/models/m/infer",))
            print(out["sigterm"], flush=True)
    finally:
        if server is not None:
            server.stop()
    if "generation" in phases:
        out["generation"] = generation_cases(args, repository)
        generation_slow(args, repository, out)
    if "churn" in phases and args.churn_seconds > 0:
        server = Server(args, repository)
        try:
            out["churn"] = churn(server, args)
            print({k: v for k, v in out["churn"].items() if not isinstance(v, list)}, flush=True)
        finally:
            server.stop()
    return out


def generation_slow(args: argparse.Namespace, repository: Path, out: dict[str, Any]) -> None:
    """Phases 5 and 6 on one server (SIGTERM ends it)."""
    server = Server(args, repository)
    try:
        real = ("/v1/completions", b'{"model":"llm","max_tokens":1,"prompt":"w1 w2 w3"}', {})
        out["generation_trickle"] = trickle(server, args, GENERATION_ROUTES, real)
        print(out["generation_trickle"], flush=True)
        if server.alive():
            out["generation_sigterm"] = sigterm(server, args, GENERATION_ROUTES)
            print(out["generation_sigterm"], flush=True)
    finally:
        server.stop()


def code_version(src: str | None) -> str:
    """The commit the server runs (this checkout's, or that of ``--src``'s checkout)."""
    where = Path(src).resolve() if src else Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit


# --- the page ---------------------------------------------------------------------------------


def _case_key(case: dict) -> tuple[str, str, float]:
    return case["route"], case["body"], case["body_mib"]


def _ratio(after: float | None, before: float | None) -> str:
    return "-" if not after or not before else f"{after / before:.2f}"


def markdown(r: dict[str, Any], before: dict[str, Any] | None = None) -> str:
    """The run's summary; with ``before`` (an earlier run's JSON) each figure beside its."""
    a = r["args"]
    lines = [f"# Hostile clients ({a['name']})", "",
             f"`bench/serve_hostile.py`, {a['model']} at {a['resolution']} px (`m`) and a tiny Llama (`llm`), "
             f"--memory-budget {a['memory_budget']}, --max-body 64MB (default), --shutdown-grace {a['grace']}, "
             f"each server in a memory cgroup of {a['cgroup_limit'] / 1e6:.0f} MB; server at commit "
             f"{r.get('code', 'unknown')} ({'--src ' + a['src'] if a['src'] else 'this checkout'}, importing "
             f"`{r.get('server_module', '?')}`); {r['machine'].get('cpu', '')}, {r['machine'].get('cores')} cores", ""]
    if before is not None:
        lines += [f"Beside: `{before['args']['name']}` (server at commit {before.get('code', 'unknown')}), "
                  "from the same machine and session; ratios are this run's over that one's.", ""]
    lines += [f"Idle server RSS: {mb(r.get('idle_rss'))} MB.", "",
              "| flood (/v2 infer) | run | body MB | answers | server alive | peak RSS MB | cgroup peak MB | OOM kills |",
              "|---|---|---:|---|---|---:|---:|---:|"]
    for n in (1, 4):
        for run_ in ([before] if before is not None else []) + [r]:
            f = run_.get(f"flood_{n}")
            if f:
                lines.append(f"| {n} at once | {run_['args']['name']} | {f['body_mb']:.1f} | {f['statuses']} | "
                             f"{f['server_alive']} | {mb(f['vm_hwm'])} | {mb(f['cgroup_peak'])} | {f['oom_kills']} |")
    lines += ["", "## Generation bodies", "",
              "One body at a time; a server that died is replaced for the next case. 'status' is the answer, or "
              "the error the client saw (the connection dropped when the process was killed).", ""]
    old = {_case_key(c): c for c in (before or {}).get("generation", [])}
    if before is not None:
        lines += ["| route | body | MiB | status (before → after) | alive, /v2/health/live (before → after) | "
                  "peak RSS MB (before → after) | cgroup peak MB (before → after) | ratio | OOM kills (before → after) |",
                  "|---|---|---:|---|---|---:|---:|---:|---|"]
    else:
        lines += ["| route | body | MiB | status | alive, /v2/health/live | peak RSS MB | cgroup peak MB | OOM kills |",
                  "|---|---|---:|---|---|---:|---:|---:|"]
    for c in r.get("generation", []):
        alive = f"{c['server_alive']}, {c['live']}"
        if before is not None:
            b = old.get(_case_key(c), {})
            lines.append(f"| {c['route']} | {c['body']} | {c['body_mib']:g} | {b.get('status', '-')} → {c['status']} | "
                         f"{b.get('server_alive', '-')}, {b.get('live', '-')} → {alive} | "
                         f"{mb(b.get('vm_hwm'))} → {mb(c['vm_hwm'])} | {mb(b.get('cgroup_peak'))} → "
                         f"{mb(c['cgroup_peak'])} | {_ratio(c['cgroup_peak'], b.get('cgroup_peak'))} | "
                         f"{b.get('oom_kills', '-')} → {c['oom_kills']} |")
        else:
            lines.append(f"| {c['route']} | {c['body']} | {c['body_mib']:g} | {c['status']} | {alive} | "
                         f"{mb(c['vm_hwm'])} | {mb(c['cgroup_peak'])} | {c['oom_kills']} |")
    cases = r.get("generation", [])
    if cases:
        survived = sum(1 for c in cases if c["server_alive"] and c["live"] == 200)
        peaks = [c["cgroup_peak"] for c in cases if c["cgroup_peak"]]
        line = f"Server alive and live after {survived} of {len(cases)} cases"
        if peaks:
            line += f"; cgroup peak median {mb(statistics.median(peaks))} MB, most {mb(max(peaks))} MB"
        if before is not None and before.get("generation"):
            b_cases = before["generation"]
            b_survived = sum(1 for c in b_cases if c["server_alive"] and c["live"] == 200)
            b_peaks = [c["cgroup_peak"] for c in b_cases if c["cgroup_peak"]]
            line += f" (before: {b_survived} of {len(b_cases)}"
            if b_peaks:
                line += f", median {mb(statistics.median(b_peaks))} MB, most {mb(max(b_peaks))} MB"
            line += ")"
        lines += ["", line + "."]
    for key, title in (("trickle", "Trickle on /v2 infer"), ("generation_trickle", "Trickle on the generation routes")):
        t = r.get(key)
        if t:
            lines += ["", f"{title}: {t['slow_connections']} connections sending a byte every 2 s, one client sending "
                      f"real requests for {t['seconds']} s: {t['sent']} sent, answers {t['answers']}; the slow ones "
                      f"got {t['slow_answers']}." + _before_note(before, key, lambda v: f"{v['sent']} sent, answers "
                                                                 f"{v['answers']}, the slow ones {v['slow_answers']}")]
    for key, title in (("sigterm", "SIGTERM with slow connections on /v2 infer"),
                       ("generation_sigterm", "SIGTERM with slow connections on the generation routes")):
        s = r.get(key)
        if s:
            lines += ["", f"{title}, --shutdown-grace {s['grace_s']}: {_exited(s)}; the slow ones got "
                      f"{s['slow_answers']}." + _before_note(before, key, lambda v: f"{_exited(v)}, the slow ones "
                                                             f"{v['slow_answers']}")]
    c = r.get("churn")
    if c:
        lines += ["", "## Load/unload churn", "",
                  f"`m` unloaded and loaded in a loop for up to {c['seconds']} s while 4 clients infer on it; RSS "
                  "read after every cycle.", "",
                  "| run | cycles | survived | RSS at start MB | RSS warm MB | RSS end MB | RSS most MB | anon warm MB | "
                  "anon end MB | anon slope MB / 100 cycles (2nd half) | cgroup peak MB | OOM kills |",
                  "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        runs = [(before["args"]["name"], before["churn"])] if before is not None and before.get("churn") else []
        for name, v in [*runs, (a["name"], c)]:
            s = v.get("summary") or {}
            slope = s.get("anon_slope_bytes_per_100_cycles")
            lines.append(f"| {name} | {v['cycles']} | {v['survived']} | {mb(v['start_rss'])} | {mb(s.get('rss_warm'))} | "
                         f"{mb(s.get('rss_end'))} | {mb(s.get('rss_max'))} | {mb(s.get('anon_warm'))} | "
                         f"{mb(s.get('anon_end'))} | {'-' if slope is None else f'{slope / 1e6:.2f}'} | "
                         f"{mb(v['cgroup_peak'])} | {v['oom_kills']} |")
        lines += ["", f"Infer answers during the churn: {c['infer_answers']}; unloads and loads: "
                  f"{c['loads_and_unloads']}.", "", "RSS (MB) every tenth of the cycles: "
                  + ", ".join(mb(v) for v in c["rss_bytes"][:: max(len(c["rss_bytes"]) // 10, 1)]) + "."]
    return "\n".join(lines) + "\n"


def _exited(s: dict) -> str:
    if s.get("exit_s") is not None:
        return f"exited {s['exit_s']} s after SIGTERM"
    return f"still running {s['still_running_after_s']} s after SIGTERM"


def _before_note(before: dict | None, key: str, describe: Any) -> str:
    if before is None or not before.get(key):
        return ""
    return f" Before: {describe(before[key])}."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="blazeface")
    parser.add_argument("--resolution", type=int, default=128)
    parser.add_argument("--memory-budget", default="16MB")
    parser.add_argument("--cgroup-limit", type=int, default=700_000_000, help="bytes each server's cgroup may hold")
    parser.add_argument("--grace", type=float, default=2.0, help="the servers' --shutdown-grace")
    parser.add_argument("--slow", type=int, default=64)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--sizes-mib", default="3,55", help="body sizes of the generation cases, MiB, comma-separated")
    parser.add_argument("--case-timeout", type=float, default=120.0, help="seconds a generation case may take")
    parser.add_argument("--churn-seconds", type=float, default=600.0)
    parser.add_argument("--phases", default="infer,generation,churn",
                        help="which phases run, comma-separated: infer, generation, churn (all by default)")
    parser.add_argument("--sigterm-wait", type=float, default=120.0)
    parser.add_argument("--src", default=None, help="run the server from this source tree (PYTHONPATH)")
    parser.add_argument("--compare", default=None, help="an earlier run's name whose figures to show beside")
    parser.add_argument("--name", default="serve_hostile")
    args = parser.parse_args(argv)
    unknown = set(args.phases.split(",")) - {"infer", "generation", "churn"}
    if unknown:
        parser.error(f"--phases: no phase {', '.join(sorted(unknown))} (infer, generation, churn)")
    before = json.loads((RESULTS / f"{args.compare}.json").read_text()) if args.compare else None
    result = run(args)
    text = markdown(result, before)
    write_results(args.name, result, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
