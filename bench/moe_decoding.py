"""Mixture-of-experts decoders under a budget: only the experts a token uses are read, and
the next layer's are guessed and read ahead.

Two Mixtral-style decoders (8 experts, 2 per token), saved as Hugging Face publishes them
and prepared with ``hf:``:

* *seeded*: about 0.6 GB in float32, seeded weights (its routers choose as random weights
  do: little skew, and the next layer's choice hard to guess);
* *trained*: 6 layers, 256 wide (80 MB), trained here on CPU (seeded, a fixed number of
  AdamW steps, two threads) as a byte-level language model of the running Python's
  standard library (its top-level ``*.py`` files; the last 5 % held out). Its routers
  have learned what trained routers do: skewed choices that the next layer's router
  guesses well. Nothing is downloaded; the model is cached under
  ``bench/.cache/moe_decoding/`` by a hash of its config, its training and the corpus.

Each decodes greedily, one token per call with the KV cache, preloaded and at 25 / 50 /
75 % of its weights in four ways: *routed* (layerfit's default: each experts module reads
the experts its router chose into a compact place of their own, and the reader reads the
experts the next MoE layer's router guesses from the input of the router before it into
that layer's place while the layers between run; what the budget leaves beyond the read
buffer holds the experts chosen most, the expert cache), *routed, no read-ahead*
(``expert_prefetch=False``: no guess), *routed, no cache* (``expert_cache=False``: the
read buffer takes that room) and *whole* (``gather_rows=False``: every unit, experts
included, streamed whole).
Per generated token it reports the latency (median of the cached steps), the bytes read
(from the engine's trace, what was read ahead included), the *active* bytes (the dense
units it streams plus the chosen experts' share of each experts unit: what a token needs
at the least) and their ratio, the cache's hit rate and, with the read-ahead, how many
experts it read ahead per token and how many of them their layer chose. *read-ahead ÷
without* is the median over rounds of each round's ratio of the two routed rows (the
same round, one after the other). Every step's logits equal transformers' own model's
(compared with aligned copies of its weights). Rounds alternate. Writes
``bench/results/moe_decoding.{json,md}``::

    .venv/bin/python bench/moe_decoding.py [--models seeded,trained] [--rounds 3] [--tokens 24]
"""

from __future__ import annotations

import argparse
import glob
import json
import shutil
import statistics
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_setup import cached_training, train_step  # noqa: E402
from processes import off_main  # noqa: E402
from reporting import machine, mb, progress, write_results  # noqa: E402
from storage import direct_read_bandwidth  # noqa: E402

CACHE = Path(__file__).parent / ".cache" / "moe_decoding"
CONFIG = {"vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 8,
          "num_attention_heads": 8, "num_key_value_heads": 4, "num_local_experts": 8, "num_experts_per_tok": 2,
          "max_position_embeddings": 1024}
PROMPT = 16
TRAINED = {"vocab_size": 256, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 6,
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 8, "num_experts_per_tok": 2,
           "max_position_embeddings": 512, "router_aux_loss_coef": 0.01, "tie_word_embeddings": False}
TRAINING = {"seed": 0, "steps": 400, "batch": 16, "length": 256, "lr": 2e-3, "warmup": 100, "bf16": True,
            "threads": 2, "held_out": 0.05}
TRAINED_PROMPT = 64  # bytes of held-out source the trained model continues
SHARES = (0.75, 0.5, 0.25)


def folder() -> Path:
    """The seeded decoder's folder (written once)."""
    out = CACHE / "mixtral"
    if not (out / "config.json").is_file():
        import transformers

        torch.manual_seed(0)
        transformers.MixtralForCausalLM(transformers.MixtralConfig(**CONFIG)).eval().save_pretrained(
            out, max_shard_size="200MB")
    return out


def corpus() -> bytes:
    """The running Python's standard library, its top-level modules' source, in name order."""
    files = sorted(glob.glob(str(Path(sysconfig.get_paths()["stdlib"]) / "*.py")))
    return b"".join(Path(f).read_bytes() for f in files)


def trained_folder() -> tuple[Path, dict[str, Any]]:
    """The trained decoder's folder and its training record (trained once, then cached)."""
    data = corpus()
    return cached_training(CACHE, [TRAINED, TRAINING], data, lambda digest, out: off_main(lambda: _train(data, digest, out)))


def _train(data: bytes, digest: str, out: Path) -> dict[str, Any]:
    import transformers

    threads = torch.get_num_threads()
    torch.set_num_threads(TRAINING["threads"])
    try:
        torch.manual_seed(TRAINING["seed"])
        tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
        split = int(len(tokens) * (1 - TRAINING["held_out"]))
        model = transformers.MixtralForCausalLM(transformers.MixtralConfig(**TRAINED, output_router_logits=True))
        optimizer = torch.optim.AdamW(model.parameters(), lr=TRAINING["lr"], betas=(0.9, 0.98), weight_decay=0.01)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / TRAINING["warmup"]))
        gen = torch.Generator().manual_seed(TRAINING["seed"])
        length, curve, t0 = TRAINING["length"], [], time.perf_counter()
        model.train()
        for step in range(1, TRAINING["steps"] + 1):
            starts = torch.randint(0, split - length - 1, (TRAINING["batch"],), generator=gen)
            ids = torch.stack([tokens[s : s + length] for s in starts.tolist()])
            loss = train_step(model, optimizer, schedule, ids, ids, TRAINING["bf16"])
            if step % 50 == 0:
                curve.append({"step": step, "loss": loss.item(), "seconds": time.perf_counter() - t0})
                print(f"moe decoding: training step {step} loss {loss.item():.3f} "
                      f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        model.eval()
        model.config.output_router_logits = False
        with torch.no_grad():  # next-byte loss on held-out sequences (nats per byte)
            held = [tokens[s : s + length] for s in range(split, len(tokens) - length, (len(tokens) - split) // 8)][:8]
            held_loss = model(torch.stack(held), labels=torch.stack(held)).loss.item()
        partial = out.with_name(out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        model.save_pretrained(partial)
        record = {"config": TRAINED, "training": TRAINING, "corpus_bytes": len(data), "corpus_sha256": digest,
                  "seconds": time.perf_counter() - t0, "held_out_loss_nats_per_byte": held_loss, "curve": curve}
        (partial / "training.json").write_text(json.dumps(record, indent=2) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        partial.rename(out)
        return record
    finally:
        torch.set_num_threads(threads)


def aligned(model: Any) -> Any:
    """Every tensor copied to memory of its own (from_pretrained's are views of the mapped
    file at any alignment, which changes a one-token product's last bit)."""
    with torch.no_grad():
        for module in model.modules():
            for t in [*module._parameters.values(), *module._buffers.values()]:
                if t is not None:
                    t.data = t.data.clone()
    return model


def decode(model: Any, ids: torch.Tensor, tokens: int, engine: Any = None) -> tuple[list[torch.Tensor], list[dict]]:
    """Greedy steps with the cache: each step's logits, time and (with ``engine``) bytes read."""
    logits, steps = [], []
    past = None
    with torch.no_grad():
        for step in range(tokens + 1):
            t0 = time.perf_counter()
            out = model(ids, use_cache=True) if step == 0 else model(ids, past_key_values=past, use_cache=True)
            seconds = time.perf_counter() - t0
            record = {"seconds": seconds}
            if engine is not None:
                events = [e for e in engine.last_timeline.events if e.stage == "read"]
                record["read_bytes"] = sum(e.nbytes for e in events)
                record["experts_read_bytes"] = sum(e.nbytes for e in events if e.name.endswith("experts"))
            steps.append(record)
            logits.append(out.logits)
            past, ids = out.past_key_values, out.logits[:, -1:].argmax(-1)
    return logits, steps


def active_bytes(engine: Any, config: dict[str, Any]) -> int:
    """What a decoded token needs read at the least: every streamed unit that is not a
    module of experts (an embedding read by rows: one row's pages), and of each experts
    unit the share of the experts a token uses."""
    from layerfit.engine.experts import experts_segment
    from layerfit.engine.gather import least_room

    k, count = config["num_experts_per_tok"], config["num_local_experts"]
    total = 0
    for i, block in enumerate(engine.blocks):
        if i in engine.kept_units or engine.policy.name == "preload":
            continue
        segment = block.segments[0]
        if len(block.segments) == 1 and experts_segment(segment):
            total += sum(t.nbytes for t in segment.tensors) * k // count
        elif i in engine.rows_units:
            total += least_room(segment) // 2  # a row's pages
        else:
            total += block.nbytes
    return total


def configurations(total: int) -> dict[str, dict[str, Any]]:
    """Each row's load options, in the order a round runs them."""
    configs: dict[str, dict[str, Any]] = {"preload": {}}
    for share in SHARES:
        for mode, options in (("routed", {}), ("routed, no read-ahead", {"expert_prefetch": False}),
                              ("routed, no cache", {"expert_cache": False}), ("whole", {"gather_rows": False})):
            configs[f"{mode} at {int(share * 100)}%"] = {"budget": int(total * share), **options}
    return configs


def measure_model(name: str, rounds: int, tokens: int) -> dict[str, Any]:
    """Every configuration of one model, ``rounds`` alternating rounds."""
    import transformers

    from layerfit.engine import load
    from layerfit.store import prepare, read_manifest

    if name == "seeded":
        source, training, config = folder(), None, CONFIG
        ids = (torch.arange(PROMPT) * 37 % 30000 + 100).unsqueeze(0)
    else:
        (source, training), config = trained_folder(), TRAINED
        data = corpus()
        start = int(len(data) * (1 - TRAINING["held_out"])) + 1000
        ids = torch.tensor([list(data[start : start + TRAINED_PROMPT])])
    prepared = source.with_name(source.name + "-prepared")
    try:
        manifest = read_manifest(prepared)
    except Exception:  # missing or stale
        manifest = prepare("hf:" + str(source), prepared, force=True)
    reference = aligned(transformers.MixtralForCausalLM.from_pretrained(source).eval())
    expected, _ = off_main(lambda reference=reference: decode(reference, ids, tokens))
    del reference
    bandwidth = direct_read_bandwidth(prepared / manifest.weights_file)
    configs = configurations(manifest.total_bytes)
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    for _ in progress(range(rounds), f"moe decoding ({name}): rounds"):
        for label, options in configs.items():
            with load(prepared, trace=True, **options) as engine:
                got, steps = off_main(lambda engine=engine: decode(engine, ids, tokens, engine))
                assert all(torch.equal(g, e) for g, e in zip(got, expected, strict=True)), label
                cached, stats, guesses = steps[1:], engine.expert_cache or {}, engine.expert_guesses
                runs[label].append({
                    "token_s": statistics.median(s["seconds"] for s in cached),
                    "prompt_s": steps[0]["seconds"],
                    "read_per_token_bytes": statistics.median(s["read_bytes"] for s in cached),
                    "experts_read_per_token_bytes": statistics.median(s["experts_read_bytes"] for s in cached),
                    "active_bytes": active_bytes(engine, config),
                    "weights_peak_bytes": engine.last_weights_peak,
                    "kept_units": len(engine.kept_units),
                    "expert_cache_bytes": engine.memory.expert_cache_bytes,
                    "slots": stats.get("slots", 0), "guessed_layers": guesses["units"],
                    "hit_rate": stats.get("hit_rate", 0.0),
                    "read_ahead_per_token": guesses["read_ahead"] / (tokens + 1),
                    "read_ahead_chosen": guesses["chosen"] / guesses["read_ahead"] if guesses["read_ahead"] else None,
                })
            print(name, label, runs[label][-1], flush=True)
    results = {}
    preload = statistics.median(r["token_s"] for r in runs["preload"])
    for label, rs in runs.items():
        r = {key: (statistics.median(v) if (v := [x[key] for x in rs if x[key] is not None]) else None)
             for key in rs[0]}
        r["read_over_active"] = r["read_per_token_bytes"] / r["active_bytes"] if r["active_bytes"] else None
        r["floor_s"] = max(r["read_per_token_bytes"] / bandwidth, preload)
        results[label] = r
    paired = {}
    for share in SHARES:
        on, off = runs[f"routed at {int(share * 100)}%"], runs[f"routed, no read-ahead at {int(share * 100)}%"]
        ratios = [a["token_s"] / b["token_s"] for a, b in zip(on, off, strict=True)]
        paired[f"{int(share * 100)}%"] = {"median": statistics.median(ratios), "rounds": ratios}
    return {"config": config, "training": training, "weights_bytes": manifest.total_bytes,
            "direct_io_bandwidth_bps": bandwidth, "results": results, "read_ahead_over_without": paired,
            "outputs_equal": True}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="seeded,trained")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--output", default="moe_decoding")
    args = p.parse_args(argv)
    import transformers

    transformers.logging.set_verbosity_error()
    models = {name: measure_model(name, args.rounds, args.tokens) for name in args.models.split(",")}
    data = {"machine": machine(), "rounds": args.rounds, "tokens": args.tokens, "models": models}
    js, md = write_results(args.output, data, markdown(data))
    print(f"wrote {js} and {md}")
    return 0


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# Mixture-of-experts decoders: only the routed experts read, the next layer's read ahead",
        "",
        f"Mixtral-style, 8 experts, 2 per token; greedy, {data['tokens']} tokens one per call with the KV cache; "
        f"medians of {data['rounds']} alternating rounds; every step's logits equal transformers'. *active*: the "
        "dense units streamed plus the chosen experts' share of each experts unit. *× floor*: the token's time "
        "over max(bytes read ÷ the disk's direct-I/O bandwidth (measured in the run), preload's token).",
        "",
        "*expert cache*: the room the budget leaves for single experts, in slots of one expert; *hit rate*: the "
        "lookups it served over the whole decode (prompt included; the first pass verifies every unit whole and "
        "caches nothing); *read ahead*: the experts the reader read on a guess per token (into a compact place "
        "of the layer's experts, before its router chose), and the share of them their layer chose.",
    ]
    for name, model in data["models"].items():
        training = model["training"]
        about = (f"seeded weights, {mb(model['weights_bytes'])} MB" if training is None else
                 f"trained here for {training['training']['steps']} steps ({training['seconds'] / 60:.0f} min) on "
                 f"{training['corpus_bytes'] / 1e6:.1f} MB of the standard library's source, held-out loss "
                 f"{training['held_out_loss_nats_per_byte']:.2f} nats per byte; {mb(model['weights_bytes'])} MB")
        paired = ", ".join(f"{share}: {p['median']:.2f}× ({min(p['rounds']):.2f}–{max(p['rounds']):.2f})"
                           for share, p in model["read_ahead_over_without"].items())
        lines += [
            "",
            f"## {name}: {about}",
            "",
            f"Disk: {model['direct_io_bandwidth_bps'] / 1e9:.2f} GB/s. *read-ahead ÷ without* (a token's time, "
            f"routed against routed without the read-ahead, paired in each round; rounds' range): {paired}.",
            "",
            "| configuration | kept units | expert cache (MB) | slots | hit rate | read ahead (chosen) | read per token (MB) | active (MB) | read ÷ active | per token (ms) | tokens/s | × floor | weights held (MB) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for label, r in model["results"].items():
            ratio = "-" if r["read_over_active"] is None else f"{r['read_over_active']:.2f}"
            ahead = ("-" if not r["guessed_layers"] else
                     f"{r['read_ahead_per_token']:.1f} ({r['read_ahead_chosen']:.0%})" if r["read_ahead_chosen"] is not None
                     else f"{r['read_ahead_per_token']:.1f}")
            lines.append(
                f"| {label} | {r['kept_units']:.0f} | {mb(r['expert_cache_bytes'])} | {r['slots']:.0f} | "
                f"{r['hit_rate']:.0%} | {ahead} | {mb(r['read_per_token_bytes'])} | {mb(r['active_bytes'])} | {ratio} | "
                f"{r['token_s'] * 1e3:.1f} | {1 / r['token_s']:.1f} | {r['token_s'] / r['floor_s']:.2f} | "
                f"{mb(r['weights_peak_bytes'])} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
