"""Load test of ``layerfit serve``: K concurrent clients for T seconds, several models.

The server runs as its own process (``python -m layerfit.cli serve``) on a loopback port,
inside its own memory cgroup where one can be created, over a repository of zoo models
prepared for the run, at a tight memory budget. K client threads each keep one HTTP
connection and send Open Inference Protocol requests (binary tensor data by default,
``--json`` for JSON tensors) to the models in turn, as fast as answers come back, for T
seconds. Then the clients stop sending and the server gets SIGTERM *while their last
requests are in flight*, so the run also checks graceful shutdown under load.

Reported: throughput (answered 200 per second during the load phase), latency
p50/p95/p99 of successful requests (overall and per model), answers by status, the
server's peak RSS (its ``VmHWM`` at the end of the load: exact, not sampled), the cgroup
peak where available (counts the page cache too), the runtime ledger's peak against the
budget (from ``/metrics``), and two counts that must be zero: requests that were sent
and never answered, and clients that saw a broken connection. Requests refused at
connect time after SIGTERM (the listener is closed) were never accepted and are counted
apart. Nothing here asserts a timing.

``--storage sd`` throttles the server's reads to a Raspberry Pi 4's microSD card (cgroup
v1 blkio, root), where reading weights is what costs; ``--no-cache-weights`` serves
without the weight cache (every request reads its units again).

Every loop is bounded: ``--duration`` (at most 600 s), ``--max-requests`` in total, a
timeout on every request and on every join. Loopback only.

Writes ``bench/results/serve_load.json`` and ``.md``. From the repository root::

    .venv/bin/python bench/serve_load.py --clients 8 --duration 60 \\
        --models mobilenet_v1_025,blazeface,deeplab_v3,mobilenet_v2 --memory-budget 24MB

A model prepared from keyword arguments gets a request tensor per input the server lists
(integer ones are ids below 32): ``--models whisper_base`` serves a Whisper-base (seeded,
from ``encoder_decoder.py``) on 30 s of audio features and a 4-token decoder prompt::

    .venv/bin/python bench/serve_load.py --models whisper_base --clients 2 --duration 40 \\
        --memory-budget 160MB --name serve_whisper_160
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_limits import Cgroup  # noqa: E402
from reporting import machine, mb, write_results  # noqa: E402
from storage import SD_CARD, Storage  # noqa: E402

DEFAULT_MODELS = "mobilenet_v1_025,blazeface,deeplab_v3,mobilenet_v2"
NUMPY_TYPES = {"FP32": np.float32, "FP16": np.float16, "FP64": np.float64, "INT64": np.int64,
               "INT32": np.int32, "UINT8": np.uint8, "INT8": np.int8, "BOOL": np.bool_}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=8, help="concurrent clients K")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load T (at most 600)")
    p.add_argument("--models", default=DEFAULT_MODELS, help="comma list of zoo models to prepare and serve")
    p.add_argument("--repository", help="serve this folder of prepared models instead of preparing --models")
    p.add_argument("--memory-budget", default="24MB", help="the server's memory budget (tight: below the models' sum, at least the largest one's need)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--policy", default="masa-fair", help="the server's scheduling policy (its default)")
    p.add_argument("--units", default="merge:auto", help="the server's --units: merge:auto (its default), layers or merge:SIZE")
    p.add_argument("--no-cache-weights", dest="cache_weights", action="store_false",
                   help="serve with --no-cache-weights (every request reads its units again)")
    p.add_argument("--return-freed-memory", default="after-pass",
                   help="the server's --return-freed-memory: after-pass (its default), eagerly or never")
    p.add_argument("--storage", default="vm", help="vm: this machine's disk as it is; sd: the server's reads "
                   "throttled (cgroup v1 blkio, root) to a Raspberry Pi 4's microSD card")
    p.add_argument("--torch-threads", type=int, help="OMP_NUM_THREADS for the server (default: torch's own)")
    p.add_argument("--threads", type=int, help="the server's --threads: threads each kernel uses (default: torch's)")
    p.add_argument("--queue-limit", type=int, default=16, help="server queue limit (beyond it: 429)")
    p.add_argument("--timeout", type=float, default=30.0, help="server per-request timeout, seconds")
    p.add_argument("--shutdown-grace", type=float, default=5.0, help="seconds admitted requests may finish after SIGTERM")
    p.add_argument("--max-requests", type=int, default=200_000, help="bound on requests sent in total")
    p.add_argument("--json", action="store_true", help="JSON tensors instead of binary tensor data")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", default="serve_load", help="result file name under bench/results/")
    args = p.parse_args(argv)
    if not 0 < args.duration <= 600:
        p.error("--duration must be in (0, 600] seconds")
    if not 1 <= args.clients <= 256:
        p.error("--clients must be between 1 and 256")
    return args


# --- the server ----------------------------------------------------------------------------


def whisper_example() -> dict[str, Any]:
    """Whisper-base's call: ``encoder_decoder.py``'s 30 s of audio features and a 4-token
    decoder prompt."""
    import torch
    from encoder_decoder import model_input

    key, features = model_input("whisper")
    return {key: features, "decoder_input_ids": torch.tensor([[50258, 50259, 50359, 50363]])}


# Models of this folder's benches, prepared from keyword arguments (not in the zoo); the
# server finds their factories through PYTHONPATH.
KEYWORD_MODELS = {"whisper_base": ("encoder_decoder:whisper_base", whisper_example)}


def prepare_repository(models: list[str], root: Path) -> Path:
    from layerfit.store import prepare

    for name in models:
        if name in KEYWORD_MODELS:
            factory, example = KEYWORD_MODELS[name]
            prepare(factory, root / name, example=example())
        else:
            prepare(name, root / name)
    return root


def start_server(
    args: argparse.Namespace, repository: Path, cgroup: Cgroup, storage: Storage
) -> tuple[subprocess.Popen, str, list[str]]:
    # the bench's own factories (KEYWORD_MODELS) rebuild the models it prepared
    command = [sys.executable, "-m", "layerfit.cli", "--trust-factory", "encoder_decoder", "serve",
               "--repository", str(repository),
               "--budget", args.memory_budget, "--workers", str(args.workers), "--policy", args.policy,
               "--units", args.units, "--cache-weights" if args.cache_weights else "--no-cache-weights",
               "--return-freed-memory", args.return_freed_memory,
               "--host", "127.0.0.1", "--port", "0", "--queue-limit", str(args.queue_limit),
               "--timeout", str(args.timeout), "--shutdown-grace", str(args.shutdown_grace),
               "--log-level", "warning"]
    if args.threads is not None:
        command += ["--threads", str(args.threads)]
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parent)  # the factories of KEYWORD_MODELS
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
    if args.torch_threads is not None:
        env["OMP_NUM_THREADS"] = str(args.torch_threads)
    enters = [fn for fn in (cgroup.enter_fn(), storage.enter_fn()) if fn is not None]

    def enter() -> None:  # the child's memory cgroup and storage throttle, before it starts
        for fn in enters:
            fn()

    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=enter if enters else None, env=env)
    lines: list[str] = []
    found: list[str] = []

    def read() -> None:  # the URL line, then keep draining so the pipe never fills
        for line in proc.stdout:
            lines.append(line.rstrip())
            match = re.search(r"at (http://\S+)/v2", line)
            if match and not found:
                found.append(match.group(1))
                ready.set()
        ready.set()

    ready = threading.Event()
    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(300) or not found:
        proc.kill()
        proc.wait()
        raise SystemExit("the server did not start:\n" + "\n".join(lines[-20:]))
    return proc, found[0], lines


def vm_hwm(pid: int) -> int:
    """The server's peak resident memory since it started (``VmHWM``: its own, unlike
    ``getrusage``'s, which an exec'd child inherits from the parent that prepared models)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


def scrape(url: str) -> dict[str, float]:
    """The server's Prometheus samples (name{labels} -> value)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


# --- the clients -----------------------------------------------------------------------------


def request_for(meta: dict[str, Any], rng: np.random.Generator, use_json: bool) -> tuple[bytes, dict[str, str]]:
    """A ready-to-send body for ``meta``'s inputs (binary or JSON tensor data): one for most
    models, one per keyword for a model prepared from keyword arguments (Whisper's features
    and decoder ids). Integer inputs are ids below 32, as layerfit's example inputs."""
    tensors, raws = [], []
    for spec in meta["inputs"]:
        dtype = NUMPY_TYPES[spec["datatype"]]
        if np.issubdtype(dtype, np.integer):
            x = rng.integers(0, 32, spec["shape"]).astype(dtype)
        else:
            x = rng.standard_normal(spec["shape"]).astype(dtype)
        tensor: dict[str, Any] = {"name": spec["name"], "shape": spec["shape"], "datatype": spec["datatype"]}
        if use_json:
            tensor["data"] = x.reshape(-1).tolist()
        else:
            raws.append(x.tobytes())
            tensor["parameters"] = {"binary_data_size": len(raws[-1])}
        tensors.append(tensor)
    if use_json:
        return json.dumps({"inputs": tensors}).encode(), {"content-type": "application/json"}
    head = json.dumps({"inputs": tensors, "parameters": {"binary_data_output": True}}).encode()
    return head + b"".join(raws), {"Inference-Header-Content-Length": str(len(head)),
                                   "content-type": "application/octet-stream"}


class Tally:
    """What the clients saw, shared under one lock."""

    def __init__(self, max_requests: int) -> None:
        self.lock = threading.Lock()
        self.max_requests = max_requests
        self.sent = 0
        self.records: list[tuple[str, str, float, float]] = []  # model, status, start, latency

    def take(self) -> bool:
        with self.lock:
            if self.sent >= self.max_requests:
                return False
            self.sent += 1
            return True

    def add(self, model: str, status: str, start: float, latency: float) -> None:
        with self.lock:
            self.records.append((model, status, start, latency))


def client(url: str, bodies: list[tuple[str, bytes, dict[str, str]]], offset: int, tally: Tally,
           stop: threading.Event, timeout: float) -> None:
    """Send requests round-robin over the models until ``stop``, the count bound, or refusal."""
    with httpx.Client(base_url=url, timeout=timeout) as session:
        i = offset
        while not stop.is_set() and tally.take():
            model, body, headers = bodies[i % len(bodies)]
            i += 1
            start = time.perf_counter()
            try:
                response = session.post(f"/v2/models/{model}/infer", content=body, headers=headers)
                status = str(response.status_code)
            except httpx.ConnectError:
                tally.add(model, "refused", start, time.perf_counter() - start)
                return  # the server closed its listener: not accepted, nothing to answer
            except httpx.HTTPError as exc:  # sent, then the connection broke: unanswered
                tally.add(model, f"unanswered:{type(exc).__name__}", start, time.perf_counter() - start)
                return
            tally.add(model, status, start, time.perf_counter() - start)


# --- the run ------------------------------------------------------------------------------------


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50_ms": None, "p95_ms": None, "p99_ms": None, "mean_ms": None}
    a = np.asarray(values) * 1e3
    return {"p50_ms": float(np.percentile(a, 50)), "p95_ms": float(np.percentile(a, 95)),
            "p99_ms": float(np.percentile(a, 99)), "mean_ms": float(a.mean())}


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="layerfit-serve-load-"))
    cgroup = Cgroup()
    storage: Storage | None = None
    try:
        models = [m.strip() for m in args.models.split(",") if m.strip()]
        t0 = time.perf_counter()
        repository = Path(args.repository) if args.repository else prepare_repository(models, work / "repo")
        prepare_s = time.perf_counter() - t0
        storage = Storage(args.storage, repository)
        proc, url, log = start_server(args, repository, cgroup, storage)
        try:
            index = httpx.post(f"{url}/v2/repository/index", timeout=30).json()
            ready = [row["name"] for row in index if row["state"] == "READY"]
            if not ready:
                raise SystemExit(f"no model is ready: {index}")
            rng = np.random.default_rng(args.seed)
            bodies = []
            for name in ready:
                meta = httpx.get(f"{url}/v2/models/{name}", timeout=30).json()
                bodies.append((name, *request_for(meta, rng, args.json)))
            tally = Tally(args.max_requests)
            stop = threading.Event()
            threads = [threading.Thread(target=client, args=(url, bodies, k, tally, stop, args.timeout + 30),
                                        daemon=True) for k in range(args.clients)]
            read_at_start = storage.bytes_read()
            start = time.perf_counter()
            for t in threads:
                t.start()
            stop.wait(args.duration)
            load_end = time.perf_counter()
            read_during_load = None if read_at_start is None else storage.bytes_read() - read_at_start
            metrics = scrape(url)
            peak_rss = vm_hwm(proc.pid)
            stop.set()  # no new requests; those in flight are still waiting for answers
            proc.send_signal(signal.SIGTERM)
            returncode = proc.wait(timeout=args.shutdown_grace + args.timeout + 120)
            for t in threads:
                t.join(args.timeout + 60)
            hung = sum(t.is_alive() for t in threads)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        cgroup_peak = cgroup.peak_bytes()
    finally:
        cgroup.remove()
        if storage is not None:
            storage.remove()
        shutil.rmtree(work, ignore_errors=True)

    during = [r for r in tally.records if r[2] < load_end]
    after = [r for r in tally.records if r[2] >= load_end]
    ok = [r for r in during if r[1] == "200"]
    by_model: dict[str, Any] = {}
    grouped: dict[str, list[tuple]] = defaultdict(list)
    for r in during:
        grouped[r[0]].append(r)
    for name, rows in sorted(grouped.items()):
        lat = [r[3] for r in rows if r[1] == "200"]
        by_model[name] = {"requests": len(rows), "ok": len(lat), **percentiles(lat)}
    statuses = Counter(r[1] for r in tally.records)
    elapsed = load_end - start
    return {
        "config": {k: v for k, v in vars(args).items()},
        "models": ready,
        "prepare_s": prepare_s,
        "load_seconds": elapsed,
        "requests_sent": tally.sent,
        "requests_during_load": len(during),
        "throughput_rps": len(ok) / elapsed if elapsed > 0 else 0.0,
        "latency": percentiles([r[3] for r in ok]),
        # what the throttled card served while the clients ran, and its share of the card's
        # rate x time: the throttle can credit short idle gaps, which a card cannot
        "storage_read_bytes": read_during_load,
        "storage_read_share_of_rate": None if read_during_load is None
        else read_during_load / (SD_CARD["read_bps"] * elapsed),
        "by_model": by_model,
        "status_counts": dict(sorted(statuses.items())),
        "status_counts_after_sigterm": dict(sorted(Counter(r[1] for r in after).items())),
        "unanswered": sum(n for s, n in statuses.items() if s.startswith("unanswered")),
        "clients_hung": hung,
        "refused_after_sigterm": statuses.get("refused", 0),
        "server_exit": returncode,
        "server_peak_rss_bytes": peak_rss,
        "server_cgroup_peak_bytes": cgroup_peak,
        "ledger": {
            "budget_bytes": metrics.get('layerfit_memory_bytes{kind="budget"}'),
            "peak_bytes": metrics.get('layerfit_memory_bytes{kind="peak"}'),
            "progress_rule": metrics.get("layerfit_progress_rule_total"),
            "weight_cache_hits": metrics.get('layerfit_weight_cache_loads_total{result="hit"}'),
            "weight_cache_misses": metrics.get('layerfit_weight_cache_loads_total{result="miss"}'),
            "weight_cache_evictions": metrics.get("layerfit_weight_cache_evictions_total"),
        },
        "server_log_tail": log[-10:],
        "machine": machine(),
    }


def cache_line(ledger: dict[str, Any]) -> list[str]:
    """The weight cache's unit loads, when the server had one."""
    hits, misses = ledger.get("weight_cache_hits"), ledger.get("weight_cache_misses")
    if hits is None or misses is None:
        return []
    share = hits / (hits + misses) if hits + misses else 0.0
    return [f"Unit loads (whole run, warm-up included): {hits:.0f} from the weight cache, {misses:.0f} read "
            f"({share:.0%} hits), {ledger.get('weight_cache_evictions') or 0:.0f} evictions.", ""]


def storage_line(r: dict[str, Any]) -> list[str]:
    read = r.get("storage_read_bytes")
    if read is None:
        return []
    return [f"The card served {mb(read)} MB while the clients ran, {r['storage_read_share_of_rate']:.0%} of "
            "its rate x time. The throttle credits reads with short idle gaps before them, which a card "
            "cannot; a share near 100 % means the disk was rarely idle, so the credit gained little.", ""]


def markdown(r: dict[str, Any]) -> str:
    c = r["config"]
    lat = r["latency"]

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    lines = [
        "# layerfit serve — load test",
        "",
        f"{c['clients']} clients for {r['load_seconds']:.1f} s against {', '.join(r['models'])}; budget "
        f"{c['memory_budget']}, {c['workers']} workers, policy {c['policy']}, units {c.get('units', 'layers')}, "
        f"weight cache {'on' if c.get('cache_weights', False) else 'off'}, "
        f"freed memory returned {c.get('return_freed_memory', 'eagerly')}, "
        f"OMP_NUM_THREADS {c.get('torch_threads') or 'unset'}, --threads {c.get('threads') or 'unset'}, "
        f"queue limit {c['queue_limit']}, "
        f"{'reads throttled to a Pi 4 microSD card (43.7 MB/s), ' if c.get('storage') == 'sd' else ''}"
        f"{'JSON' if c['json'] else 'binary'} tensors; SIGTERM sent with the clients' last requests in flight.",
        "",
        "| throughput (req/s) | p50 ms | p95 ms | p99 ms | sent | unanswered | server peak RSS MB | cgroup peak MB | ledger peak / budget MB |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {r['throughput_rps']:.1f} | {ms(lat['p50_ms'])} | {ms(lat['p95_ms'])} | {ms(lat['p99_ms'])} | "
        f"{r['requests_sent']} | {r['unanswered']} | {mb(r['server_peak_rss_bytes'])} | "
        f"{mb(r['server_cgroup_peak_bytes'])} | {mb(r['ledger']['peak_bytes'])} / {mb(r['ledger']['budget_bytes'])} |",
        "",
        "| model | requests | ok | p50 ms | p95 ms | p99 ms |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, m in r["by_model"].items():
        lines.append(f"| {name} | {m['requests']} | {m['ok']} | {ms(m['p50_ms'])} | {ms(m['p95_ms'])} | {ms(m['p99_ms'])} |")
    lines += [
        "",
        *cache_line(r["ledger"]),
        *storage_line(r),
        "Answers by status (whole run): " + ", ".join(f"{k}: {v}" for k, v in r["status_counts"].items()),
        "",
        "After SIGTERM: " + (", ".join(f"{k}: {v}" for k, v in r["status_counts_after_sigterm"].items()) or "none")
        + f"; server exit status {r['server_exit']}; clients hung: {r['clients_hung']}.",
        "'refused' = connection refused after the listener closed (never accepted).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    result = run(args)
    js, md = write_results(args.name, result, markdown(result))
    print(markdown(result))
    print(f"wrote {js} and {md}")
    return 0 if result["unanswered"] == 0 and result["clients_hung"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
