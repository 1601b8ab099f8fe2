"""A mixture-of-experts decoder under a budget: only the experts a token uses are read.

A Mixtral-style decoder (8 experts, 2 per token; about 0.6 GB in float32, saved as
Hugging Face publishes it and prepared with ``hf:``) decodes greedily, one token per
call with the KV cache, preloaded and at 25 / 50 / 75 % of its weights in three ways:
*routed* (layerfit's default: each experts module reads the experts its router chose,
and what the budget leaves beyond the read buffer holds the experts used most: the
expert cache, whose hit rate over the decode is reported), *routed, no cache*
(``expert_cache=False``: the read buffer takes that room) and *whole*
(``gather_rows=False``: every unit, experts included, streamed whole).
Per generated token it reports the latency (median of the cached steps), the bytes
read (from the engine's trace), the *active* bytes (the dense units it streams plus the
chosen experts' share of each experts unit: what a token needs at the least) and their
ratio. Every step's logits equal transformers' own model's (compared with aligned copies
of its weights). Rounds alternate. Writes ``bench/results/moe_decoding.{json,md}``::

    .venv/bin/python bench/moe_decoding.py [--rounds 2] [--tokens 12]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import direct_read_bandwidth, machine, mb, off_main, progress, write_results  # noqa: E402

CACHE = Path(__file__).parent / ".cache" / "moe_decoding"
CONFIG = {"vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 8,
          "num_attention_heads": 8, "num_key_value_heads": 4, "num_local_experts": 8, "num_experts_per_tok": 2,
          "max_position_embeddings": 1024}
PROMPT = 16


def folder() -> Path:
    out = CACHE / "mixtral"
    if not (out / "config.json").is_file():
        import transformers

        torch.manual_seed(0)
        transformers.MixtralForCausalLM(transformers.MixtralConfig(**CONFIG)).eval().save_pretrained(
            out, max_shard_size="200MB")
    return out


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


def active_bytes(engine: Any, manifest: Any) -> int:
    """What a decoded token needs read at the least: every streamed unit that is not a
    module of experts (an embedding read by rows: one row's pages), and of each experts
    unit the share of the experts a token uses."""
    from layerfit.engine.experts import experts_segment
    from layerfit.engine.gather import least_room

    k, count = CONFIG["num_experts_per_tok"], CONFIG["num_local_experts"]
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--tokens", type=int, default=12)
    p.add_argument("--output", default="moe_decoding")
    args = p.parse_args(argv)
    import transformers

    from layerfit.engine import load
    from layerfit.store import prepare, read_manifest

    transformers.logging.set_verbosity_error()
    source = folder()
    prepared = CACHE / "mixtral-prepared"
    try:
        manifest = read_manifest(prepared)
    except Exception:  # missing or stale
        manifest = prepare("hf:" + str(source), prepared, force=True)
    ids = (torch.arange(PROMPT) * 37 % 30000 + 100).unsqueeze(0)
    reference = aligned(transformers.MixtralForCausalLM.from_pretrained(source).eval())
    expected, _ = off_main(lambda reference=reference: decode(reference, ids, args.tokens))
    del reference
    bandwidth = direct_read_bandwidth(prepared / manifest.weights_file)
    configs: dict[str, dict[str, Any]] = {"preload": {}}
    for share in (0.75, 0.5, 0.25):
        for mode, options in (("routed", {}), ("routed, no cache", {"expert_cache": False}),
                              ("whole", {"gather_rows": False})):
            configs[f"{mode} at {int(share * 100)}%"] = {"budget": int(manifest.total_bytes * share), **options}
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    for _ in progress(range(args.rounds), "moe decoding: rounds"):
        for name, options in configs.items():
            with load(prepared, trace=True, **options) as engine:
                got, steps = off_main(lambda engine=engine: decode(engine, ids, args.tokens, engine))
                assert all(torch.equal(g, e) for g, e in zip(got, expected, strict=True)), name
                cached = steps[1:]
                runs[name].append({
                    "token_s": statistics.median(s["seconds"] for s in cached),
                    "prompt_s": steps[0]["seconds"],
                    "read_per_token_bytes": statistics.median(s["read_bytes"] for s in cached),
                    "experts_read_per_token_bytes": statistics.median(s["experts_read_bytes"] for s in cached),
                    "active_bytes": active_bytes(engine, manifest),
                    "weights_peak_bytes": engine.last_weights_peak,
                    "kept_units": len(engine.kept_units),
                    "expert_cache_bytes": engine.memory.expert_cache_bytes,
                    "hit_rate": (engine.expert_cache or {}).get("hit_rate", 0.0),
                })
            print(name, runs[name][-1], flush=True)
    results = {}
    preload = statistics.median(r["token_s"] for r in runs["preload"])
    for name, rs in runs.items():
        r = {key: statistics.median(x[key] for x in rs) for key in rs[0]}
        r["read_over_active"] = r["read_per_token_bytes"] / r["active_bytes"] if r["active_bytes"] else None
        r["floor_s"] = max(r["read_per_token_bytes"] / bandwidth, preload)
        results[name] = r
    data = {"machine": machine(), "config": CONFIG, "rounds": args.rounds, "tokens": args.tokens,
            "weights_bytes": manifest.total_bytes, "direct_io_bandwidth_bps": bandwidth, "results": results,
            "outputs_equal": True}
    js, md = write_results(args.output, data, markdown(data))
    print(f"wrote {js} and {md}")
    return 0


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# A mixture-of-experts decoder: only the routed experts read",
        "",
        f"Mixtral-style, {data['config']['num_local_experts']} experts, {data['config']['num_experts_per_tok']} per "
        f"token, {mb(data['weights_bytes'])} MB; greedy, {data['tokens']} tokens one per call with the KV cache; "
        f"medians of {data['rounds']} alternating rounds; every step's logits equal transformers'. *active*: the "
        "dense units streamed plus the chosen experts' share of each experts unit. *× floor*: the token's time "
        "over max(bytes read ÷ the disk's direct-I/O bandwidth "
        f"({data['direct_io_bandwidth_bps'] / 1e9:.2f} GB/s, measured in the run), preload's token).",
        "",
        "*expert cache*: the room the budget leaves for single experts, and its hit rate over the whole decode "
        "(prompt included; the first pass verifies every unit whole and caches nothing). The model's weights "
        "are seeded, not trained: a trained router's choices are more skewed, so its hit rate would be higher.",
        "",
        "| configuration | kept units | expert cache (MB) | hit rate | read per token (MB) | of it experts (MB) | active (MB) | read ÷ active | per token (ms) | tokens/s | × floor | weights held (MB) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in data["results"].items():
        ratio = "-" if r["read_over_active"] is None else f"{r['read_over_active']:.2f}"
        lines.append(
            f"| {name} | {r['kept_units']:.0f} | {mb(r.get('expert_cache_bytes', 0))} | "
            f"{r.get('hit_rate', 0.0):.0%} | {mb(r['read_per_token_bytes'])} | {mb(r['experts_read_per_token_bytes'])} | "
            f"{mb(r['active_bytes'])} | {ratio} | {r['token_s'] * 1e3:.1f} | {1 / r['token_s']:.1f} | "
            f"{r['token_s'] / r['floor_s']:.2f} | {mb(r['weights_peak_bytes'])} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
