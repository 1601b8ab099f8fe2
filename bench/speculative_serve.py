"""Several tokens per pass over HTTP: 4 OpenAI clients with prompt lookup, or the trained
draft, against 4 with neither, on the decoder trained to copy.

``bench/speculative_trained.py`` measures prompt lookup through ``engine.generate`` (one
sequence, transformers' own assisted generation). Here the same trained target (its
``train()``, cached under ``bench/.cache/speculative/trained``; trained there, seeded, in
about 15 minutes on one thread when absent, and its 2-layer draft in about 2) is served by
``layerfit serve --draft target=draft`` (its own process on a loopback port), with a
word-level tokenizer over its 512 ids made here, at
25 % and 50 % of its weights: the server's budget is that share of the weights and room
for the stream's buffers and the KV caches, and ``--generation-weights`` gives the decode
loop exactly the share to keep weights in, so each step streams the rest.

Per share, alternating rounds of three phases on the same server: 4 client threads (the
``openai`` package, ``/v1/completions``, greedy, the prompt as token ids) each send
``--requests`` editing-style prompts of ``speculative_trained.prompts()`` one after
another (client c the prompts c, c + 4, ...), with ``prompt_lookup`` 0 and ``draft``
false (plain), ``prompt_lookup`` of ``--lookup`` (lookup) or ``draft`` true (draft), each
asking ``--tokens`` new tokens. Requests in flight decode
together (continuous batching), so a pass verifies the proposals of every sequence at
once. Reported per phase: completion tokens per second over the phase's wall time, tokens
per pass (``/metrics``: tokens decoded over passes), proposed and accepted tokens, the
draft's passes; and
whether every reply equals the plain phase's and transformers' own greedy decode of the
prompt alone (*equal*). The target: lookup at 2x plain's tokens/s or more. Writes
``bench/results/speculative_serve.{json,md}``::

    .venv/bin/python bench/speculative_serve.py [--rounds 3] [--requests 2] [--tokens 32] [--lookup 10]
        [--draft-tokens 5]

``--smoke`` proves the script in a minute: untrained models (seeded; nothing copies, so
lookup and the draft gain little), one round, one request per client, 8 tokens, 25 % only.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from processes import launch_server, off_main  # noqa: E402
from reporting import machine, mb, progress, write_results  # noqa: E402
from speculative_trained import (  # noqa: E402
    CACHE,
    DRAFT,
    EOS,
    PAD,
    SEP,
    TARGET,
    TRAIN_DRAFT,
    TRAIN_TARGET,
    VOCAB,
    prompts,
    train,
)

SERVE_CACHE = CACHE.parent / "serve"
CLIENTS = 4
SHARES = (0.25, 0.5)
MODEL = "target"
DRAFT_MODEL = "draft"
MODES = {"plain": {"prompt_lookup": 0, "draft": False}, "lookup": None, "draft": {"draft": True}}
"""Each phase's extension fields (lookup's: ``prompt_lookup`` of ``--lookup``, no draft)."""


def tokenizer() -> Any:
    """A word-level tokenizer over the target's ids: ``t3`` .. ``t511`` and its specials."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {"<pad>": PAD, "<sep>": SEP, "<eos>": EOS, **{f"t{i}": i for i in range(3, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # words joined by spaces
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<pad>", pad_token="<pad>",
                                                eos_token="<eos>")


def trained(name: str, config: dict[str, Any], settings: dict[str, Any], smoke: bool) -> tuple[Path, Any]:
    """A model trained by ``speculative_trained.train`` (the target or the draft), or with
    ``smoke`` an untrained one of the same config; its Hugging Face folder and training
    record."""
    if not smoke:
        return off_main(lambda: train(name, config, settings))
    import torch
    import transformers

    folder = SERVE_CACHE / f"untrained-{name}"
    if not (folder / "config.json").is_file():
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).eval()
        model.generation_config = transformers.GenerationConfig(bos_token_id=SEP, eos_token_id=EOS, pad_token_id=PAD)
        off_main(lambda: model.save_pretrained(folder))
    return folder, None


def repository(target: Path, draft: Path, smoke: bool) -> tuple[Path, Any, Any]:
    """A repository of the target and its draft, each prepared with ``hf:`` from a copy of
    its folder with the tokenizer beside it (made once per trained folder); their manifests."""
    import shutil

    from layerfit.store import prepare, read_manifest

    repo = SERVE_CACHE / ("repo-smoke" if smoke else f"repo-{target.name}-{draft.name}")
    manifests = []
    for name, folder in ((MODEL, target), (DRAFT_MODEL, draft)):
        try:
            manifests.append(read_manifest(repo / name))
        except Exception:  # missing or stale: made again
            source = SERVE_CACHE / f"{folder.name}-tokenized"
            shutil.rmtree(source, ignore_errors=True)
            shutil.copytree(folder, source)
            tokenizer().save_pretrained(source)
            manifests.append(off_main(lambda source=source, name=name: prepare("hf:" + str(source), repo / name,
                                                                               force=True)))
    return repo, manifests[0], manifests[1]


def reference(folder: Path, rows: Any, tokens: int) -> list[list[int]]:
    """transformers' own greedy decode of each prompt alone, up to and including an end token."""
    import torch
    import transformers

    def run() -> list[list[int]]:
        model = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
        with torch.no_grad():
            outs = [model.generate(rows[i:i + 1], max_new_tokens=tokens, do_sample=False)[0, rows.shape[1]:].tolist()
                    for i in range(rows.shape[0])]
        return [out[:out.index(EOS) + 1] if EOS in out else out for out in outs]

    return off_main(run)


def start_server(repo: Path, budget: int, kept_share: float, draft_tokens: int) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "layerfit.cli", "serve", "--repository", str(repo), "--budget", str(budget),
               "--generation-weights", f"{kept_share:.6f}", "--draft", f"{MODEL}={DRAFT_MODEL}",
               "--draft-tokens", str(draft_tokens), "--host", "127.0.0.1", "--port", "0",
               "--queue-limit", "64", "--timeout", "600", "--log-level", "warning"]
    return launch_server(command, wait=600)


def decode_counters(url: str) -> dict[str, float]:
    """The target's decode loop counters from ``/metrics``."""
    import httpx

    names = {"layerfit_decode_passes_total": "passes", "layerfit_decode_tokens_total": "tokens",
             "layerfit_decode_proposed_tokens_total": "proposed", "layerfit_decode_accepted_tokens_total": "accepted",
             "layerfit_decode_draft_passes_total": "draft_passes"}
    counters = dict.fromkeys(names.values(), 0.0)
    for line in httpx.get(f"{url}/metrics", timeout=60).text.splitlines():
        metric, _, value = line.rpartition(" ")
        name = metric.split("{")[0]
        if name in names and f'model="{MODEL}"' in metric:
            counters[names[name]] = float(value)
    return counters


def phase(url: str, rows: Any, requests: int, tokens: int, extension: dict[str, Any]) -> dict[str, Any]:
    """4 clients, each sending its ``requests`` prompts back to back; what they got."""
    import openai

    replies: dict[int, list[int]] = {}
    failures: list[str] = []
    completion_tokens = [0]
    lock = threading.Lock()
    words = tokenizer()

    def client(c: int) -> None:
        api = openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=600, max_retries=0)
        for r in range(requests):
            i = c + CLIENTS * r
            try:
                done = api.completions.create(model=MODEL, prompt=rows[i].tolist(), max_tokens=tokens, temperature=0,
                                              extra_body=extension)
            except Exception as exc:  # counted, not raised
                with lock:
                    failures.append(f"{type(exc).__name__}: {str(exc)[:160]}")
                continue
            ids = words(done.choices[0].text, add_special_tokens=False)["input_ids"]
            with lock:
                replies[i] = ids + ([EOS] if done.choices[0].finish_reason == "stop" else [])
                completion_tokens[0] += done.usage.completion_tokens

    before = decode_counters(url)
    threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(1800)
    wall = time.perf_counter() - start
    after = decode_counters(url)
    delta = {k: after[k] - before[k] for k in after}
    return {"extension": extension, "wall_s": wall, "completion_tokens": completion_tokens[0],
            "tokens_per_s": completion_tokens[0] / wall, "passes": delta["passes"],
            "tokens_per_pass": delta["tokens"] / delta["passes"] if delta["passes"] else None,
            "proposed": delta["proposed"], "accepted": delta["accepted"], "draft_passes": delta["draft_passes"],
            "failed": len(failures),
            "failures": failures[:3], "replies": [replies.get(i) for i in range(CLIENTS * requests)]}


def measure_share(repo: Path, manifest: Any, draft_bytes: int, share: float, rows: Any, expected: list[list[int]],
                  args: argparse.Namespace) -> dict[str, Any]:
    """Every mode at one share, in alternating rounds on one server."""
    kept = int(manifest.total_bytes * share)
    per_token = 2 * TARGET["num_hidden_layers"] * TARGET["num_key_value_heads"] * (
        TARGET["hidden_size"] // TARGET["num_attention_heads"]) * 4
    positions = rows.shape[1] + args.tokens
    # the stream's buffers, each sequence's KV cache and the padded step's (the draft's smaller), the draft
    room = 4 * manifest.largest_unit_bytes + 2 * 3 * CLIENTS * positions * per_token + draft_bytes + (8 << 20)
    budget = kept + room
    proc, url = start_server(repo, budget, kept / budget, args.draft_tokens)
    modes = {**MODES, "lookup": {"prompt_lookup": args.lookup, "draft": False}}
    try:
        phase(url, rows, 1, 2, modes["plain"])  # warm up: the loop opens on the first request
        runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
        for _ in range(args.rounds):
            for mode, extension in modes.items():
                result = phase(url, rows, args.requests, args.tokens, extension)
                print(f"{int(share * 100)}% {mode}: {result['tokens_per_s']:.1f} tokens/s, "
                      f"{result['tokens_per_pass'] or 0:.2f} tokens/pass", flush=True)
                runs[mode].append(result)
    finally:
        proc.terminate()
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    plain_replies = runs["plain"][0]["replies"]
    summary: dict[str, Any] = {"budget_bytes": budget, "kept_bytes": kept}
    for mode, results in runs.items():
        summary[mode] = {
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in results),
            "tokens_per_s_by_round": [r["tokens_per_s"] for r in results],
            "tokens_per_pass": statistics.median(r["tokens_per_pass"] or 0 for r in results),
            "passes": [r["passes"] for r in results], "proposed": [r["proposed"] for r in results],
            "accepted": [r["accepted"] for r in results], "draft_passes": [r["draft_passes"] for r in results],
            "failed": sum(r["failed"] for r in results), "failures": [f for r in results for f in r["failures"]][:3],
            "equal_plain": all(r["replies"] == plain_replies for r in results),
            "equal_transformers": all(r["replies"] == expected[:len(r["replies"])] for r in results),
        }
    plain = summary["plain"]["tokens_per_s_by_round"]
    for mode in ("lookup", "draft"):
        by_round = [a / b for a, b in zip(summary[mode]["tokens_per_s_by_round"], plain, strict=True)]
        summary[mode]["vs_plain"] = summary[mode]["tokens_per_s"] / summary["plain"]["tokens_per_s"]
        summary[mode]["vs_plain_by_round"] = by_round
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=2, help="prompts each client sends per phase")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--lookup", type=int, default=10, help="prompt_lookup of the lookup phases")
    p.add_argument("--draft-tokens", type=int, default=5, help="the server's --draft-tokens")
    p.add_argument("--smoke", action="store_true", help="an untrained target, 1 round, 1 request, 8 tokens, 25 %%")
    p.add_argument("--output", default="speculative_serve")
    args = p.parse_args(argv)
    shares = SHARES
    if args.smoke:
        args.rounds, args.requests, args.tokens, shares = 1, 1, 8, (0.25,)
        if args.output == "speculative_serve":
            args.output = "speculative_serve_smoke"
    import transformers

    transformers.logging.set_verbosity_error()
    folder, record = trained("target", TARGET, TRAIN_TARGET, args.smoke)
    draft_folder, draft_record = trained("draft", DRAFT, TRAIN_DRAFT, args.smoke)
    repo, manifest, draft_manifest = repository(folder, draft_folder, args.smoke)
    rows = prompts(CLIENTS * args.requests)
    expected = reference(folder, rows, args.tokens)
    data: dict[str, Any] = {
        "machine": machine(), "smoke": args.smoke, "clients": CLIENTS, "rounds": args.rounds,
        "requests_per_client": args.requests, "tokens": args.tokens, "lookup": args.lookup,
        "draft_tokens": args.draft_tokens, "prompt_length": rows.shape[1], "weights_bytes": manifest.total_bytes,
        "draft_bytes": draft_manifest.total_bytes, "training": {"target": record, "draft": draft_record},
        "shares": {},
    }
    for share in progress(shares, "speculative serve"):
        data["shares"][f"{int(share * 100)}%"] = measure_share(repo, manifest, draft_manifest.total_bytes, share, rows,
                                                               expected, args)
    js, md = write_results(args.output, data, markdown(data))
    print(f"wrote {js} and {md}")
    return 0


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# Several tokens per pass over HTTP: 4 OpenAI clients with prompt lookup or a draft against 4 with neither",
        "",
        ("**Smoke run: untrained models (nothing copies, the draft guesses at random), so these numbers say "
         "only that the script works.**\n\n" if data["smoke"] else "")
        + f"`layerfit serve --draft target=draft --draft-tokens {data['draft_tokens']}`, the decoder trained to "
        f"copy (`bench/speculative_trained.py`, {mb(data['weights_bytes'])} MB) with the decode loop keeping "
        "weights in the share shown and streaming the rest, and its trained draft "
        f"({mb(data['draft_bytes'])} MB, resident, in the budget); {data['clients']} `openai` clients each send "
        f"{data['requests_per_client']} editing-style prompts ({data['prompt_length']} token ids) back to back, "
        f"greedy, {data['tokens']} new tokens each: *plain* (`prompt_lookup` 0, `draft` false), *lookup* "
        f"(`prompt_lookup` {data['lookup']}) and *draft* (`draft` true), in {data['rounds']} alternating rounds "
        "on one server (medians). *tokens/pass*: tokens decoded over the loop's passes of the target "
        "(`/metrics`; 4 sequences share a pass). *equal*: every reply equals the plain phase's and "
        "transformers' own greedy decode of its prompt alone. Target: lookup at 2x plain's tokens/s or more.",
        "",
        "| share | mode | tokens/s | tokens/pass | accepted / proposed | draft passes | equal | vs plain (rounds) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for share, r in data["shares"].items():
        for mode in ("plain", "lookup", "draft"):
            m = r[mode]
            versus = "" if mode == "plain" else (
                f"{m['vs_plain']:.2f}x ({min(m['vs_plain_by_round']):.2f}-{max(m['vs_plain_by_round']):.2f}x)")
            equal = "yes" if m["equal_plain"] and m["equal_transformers"] else (
                f"plain {m['equal_plain']}, transformers {m['equal_transformers']}")
            lines.append(f"| {share} | {mode} | {m['tokens_per_s']:.1f} | {m['tokens_per_pass']:.2f} | "
                         f"{sum(m['accepted']):.0f} / {sum(m['proposed']):.0f} | {sum(m['draft_passes']):.0f} | "
                         f"{equal} | {versus} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
