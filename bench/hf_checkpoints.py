"""Hugging Face folders as published, one per architecture: prepare, minimum budget, tokens/s.

For each architecture a random-weight model of about 100 MB (float32) is saved with
``save_pretrained`` (sharded, as the Hub publishes larger models) and prepared with
``prepare hf:FOLDER`` in a child process, which reports its time and peak memory. Then,
in this process, it generates 16 tokens greedily after a 16-token prompt (an encoder:
one pass) preloaded and at 25 / 50 / 75 % of its weights, every configuration once per
round, rounds alternating, medians reported; every run's tokens (an encoder: its
output) equal transformers' own ``from_pretrained`` model's. Writes
``bench/results/hf_checkpoints.{json,md}``::

    .venv/bin/python bench/hf_checkpoints.py [--archs llama,bert] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from processes import off_main, run_child  # noqa: E402
from reporting import machine, mb, progress, write_results  # noqa: E402

CACHE = Path(__file__).parent / ".cache" / "hf_checkpoints"
SHARES = (None, 0.75, 0.5, 0.25)  # None: preloaded
PROMPT, NEW = 16, 16

DECODER = {"hidden_size": 384, "intermediate_size": 1024, "num_hidden_layers": 6, "num_attention_heads": 6,
           "num_key_value_heads": 2, "vocab_size": 16000, "max_position_embeddings": 512}
SEQ2SEQ = {"d_model": 384, "encoder_layers": 3, "decoder_layers": 3, "encoder_attention_heads": 6,
           "decoder_attention_heads": 6, "encoder_ffn_dim": 1024, "decoder_ffn_dim": 1024, "vocab_size": 16000}


def configs() -> dict[str, tuple[Any, type]]:
    """Architecture → (config, class): about 100 MB each."""
    import transformers as T

    return {
        "llama": (T.LlamaConfig(**DECODER), T.LlamaForCausalLM),
        "qwen2": (T.Qwen2Config(**DECODER), T.Qwen2ForCausalLM),
        "mistral": (T.MistralConfig(**DECODER), T.MistralForCausalLM),
        "phi3": (T.Phi3Config(**DECODER, pad_token_id=0), T.Phi3ForCausalLM),
        "gemma": (T.GemmaConfig(**DECODER, head_dim=64), T.GemmaForCausalLM),
        "gpt_neox": (T.GPTNeoXConfig(hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6,
                                     vocab_size=16000, max_position_embeddings=512), T.GPTNeoXForCausalLM),
        "opt": (T.OPTConfig(hidden_size=384, ffn_dim=1024, num_hidden_layers=6, num_attention_heads=6, vocab_size=16000,
                            word_embed_proj_dim=384, max_position_embeddings=512), T.OPTForCausalLM),
        "gpt2": (T.GPT2Config(n_layer=6, n_embd=384, n_head=6, vocab_size=16000, n_positions=512,
                              bos_token_id=1, eos_token_id=2), T.GPT2LMHeadModel),
        "mixtral": (T.MixtralConfig(**{**DECODER, "intermediate_size": 512}, num_local_experts=4, num_experts_per_tok=2),
                    T.MixtralForCausalLM),
        "bert": (T.BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=6, intermediate_size=1024,
                              vocab_size=16000), T.BertModel),
        "t5": (T.T5Config(vocab_size=16000, d_model=384, d_kv=64, d_ff=1024, num_layers=3, num_decoder_layers=3,
                          num_heads=6, decoder_start_token_id=0), T.T5ForConditionalGeneration),
        "bart": (T.BartConfig(**SEQ2SEQ, max_position_embeddings=512), T.BartForConditionalGeneration),
        "whisper": (T.WhisperConfig(**SEQ2SEQ, num_mel_bins=80, max_source_positions=100, max_target_positions=448,
                                 pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1),
                    T.WhisperForConditionalGeneration),
    }


def folder_of(arch: str) -> Path:
    """The architecture's folder as ``save_pretrained`` writes it (made once)."""
    import torch

    folder = CACHE / arch
    if (folder / "config.json").is_file():
        return folder
    config, cls = configs()[arch]
    torch.manual_seed(0)
    cls(config).eval().save_pretrained(folder, max_shard_size="40MB")
    return folder


def prepare_child(folder: str, out: str) -> dict[str, Any]:
    from layerfit.store import prepare

    t0 = time.perf_counter()
    manifest = prepare("hf:" + folder, out, force=True)
    return {"seconds": time.perf_counter() - t0, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "weights_bytes": manifest.total_bytes, "units": len(manifest.units)}


def call_of(arch: str, manifest: Any) -> tuple[tuple, dict]:
    """The timed call: a prompt of PROMPT tokens (an encoder-decoder's encoder input
    from the derived example), or the derived example for an encoder."""
    import torch

    from layerfit.store import example_call

    args, kwargs = example_call(manifest)
    if arch == "bert":
        return args, kwargs
    prompt = (torch.arange(PROMPT) * 7 % 1000 + 3).unsqueeze(0)
    options = {"max_new_tokens": NEW, "min_new_tokens": NEW, "do_sample": False}
    if arch == "whisper":
        return (), {"input_features": kwargs["input_features"], **options}
    return (prompt,), options


def measure(engine: Any, arch: str, call: tuple[tuple, dict]) -> tuple[Any, dict[str, float]]:
    args, kwargs = call
    t0 = time.perf_counter()
    if arch == "bert":
        out = engine(*args, **kwargs).last_hidden_state
        return out, {"pass_s": time.perf_counter() - t0}
    from transformers.generation.streamers import BaseStreamer

    stamps: list[float] = []

    class Clock(BaseStreamer):
        def put(self, value: Any) -> None:
            stamps.append(time.perf_counter())

        def end(self) -> None:
            pass

    out = engine.generate(*args, streamer=Clock(), **kwargs)
    # The first put is the prompt itself (decoders) or the decoder's start token.
    first, last = stamps[1], stamps[-1]
    return out, {"first_token_s": first - t0, "tokens_per_s": (len(stamps) - 2) / (last - first)}


def bench_arch(arch: str, rounds: int) -> dict[str, Any]:
    import torch
    import transformers

    from layerfit.engine import load
    from layerfit.engine.config import EngineConfig
    from layerfit.engine.plan import plan
    from layerfit.store import read_manifest

    folder = folder_of(arch)
    out = CACHE / f"{arch}-prepared"
    prep = run_child(__file__, ["--what", "prepare", str(folder), str(out)])
    if "error" in prep:
        return {"prepare": prep}
    manifest = read_manifest(out)
    cls = configs()[arch][1]
    reference = cls.from_pretrained(folder).eval()
    call = call_of(arch, manifest)
    with torch.no_grad():
        expected = reference(*call[0], **call[1]).last_hidden_state if arch == "bert" else reference.generate(*call[0], **call[1])
    del reference
    minimum = plan(manifest, EngineConfig.parse(pipeline="async", budget=manifest.total_bytes)).memory.minimum_budget
    times: dict[str, list[dict[str, float]]] = {}
    equal = True
    for _ in range(rounds):
        for share in SHARES:
            key = "preload" if share is None else f"{int(share * 100)}%"
            budget = None if share is None else int(manifest.total_bytes * share)
            if budget is not None and budget < minimum:
                times.setdefault(key, [])
                continue
            with load(out, budget=budget) as engine:
                got, t = off_main(lambda engine=engine: measure(engine, arch, call))
                t["weights_peak_bytes"] = engine.last_weights_peak
            equal &= bool(torch.equal(got, expected))
            times.setdefault(key, []).append(t)
    _ = transformers
    medians = {
        key: {name: statistics.median(r[name] for r in runs) for name in runs[0]} if runs else None
        for key, runs in times.items()
    }
    return {"prepare": prep, "weights_bytes": manifest.total_bytes, "minimum_budget_bytes": minimum,
            "outputs_equal": equal, "runs": medians}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--what", help=argparse.SUPPRESS)
    p.add_argument("--archs", default=None, help="comma-separated (default: all)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--output", default="hf_checkpoints")
    args, rest = p.parse_known_args(argv)
    if args.child:
        print(json.dumps(prepare_child(*rest)))
        return 0
    archs = args.archs.split(",") if args.archs else list(configs())
    rows = {}
    for arch in progress(archs, "hf checkpoints: architectures"):
        rows[arch] = bench_arch(arch, args.rounds)
        print(arch, json.dumps(rows[arch]), flush=True)
    data = {"machine": machine(), "rounds": args.rounds, "prompt_tokens": PROMPT, "new_tokens": NEW, "archs": rows}
    js, md = write_results(args.output, data, markdown(data))
    print(f"wrote {js} and {md}")
    return 0


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# Hugging Face folders as published: prepare, minimum budget, decoding speed",
        "",
        f"Random-weight models of about 100 MB (float32, sharded at 40 MB) prepared with `prepare hf:FOLDER` in a "
        f"child process; then {data['new_tokens']} new tokens after a {data['prompt_tokens']}-token prompt, greedy "
        f"(BERT: one pass of its derived input), preloaded and at 25 / 50 / 75 % of the weights; medians of "
        f"{data['rounds']} alternating rounds. *equal*: every run's tokens (BERT: hidden states) equal to "
        "transformers' own `from_pretrained` model. A dash: the share is below the model's minimum budget.",
        "",
        "| model | weights (MB) | prepare (s) | prepare peak RSS (MB) | minimum budget (MB) | preload tok/s | 75 % tok/s | 50 % tok/s | 25 % tok/s | first token at 50 % (ms) | equal |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for arch, r in data["archs"].items():
        if "runs" not in r:
            lines.append(f"| {arch} | failed: {r['prepare'].get('error')} |" + " |" * 10)
            continue
        runs, p = r["runs"], r["prepare"]

        def rate(key: str, runs: dict = runs) -> str:
            v = runs.get(key)
            if not v:
                return "-"
            return f"{v['tokens_per_s']:.1f}" if "tokens_per_s" in v else f"{1 / v['pass_s']:.1f} passes/s"

        half = runs.get("50%")
        first = f"{half['first_token_s'] * 1000:.0f}" if half and "first_token_s" in half else "-"
        lines.append(
            f"| {arch} | {mb(r['weights_bytes'])} | {p['seconds']:.1f} | {mb(p['peak_rss_bytes'])} | "
            f"{mb(r['minimum_budget_bytes'])} | {rate('preload')} | {rate('75%')} | {rate('50%')} | {rate('25%')} | "
            f"{first} | {r['outputs_equal']} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
