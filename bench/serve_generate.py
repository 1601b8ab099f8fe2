"""Load test of generation over HTTP: K clients streaming completions from one server.

The server (``python -m layerfit.cli serve``, its own process on a loopback port) serves a
repository holding a Llama-style decoder of about 0.5 GB (the model of
``bench/decoding.py``, with a word-level tokenizer made here) and a Mixtral-style
mixture-of-experts decoder (``bench/moe_decoding.py``'s), both prepared with ``hf:``.
For K = 1, 2, 4, 8, K client threads each run the ``openai`` Python client against
``/v1/completions`` with ``stream=True``, greedy, sending requests back to back for the
phase's duration. Requests in flight decode together (one streamed read of each unit per
step for all of them). Reported per K: aggregate completion tokens per second, time to
first token p50/p95, time between tokens p50/p95, requests answered and failed; the
server's peak RSS (``VmHWM``) and the ledger's peak (``/metrics``). A last phase sends
SIGTERM while 4 clients' requests are in flight and counts requests that never got an
answer (must be 0). Writes ``bench/results/serve_generate.{json,md}``::

    .venv/bin/python bench/serve_generate.py [--models llama,mixtral] [--duration 30] [--budget 400MB]
        [--generation-weights 0.5] [--output serve_generate]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_limits import vm_hwm  # noqa: E402
from processes import launch_server  # noqa: E402
from reporting import machine, mb, progress, write_results  # noqa: E402

CACHE = Path(__file__).parent / ".cache" / "serve_generate"
WORDS = 32000
PROMPT = " ".join(f"w{(k * 37) % 1000 + 5}" for k in range(16))


def tokenizer() -> Any:
    """A word-level tokenizer over the models' 32000 ids (w0 .. w31999), made here."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    from tokenizers import decoders

    tok.decoder = decoders.WordPiece(prefix="##")  # words joined by spaces
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", eos_token="w1")


def repository(models: list[str]) -> Path:
    """The served repository: each model saved as Hugging Face publishes it, with the
    tokenizer, and prepared with hf: (made once)."""
    import torch
    import transformers

    from layerfit.store import prepare

    repo = CACHE / "repo"
    for name in models:
        if (repo / name / "manifest.json").is_file():
            continue
        folder = CACHE / f"{name}-hf"
        if not (folder / "config.json").is_file():
            torch.manual_seed(0)
            if name == "llama":
                from decoding import llama

                model = llama()
            else:
                from moe_decoding import CONFIG

                model = transformers.MixtralForCausalLM(transformers.MixtralConfig(**CONFIG)).eval()
            model.generation_config.eos_token_id = None  # random weights: decode the whole length
            model.save_pretrained(folder, max_shard_size="200MB")
            tokenizer().save_pretrained(folder)
        prepare("hf:" + str(folder), repo / name, force=True)
    return repo


def start_server(repo: Path, budget: str, generation_weights: float) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "layerfit.cli", "serve", "--repository", str(repo), "--budget", budget,
               "--generation-weights", str(generation_weights),
               "--host", "127.0.0.1", "--port", "0", "--queue-limit", "64", "--timeout", "600",
               "--shutdown-grace", "60", "--log-level", "warning"]
    return launch_server(command, wait=600)


def ledger_peak(url: str) -> float | None:
    import httpx

    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith('layerfit_memory_bytes{kind="peak"}'):
            return float(line.rpartition(" ")[2])
    return None


class Tally:
    """What the clients saw (appended under one lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.first: list[float] = []
        self.gaps: list[float] = []
        self.tokens = 0
        self.answered = 0
        self.failed: list[str] = []


def client(url: str, model: str, tokens: int, stop_at: float, tally: Tally, once: bool = False) -> None:
    """Stream completions back to back until ``stop_at`` (``once``: one request)."""
    import openai

    api = openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=600, max_retries=0)
    while once or time.perf_counter() < stop_at:
        once = False
        t0 = time.perf_counter()
        stamps: list[float] = []
        try:
            stream = api.completions.create(model=model, prompt=PROMPT, max_tokens=tokens, temperature=0,
                                            stream=True)
            for chunk in stream:
                if chunk.choices and chunk.choices[0].text:
                    stamps.append(time.perf_counter())
        except Exception as exc:  # counted, not raised: the tally says what failed
            with tally.lock:
                tally.failed.append(f"{type(exc).__name__}: {str(exc)[:120]}")
            continue
        with tally.lock:
            tally.answered += 1
            tally.tokens += len(stamps)
            if stamps:
                tally.first.append(stamps[0] - t0)
                tally.gaps.extend(b - a for a, b in zip(stamps, stamps[1:], strict=False))


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def phase(url: str, model: str, clients: int, duration: float, tokens: int) -> dict[str, Any]:
    tally = Tally()
    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(url, model, tokens, start + duration, tally))
               for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    wall = time.perf_counter() - start
    return {
        "clients": clients, "wall_s": wall, "answered": tally.answered, "failed": len(tally.failed),
        "failures": tally.failed[:3], "tokens": tally.tokens, "tokens_per_s": tally.tokens / wall,
        "ttft_p50_s": percentile(tally.first, 50), "ttft_p95_s": percentile(tally.first, 95),
        "token_gap_p50_s": percentile(tally.gaps, 50), "token_gap_p95_s": percentile(tally.gaps, 95),
    }


def sigterm_phase(proc: subprocess.Popen, url: str, model: str, tokens: int) -> dict[str, Any]:
    """4 clients each send one request; SIGTERM comes while they stream. Each must get an
    answer (its whole completion, or a status saying the server is stopping), none a
    broken connection or a hang; the server must then exit."""
    tally = Tally()
    threads = [threading.Thread(target=client, args=(url, model, tokens, 0.0, tally, True)) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(1.5)  # past their first tokens
    proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(900)
    code = proc.wait(120)
    broken = [f for f in tally.failed if "Connection" in f or "RemoteProtocol" in f or "Timeout" in f]
    return {"answered": tally.answered, "failed": len(tally.failed), "broken": len(broken),
            "hung": sum(t.is_alive() for t in threads), "failures": tally.failed[:4], "server_exit": code}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="llama,mixtral")
    p.add_argument("--clients", default="1,2,4,8")
    p.add_argument("--duration", type=float, default=30)
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--budget", default="400MB", help="the server's memory budget")
    p.add_argument("--generation-weights", type=float, default=0.5,
                   help="share of the budget a model may keep weights in while it generates (0: all streamed)")
    p.add_argument("--output", default="serve_generate")
    args = p.parse_args(argv)
    models = args.models.split(",")
    repo = repository(models)
    data: dict[str, Any] = {"machine": machine(), "budget": args.budget, "duration_s": args.duration,
                            "generation_weights": args.generation_weights,
                            "tokens": args.tokens, "prompt_words": len(PROMPT.split()), "models": {}}
    for model in progress(models, "serve generate: models"):
        proc, url = start_server(repo, args.budget, args.generation_weights)
        try:
            phase(url, model, 1, 2, args.tokens)  # warm up: the model loads on its first request
            rows = [phase(url, model, int(k), args.duration, args.tokens) for k in args.clients.split(",")]
            for row in rows:
                print(model, row, flush=True)
            data["models"][model] = {
                "phases": rows, "server_peak_rss_bytes": vm_hwm(proc.pid), "ledger_peak_bytes": ledger_peak(url),
                "sigterm": sigterm_phase(proc, url, model, args.tokens),
            }
            print(model, data["models"][model]["sigterm"], flush=True)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    js, md = write_results(args.output, data, markdown(data))
    print(f"wrote {js} and {md}")
    return 0


def markdown(data: dict[str, Any]) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.0f}"

    lines = [
        "# Generation over HTTP: concurrent clients, one budget",
        "",
        f"`layerfit serve --budget {data['budget']} --generation-weights {data.get('generation_weights', 0)}` "
        "(the share of the budget a model keeps weights in while it generates; 0: every unit streamed each "
        "step); each client streams `/v1/completions` with the `openai` "
        f"client, greedy, {data['tokens']} tokens after a {data['prompt_words']}-word prompt, back to back for "
        f"{data['duration_s']:.0f} s per phase. *vs 1*: aggregate tokens/s over one client's.",
    ]
    for model, r in data["models"].items():
        one = r["phases"][0]["tokens_per_s"]
        lines += [
            "",
            f"## {model}: server peak RSS {mb(r['server_peak_rss_bytes'])} MB, ledger peak "
            f"{mb(r['ledger_peak_bytes'])} MB",
            "",
            "| clients | answered | failed | tokens/s | vs 1 | first token p50 / p95 (ms) | between tokens p50 / p95 (ms) |",
            "|---:|---:|---:|---:|---:|---|---|",
        ]
        for row in r["phases"]:
            lines.append(
                f"| {row['clients']} | {row['answered']} | {row['failed']} | {row['tokens_per_s']:.1f} | "
                f"{row['tokens_per_s'] / one:.2f} | {ms(row['ttft_p50_s'])} / {ms(row['ttft_p95_s'])} | "
                f"{ms(row['token_gap_p50_s'])} / {ms(row['token_gap_p95_s'])} |"
            )
        s = r["sigterm"]
        lines += ["", f"SIGTERM while 4 clients' requests stream: {s['answered']} completed, {s['failed']} refused "
                  f"with a status, {s['broken']} broken connections, {s['hung']} hung; the server exited with "
                  f"{s['server_exit']} (-15: uvicorn re-raises SIGTERM after its graceful shutdown)."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
