"""Hostile clients against ``layerfit serve``: memory under flooding bodies, service under
trickling ones, and shutdown with them connected.

The server runs as its own process in its own memory cgroup (which counts the page
cache too) at a tight ``--memory-budget``, over one zoo model. Three phases, each
bounded in requests and time, loopback only:

1. **flood**: one, then four concurrent JSON bodies just under ``--max-body`` (the value
   ``0`` repeated: the most Python objects per byte), each against the model's real
   input; the server's peak RSS (``VmHWM``, reset before the phase) and the cgroup's
   peak (reset too) are read after.
2. **trickle**: ``--slow`` connections each send a body one byte every 2 s while one
   client sends real binary requests for ``--duration`` seconds: answers by status.
3. **sigterm**: the slow connections again, mid-body, then SIGTERM with
   ``--shutdown-grace 2``: seconds until the process exited, and what the slow clients got.

``--src DIR`` runs the server from another checkout's ``src`` (the code before a change),
so before and after are measured on one machine in one session.

    .venv/bin/python bench/serve_hostile.py --name serve_hostile_after
    .venv/bin/python bench/serve_hostile.py --src /tmp/old/src --name serve_hostile_before
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Cgroup, launch_server, machine, mb, prepared_zoo_model, vm_hwm, write_results  # noqa: E402

CACHE = Path(__file__).parent / ".cache" / "serve_hostile"


def start_server(args: argparse.Namespace, repository: Path, cgroup: Cgroup) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "layerfit.cli", "serve", "--repository", str(repository),
               "--memory-budget", args.memory_budget, "--host", "127.0.0.1", "--port", "0",
               "--shutdown-grace", "2", "--log-level", "warning", "--queue-limit", "64"]
    env = dict(os.environ)
    if args.src:
        env["PYTHONPATH"] = str(Path(args.src).resolve())
    return launch_server(command, env=env, preexec_fn=cgroup.enter_fn())


def reset_peaks(pid: int, cgroup: Cgroup) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM back to the current RSS
    if cgroup.available:
        (cgroup.path / "memory.max_usage_in_bytes").write_text("0")


def flood_body(input_name: str, shape: list[int], max_body: int) -> bytes:
    head = f'{{"inputs": [{{"name": "{input_name}", "shape": {shape}, "datatype": "FP32", "data": ['.encode()
    tail = b"0]}]}"
    count = (max_body - len(head) - len(tail) - 1024) // 2
    return head + b"0," * count + tail


def slow_clients(url: str, count: int, stop: threading.Event, every: float = 2.0) -> list[dict]:
    host, port = url.removeprefix("http://").split(":")
    results: list[dict] = []

    def run(result: dict) -> None:
        try:
            with socket.create_connection((host, int(port)), timeout=30) as sock:
                sock.sendall(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
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

    for _ in range(count):
        result: dict = {"status": None}
        results.append(result)
        threading.Thread(target=run, args=(result,), daemon=True).start()
    return results


def run(args: argparse.Namespace) -> dict[str, Any]:
    directory = prepared_zoo_model(args.model, args.resolution, CACHE)
    repository = CACHE / "repository"
    repository.mkdir(parents=True, exist_ok=True)
    copy = repository / "m"  # a copy: a link out of the repository folder is refused
    if copy.is_symlink():
        copy.unlink()
    if not copy.exists():
        shutil.copytree(directory, copy)
    cgroup = Cgroup()
    proc, url = start_server(args, repository, cgroup)
    out: dict[str, Any] = {"machine": machine(), "args": vars(args), "cgroup": cgroup.available,
                           "code": code_version(args.src)}
    try:
        with httpx.Client(base_url=url, timeout=120) as http:
            if http.get("/v2/models/m/ready").status_code != 200:
                raise SystemExit(f"model m is not ready: {http.post('/v2/repository/index').json()}")
            meta = http.get("/v2/models/m").json()
            spec = meta["inputs"][0]
            x = np.random.default_rng(0).standard_normal(spec["shape"]).astype(np.float32)
            body = flood_body(spec["name"], spec["shape"], 64_000_000 - 400_000)
            time.sleep(1.0)
            out["idle_rss"] = vm_hwm(proc.pid)
            for concurrent in (1, 4):
                reset_peaks(proc.pid, cgroup)
                statuses: list[int] = []

                def send(statuses: list[int] = statuses) -> None:
                    try:
                        statuses.append(httpx.post(f"{url}/v2/models/m/infer", content=body, timeout=120).status_code)
                    except httpx.HTTPError as exc:
                        statuses.append(-1)
                        out.setdefault("flood_errors", []).append(repr(exc))

                threads = [threading.Thread(target=send) for _ in range(concurrent)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(300)
                alive = proc.poll() is None
                out[f"flood_{concurrent}"] = {
                    "body_mb": len(body) / 1e6, "statuses": statuses, "server_alive": alive,
                    "vm_hwm": vm_hwm(proc.pid) if alive else None,
                    "cgroup_peak": cgroup.peak_bytes(), "oom_kills": cgroup.oom_kills(),
                }
                print(concurrent, out[f"flood_{concurrent}"], flush=True)
                if not alive:
                    return out
            # trickle: slow bodies while a client sends real requests
            stop = threading.Event()
            slow = slow_clients(url, args.slow, stop)
            time.sleep(2.0)
            tally: dict[str, int] = {}
            binary = x.tobytes()
            header = (f'{{"inputs": [{{"name": "{spec["name"]}", "shape": {spec["shape"]}, "datatype": "FP32", '
                      f'"parameters": {{"binary_data_size": {len(binary)}}}}}]}}').encode()
            end = time.monotonic() + args.duration
            sent = 0
            while time.monotonic() < end and sent < 10_000:
                sent += 1
                try:
                    r = http.post("/v2/models/m/infer", content=header + binary,
                                  headers={"Inference-Header-Content-Length": str(len(header))}, timeout=30)
                    tally[str(r.status_code)] = tally.get(str(r.status_code), 0) + 1
                except httpx.HTTPError as exc:
                    tally[type(exc).__name__] = tally.get(type(exc).__name__, 0) + 1
            stop.set()
            time.sleep(2.5)
            out["trickle"] = {"slow_connections": args.slow, "seconds": args.duration, "sent": sent, "answers": tally,
                              "slow_answers": _count(slow)}
            print(out["trickle"], flush=True)
        # SIGTERM with slow clients connected
        stop = threading.Event()
        slow = slow_clients(url, args.slow, stop)
        time.sleep(0.7)  # all connected and mid-body, before a minimum rate could cut them
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(args.sigterm_wait)
            out["sigterm"] = {"exit_s": round(time.monotonic() - began, 2), "grace_s": 2.0}
        except subprocess.TimeoutExpired:
            out["sigterm"] = {"exit_s": None, "still_running_after_s": args.sigterm_wait, "grace_s": 2.0}
        stop.set()
        time.sleep(2.5)
        out["sigterm"]["slow_answers"] = _count(slow)
        print(out["sigterm"], flush=True)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        cgroup.remove()
    return out


def code_version(src: str | None) -> str:
    """The commit the server runs (this checkout's, or that of ``--src``'s checkout)."""
    where = Path(src).resolve() if src else Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit


def _count(results: list[dict]) -> dict[str, int]:
    tally: dict[str, int] = {}
    for r in results:
        key = str(r["status"])
        tally[key] = tally.get(key, 0) + 1
    return tally


def markdown(r: dict[str, Any]) -> str:
    lines = [f"# Hostile clients ({r['args']['name']})", "",
             f"`bench/serve_hostile.py`, {r['args']['model']} at {r['args']['resolution']} px, "
             f"--memory-budget {r['args']['memory_budget']}, --max-body 64MB (default), server at commit "
             f"{r.get('code', 'unknown')} ({'--src ' + r['args']['src'] if r['args']['src'] else 'this checkout'}); "
             f"{r['machine'].get('cpu', '')}", "",
             f"Idle server RSS: {mb(r.get('idle_rss'))} MB.", "",
             "| flood | body MB | answers | server alive | peak RSS MB | cgroup peak MB | OOM kills |",
             "|---|---:|---|---|---:|---:|---:|"]
    for n in (1, 4):
        f = r.get(f"flood_{n}")
        if f:
            lines.append(f"| {n} at once | {f['body_mb']:.1f} | {f['statuses']} | {f['server_alive']} | "
                         f"{mb(f['vm_hwm'])} | {mb(f['cgroup_peak'])} | {f['oom_kills']} |")
    t = r.get("trickle")
    if t:
        lines += ["", f"Trickle: {t['slow_connections']} connections sending a byte every 2 s, one client sending "
                  f"real requests for {t['seconds']} s: {t['sent']} sent, answers {t['answers']}; the slow ones got "
                  f"{t['slow_answers']}."]
    s = r.get("sigterm")
    if s:
        exited = f"exited {s['exit_s']} s after SIGTERM" if s.get("exit_s") is not None else \
            f"still running {s['still_running_after_s']} s after SIGTERM"
        lines += ["", f"SIGTERM with {r['args']['slow']} slow connections, --shutdown-grace 2: {exited}; "
                  f"the slow ones got {s['slow_answers']}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="blazeface")
    parser.add_argument("--resolution", type=int, default=128)
    parser.add_argument("--memory-budget", default="16MB")
    parser.add_argument("--slow", type=int, default=64)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--sigterm-wait", type=float, default=120.0)
    parser.add_argument("--src", default=None, help="run the server from this source tree (PYTHONPATH)")
    parser.add_argument("--name", default="serve_hostile")
    args = parser.parse_args(argv)
    result = run(args)
    write_results(args.name, result, markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
