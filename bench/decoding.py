"""Token-by-token decoding of a language model under a weight budget.

A decoder generates one token per forward pass, and with streaming every pass reads every
streamed weight again, so the cost of a budget is paid per token. This bench prepares two
Hugging Face decoders built from configs (seeded weights, nothing downloaded): GPT-2
small (124 M parameters, its 154 MB token embedding tied to the head, so kept resident)
and a Llama-style model of the same width (untied embedding and head, grouped-query
attention, 32 k vocabulary). Each runs a greedy decode (a prompt, then one token per call
with the KV cache the previous call returned) with ``preload``, ``async`` at its default
budget (resident tensors and two of the largest unit) and ``auto`` at shares of the
weights, in alternating rounds in one process. It reports the prompt's latency, the
median latency per generated token, and the weights held; every step's logits are
checked bit for bit against the model's own decode. Nothing asserts a timing. Writes
``bench/results/decoding.{json,md}``::

    .venv/bin/python bench/decoding.py [--models gpt2,llama] [--rounds 3] [--tokens 16]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reporting import machine, mb, paired_overhead, progress, write_results  # noqa: E402
from storage import direct_read_bandwidth  # noqa: E402

from layerfit.store.trust import trust_factories  # noqa: E402

trust_factories(["decoding"])  # this bench's own factories rebuild the models it prepares

CACHE = Path(__file__).parent / ".cache" / "decoding"
PROMPT = 32


def gpt2() -> nn.Module:
    """GPT-2 small (12 layers, 768 wide, 50257-token vocabulary, tied head)."""
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config()).eval()


def llama() -> nn.Module:
    """A Llama-style decoder as wide as GPT-2 small: 12 layers, 768 wide, MLP 2048,
    12 query and 4 key/value heads, 32000-token vocabulary, untied head."""
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
        num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048, tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval()


MODELS = {"gpt2": gpt2, "llama": llama}


def greedy(model: Any, ids: torch.Tensor, tokens: int) -> tuple[list[torch.Tensor], list[float]]:
    """Logits and wall time of the prompt's pass and of each generated token's."""
    times, logits = [], []
    past = None
    for step in range(tokens + 1):
        t0 = time.perf_counter()
        out = model(ids, use_cache=True) if step == 0 else model(ids, past_key_values=past, use_cache=True)
        times.append(time.perf_counter() - t0)
        logits.append(out.logits)
        past, ids = out.past_key_values, out.logits[:, -1:].argmax(-1)
    return logits, times


def default_budget(directory: Path, options: dict[str, Any]) -> int:
    """What async holds at its default budget with ``options``: the resident tensors and
    two of the largest unit it streams (a table read by rows counts a row's room)."""
    from layerfit.engine import load

    with load(directory, **{**options, "budget": None, "pipeline": "async"}) as engine:
        return engine.memory.resident_bytes + 2 * engine.memory.largest_unit_bytes


def streamed_bytes(engine: Any) -> int:
    """Weight bytes one pass reads: every unit neither kept nor read by rows (the rows of
    a decoded token are a page or two)."""
    if engine.policy.name == "preload":
        return 0
    skip = set(engine.kept_units) | set(engine.rows_units)
    return sum(b.nbytes for i, b in enumerate(engine.blocks) if i not in skip)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="gpt2,llama")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=16, help="tokens generated per decode")
    p.add_argument("--output", default="decoding")
    args = p.parse_args(argv)
    from layerfit.engine import load
    from layerfit.sizes import parse_budget
    from layerfit.store import example_input, prepare

    t_start = time.perf_counter()
    CACHE.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {"machine": machine(), "prompt_tokens": PROMPT, "generated_tokens": args.tokens,
                            "rounds": args.rounds, "models": {}}
    for name in args.models.split(","):
        directory = CACHE / name
        m = prepare(f"decoding:{name}", directory, input_shape=(1, PROMPT), input_dtype="int64", force=True)
        ids = example_input((1, PROMPT), "int64", seed=1) % 1000
        with torch.no_grad():
            expected, _ = greedy(MODELS[name](), ids, args.tokens)
        configs = {
            "preload": {"pipeline": "preload"},
            "async (default budget)": {"pipeline": "async"},
            "auto at 50%": {"pipeline": "auto", "budget": "50%"},
            "auto at 75%": {"pipeline": "auto", "budget": "75%"},
        }
        for config in list(configs)[1:]:  # the same, with embedding tables streamed whole
            configs[f"{config}, tables whole"] = {**configs[config], "gather_rows": False}
        budgets = {  # what each configuration may hold: async's default is two of the largest unit
            config: parse_budget(o["budget"], m.total_bytes) if "budget" in o
            else None if o["pipeline"] == "preload" else default_budget(directory, o)
            for config, o in configs.items()
        }
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
        for _ in progress(range(args.rounds), f"decoding {name}: rounds"):
            for config, options in configs.items():
                with load(directory, **options, trace=options["pipeline"] != "preload") as engine:
                    got, times = greedy(engine, ids, args.tokens)
                    timeline = engine.last_timeline  # the last token's pass
                    assert all(torch.equal(g, e) for g, e in zip(got, expected, strict=True)), (name, config)
                    runs[config].append({
                        "prompt_s": times[0], "token_s": statistics.median(times[1:]),
                        "weights_peak_bytes": engine.last_weights_peak,
                        "budget_bytes": budgets[config], "kept_units": len(engine.kept_units),
                        "policy": engine.policy.name, "rows_units": [engine.blocks[i].name for i in engine.rows_units],
                        "read_per_token_bytes": streamed_bytes(engine),
                        "token_read_s": timeline.stage_total("read") if timeline is not None else 0.0,
                        "token_read_bytes": sum(e.nbytes for e in timeline.events if e.stage == "read")
                        if timeline is not None else 0,
                    })
        reference = [r["token_s"] for r in runs["preload"]]
        bandwidth = direct_read_bandwidth(directory / m.weights_file)  # the disk, this minute
        bandwidth_end = direct_read_bandwidth(directory / m.weights_file)  # and once more: it drifts
        compute = statistics.median(reference)
        results = {}
        for config, rs in runs.items():
            tokens = [r["token_s"] for r in rs]
            results[config] = {
                "prompt_s": statistics.median(r["prompt_s"] for r in rs),
                "token_s": statistics.median(tokens), "rounds_token_s": tokens,
                "token_vs_preload": paired_overhead(tokens, reference),
                "weights_peak_bytes": max(r["weights_peak_bytes"] for r in rs),
                "budget_bytes": rs[0]["budget_bytes"], "kept_units": rs[0]["kept_units"],
                "policy": rs[0]["policy"], "rows_units": rs[0]["rows_units"],
                "read_per_token_bytes": rs[0]["read_per_token_bytes"],
                # The floor: reading the token's bytes at the disk's direct-I/O speed, or
                # the preloaded token's compute, whichever is longer.
                "floor_token_s": max(rs[0]["read_per_token_bytes"] / max(bandwidth, bandwidth_end), compute),
            }
            results[config]["token_vs_floor"] = results[config]["token_s"] / results[config]["floor_token_s"]
            # The reader alone: its busy time in a traced token over that token's bytes at
            # the disk's rate (the better of the two measurements after the rounds).
            read_s = statistics.median(r["token_read_s"] for r in rs)
            read_bytes = statistics.median(r["token_read_bytes"] for r in rs)
            results[config]["token_read_s"] = read_s
            results[config]["reader_vs_disk"] = (
                read_s / (read_bytes / max(bandwidth, bandwidth_end)) if read_bytes else None
            )
        data["models"][name] = {
            "direct_io_bandwidth_bps": bandwidth, "direct_io_bandwidth_end_bps": bandwidth_end,
            "units": len(m.units), "weights_bytes": m.total_bytes, "resident_bytes": m.resident_bytes,
            "largest_unit_bytes": m.largest_unit_bytes, "results": results,
        }
    data["outputs_bit_identical"] = True
    data["wall_s"] = time.perf_counter() - t_start
    js, md = write_results(args.output, data, markdown(data))
    print(f"wrote {js} and {md}")
    return 0


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# Greedy decoding under a weight budget",
        "",
        f"Prompt of {data['prompt_tokens']} tokens, then {data['generated_tokens']} tokens one per call with the KV "
        f"cache; {data['rounds']} alternating rounds; every step's logits equal to the model's own. *× floor*: the "
        "token's time over max(its bytes read ÷ the disk's direct-I/O bandwidth (the better of two measurements after the rounds), preload's token). "
        "*reader × disk*: the read stage's busy time in a traced token over that token's bytes at the better of the "
        "two bandwidths measured after the rounds (the reader's own speed against the disk's); every streaming "
        "configuration runs traced.",
    ]
    for name, model in data["models"].items():
        lines += [
            "",
            f"## {name}: {mb(model['weights_bytes'])} MB of weights, {model['units']} units, "
            f"resident {mb(model['resident_bytes'])} MB, largest unit {mb(model['largest_unit_bytes'])} MB; "
            f"direct-I/O bandwidth {model['direct_io_bandwidth_bps'] / 1e9:.2f} and "
            f"{model.get('direct_io_bandwidth_end_bps', 0) / 1e9:.2f} GB/s",
            "",
            "| configuration | budget (MB) | ran | kept units | read by rows | weights held (MB) | read per token (MB) | prompt | per token | tokens/s | per token vs preload (90 % CI) | × floor | reader × disk |",
            "|---|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for config, r in model["results"].items():
            o = r["token_vs_preload"]
            lines.append(
                f"| {config} | {mb(r['budget_bytes'])} | {r['policy']} | {r['kept_units']} | "
                f"{', '.join(r['rows_units']) or '-'} | {mb(r['weights_peak_bytes'])} | {mb(r['read_per_token_bytes'])} | "
                f"{r['prompt_s'] * 1e3:.0f} ms | {r['token_s'] * 1e3:.1f} ms | {1 / r['token_s']:.1f} | "
                f"{o['median'] * 100:+.0f} % ({o['ci90_low'] * 100:+.0f} .. {o['ci90_high'] * 100:+.0f}) | "
                f"{r['token_vs_floor']:.2f} | "
                + (f"{r['reader_vs_disk']:.2f} |" if r.get("reader_vs_disk") else "- |")
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
