"""Generating with encoder-decoders (BART-base, Whisper-base) under a weight budget.

An encoder-decoder's ``generate`` runs the encoder once, then the model once per token
with the encoder's output and a KV cache whose cross-attention keys and values were
computed at the first step. ``engine.generate`` streams the encoder as its own pass, and
each decoder step begins at the decoder (none of the encoder is read) and skips the
cached cross-attention projections. Before that an engine could only decode with whole
passes (the encoder again every token, no cache: a later step with the cache skips units,
which the engine refused). This bench prepares a BART-base (140 M parameters, its 154 MB
token embedding tied to the head and so resident) and a Whisper-base (73 M parameters,
its 106 MB embedding tied and resident, 30 s of 80 mel bins in), each built from its
config (seeded weights, nothing downloaded), and generates greedily with ``preload``,
``async`` at its default
budget and ``auto`` at shares of the weights through ``engine.generate``, and with async
by whole passes, in alternating rounds in one process. It reports the time to generate,
per token, the weights held, what a decoder step reads and what it reads ahead of the
skipped projections for nothing. Every sequence and score is checked against the
model's own ``generate`` (whole passes: against the model decoding by whole passes). Nothing asserts a timing. Writes
``bench/results/encoder_decoder.{json,md}``::

    .venv/bin/python bench/encoder_decoder.py [--models bart,whisper] [--rounds 3] [--tokens 16] [--physical]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from processes import run_child  # noqa: E402
from reporting import machine, mb, paired_overhead, write_results  # noqa: E402

from layerfit.store.trust import trust_factories  # noqa: E402

trust_factories(["encoder_decoder"])  # this bench's own factories rebuild the models it prepares

CACHE = Path(__file__).parent / ".cache" / "encoder_decoder"
SOURCE_TOKENS = 64  # BART's input
FRAMES = 3000  # Whisper's: 30 s of audio
MELS = 80
CROSS_KV = ("encoder_attn.k_proj", "encoder_attn.v_proj")  # computed at a decoder's first step only


def bart_base() -> nn.Module:
    """BART-base: 6 encoder and 6 decoder layers, 768 wide, 50265-token vocabulary."""
    import transformers
    from transformers import BartConfig, BartForConditionalGeneration

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = BartConfig(
        d_model=768, encoder_layers=6, decoder_layers=6, encoder_attention_heads=12, decoder_attention_heads=12,
        encoder_ffn_dim=3072, decoder_ffn_dim=3072, forced_eos_token_id=None,
    )
    return BartForConditionalGeneration(config).eval()


def whisper_base() -> nn.Module:
    """Whisper-base: 6 encoder and 6 decoder layers, 512 wide, 51865-token vocabulary."""
    import transformers
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = WhisperConfig(
        d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
        encoder_ffn_dim=2048, decoder_ffn_dim=2048, vocab_size=51865, num_mel_bins=MELS,
    )
    return WhisperForConditionalGeneration(config).eval()


MODELS = {"bart": bart_base, "whisper": whisper_base}


def model_input(name: str) -> tuple[str, torch.Tensor]:
    """The keyword and tensor ``generate`` takes: BART's token ids, Whisper's features."""
    from layerfit.store import example_input

    if name == "bart":
        return "input_ids", example_input((1, SOURCE_TOKENS), "int64", seed=1) % 1000 + 3
    return "input_features", example_input((1, MELS, FRAMES), seed=1)


def prepared(name: str, directory: Path) -> tuple[nn.Module, str, torch.Tensor, int, Any]:
    """The model, its input's keyword and tensor, its decoder's start token, and its
    manifest, prepared into ``directory`` from an example of the input and that token."""
    from layerfit.store import prepare

    model = MODELS[name]()
    key, x = model_input(name)
    start = model.config.decoder_start_token_id
    example = {key: x, "decoder_input_ids": torch.tensor([[start]])}
    manifest = prepare(f"encoder_decoder:{MODELS[name].__name__}", directory, example=example, force=True)
    return model, key, x, start, manifest


def whole_passes(
    engine: Any, key: str, x: torch.Tensor, start: int, tokens: int
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Greedy decoding with a whole pass per token (encoder included, no cache)."""
    out_ids = torch.full((x.shape[0], 1), start)
    scores = []
    for _ in range(tokens):
        logits = engine(**{key: x}, decoder_input_ids=out_ids, use_cache=False).logits[:, -1, :]
        scores.append(logits)
        out_ids = torch.cat([out_ids, logits.argmax(-1, keepdim=True)], dim=1)
    return out_ids, scores


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="bart,whisper")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=16, help="tokens generated per input")
    p.add_argument("--output", default="encoder_decoder")
    p.add_argument("--physical", action="store_true",
                   help="instead: each configuration in a child process of its own memory cgroup, peak RSS")
    p.add_argument("--child", nargs=3, metavar=("MODEL", "CONFIG", "TOKENS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(*args.child)
    if args.physical:
        return physical(args)
    t_start = time.perf_counter()
    CACHE.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {"machine": machine(), "generated_tokens": args.tokens, "rounds": args.rounds, "models": {}}
    for name in args.models.split(","):
        data["models"][name] = bench_model(name, args.rounds, args.tokens)
    data["outputs_bit_identical"] = True
    data["wall_s"] = time.perf_counter() - t_start
    js, md = write_results(args.output, data, markdown(data))
    print(f"wrote {js} and {md}")
    return 0


CONFIGS: dict[str, dict[str, Any]] = {
    "preload, generate": {"pipeline": "preload"},
    "async (default budget), generate": {"pipeline": "async"},
    "async (default budget), whole passes": {"pipeline": "async"},
    "auto at 50%, generate": {"pipeline": "auto", "budget": "50%"},
    "auto at 75%, generate": {"pipeline": "auto", "budget": "75%"},
}


def child(name: str, config: str, tokens: str) -> int:
    """One configuration's generate, twice, in this process: the output's digest, the
    second call's time, the weights held and the process's peak RSS (one JSON line)."""
    from layerfit.engine import load, output_digest
    from layerfit.engine.osmem import peak_rss_bytes

    key, x = model_input(name)
    options = {"max_new_tokens": int(tokens), "min_new_tokens": int(tokens), "do_sample": False}
    with load(CACHE / name, **CONFIGS[config]) as engine:
        engine.generate(x, **options)
        t0 = time.perf_counter()
        out = engine.generate(x, **options)
        wall = time.perf_counter() - t0
        held = engine.last_weights_peak
    print(json.dumps({
        "digest": output_digest(out), "generate_s": wall, "weights_peak_bytes": held,
        "peak_rss_bytes": peak_rss_bytes(),  # VmHWM: this process's own (ru_maxrss inherits the parent's)
    }))
    return 0


def physical(args: argparse.Namespace) -> int:
    """Each generate configuration in a fresh child process (its own memory cgroup where
    one can be made): what the whole process holds, PyTorch included."""
    from layerfit.engine import output_digest

    data: dict[str, Any] = {"machine": machine(), "generated_tokens": args.tokens, "models": {}}
    for name in args.models.split(","):
        model, _, x, _, m = prepared(name, CACHE / name)
        options = {"max_new_tokens": args.tokens, "min_new_tokens": args.tokens, "do_sample": False}
        expected = output_digest(model.generate(x, **options))
        del model
        results = {}
        for config in CONFIGS:
            if config.endswith("whole passes"):
                continue
            r = run_child(__file__, [name, config, str(args.tokens)])
            if "error" not in r:
                r["bit_identical"] = r.pop("digest") == expected
            results[config] = r
        data["models"][name] = {"weights_bytes": m.total_bytes, "resident_bytes": m.resident_bytes, "results": results}
    lines = [f"# Encoder-decoders generating {args.tokens} tokens: the whole process's memory", "",
             "Each configuration in a fresh process (its own memory cgroup); generate twice, the second timed.", ""]
    for name, d in data["models"].items():
        lines += [f"## {name}: {mb(d['weights_bytes'])} MB of weights, {mb(d['resident_bytes'])} MB resident", "",
                  "| configuration | weights held (MB) | peak RSS (MB) | cgroup peak (MB) | generate | bit-identical |",
                  "|---|---:|---:|---:|---:|---|"]
        for config, r in d["results"].items():
            if "error" in r:
                lines.append(f"| {config} | failed: {r['error']} | | | | |")
                continue
            lines.append(f"| {config} | {mb(r['weights_peak_bytes'])} | {mb(r['peak_rss_bytes'])} | "
                         f"{mb(r['cgroup_peak_bytes'])} | {r['generate_s']:.2f} s | {r['bit_identical']} |")
        lines.append("")
    js, md = write_results(f"{args.output}_physical", data, "\n".join(lines))
    print(f"wrote {js} and {md}")
    return 0


def bench_model(name: str, rounds: int, tokens: int) -> dict[str, Any]:
    from layerfit.engine import load
    from layerfit.sizes import parse_budget

    directory = CACHE / name
    model, key, x, start, m = prepared(name, directory)
    options = {"max_new_tokens": tokens, "min_new_tokens": tokens, "do_sample": False,
               "output_scores": True, "return_dict_in_generate": True}  # fmt: skip
    expected = model.generate(x, **options)
    with torch.no_grad():  # without the cache a step's logits differ by rounding from generate's
        expected_whole = whole_passes(model, key, x, start, tokens)
    del model
    with load(directory, pipeline="async") as engine:
        default = engine.memory.weight_bytes
        encoder_units = engine.part("model.encoder").units
        decoder_bytes = sum(b.nbytes for i, b in enumerate(engine.blocks) if i not in encoder_units)
        encoder_bytes = sum(engine.blocks[i].nbytes for i in encoder_units)
        cross_kv = sum(b.nbytes for b in engine.blocks if b.name.endswith(CROSS_KV))
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
    for _ in range(rounds):
        for config, o in CONFIGS.items():
            with load(directory, **o) as engine:
                t0 = time.perf_counter()
                if config.endswith("whole passes"):
                    sequences, scores = whole_passes(engine, key, x, start, tokens)
                else:
                    got = engine.generate(x, **options)
                    sequences, scores = got.sequences, got.scores
                wall = time.perf_counter() - t0
                want_sequences, want_scores = (
                    expected_whole if config.endswith("whole passes") else (expected.sequences, expected.scores)
                )
                assert torch.equal(sequences, want_sequences), (name, config)
                assert all(torch.equal(g, e) for g, e in zip(scores, want_scores, strict=True)), (name, config)
                kept = set(engine.kept_units)
                streamed_decoder = sum(  # what a cached step reads: not the projections it skips
                    b.nbytes for i, b in enumerate(engine.blocks)
                    if i not in encoder_units and i not in kept and not b.name.endswith(CROSS_KV)
                )
                runs[config].append({
                    "generate_s": wall, "weights_peak_bytes": engine.last_weights_peak,
                    "policy": engine.policy.name, "kept_units": len(kept),
                    "budget_bytes": None if o["pipeline"] == "preload" else
                    parse_budget(o["budget"], m.total_bytes) if "budget" in o else default,
                    "skipped_units": engine.last_skipped[0], "read_for_nothing_bytes": engine.last_skipped[1],
                    "decoder_step_reads_bytes": 0 if engine.policy.name == "preload" else streamed_decoder,
                })
    reference = [r["generate_s"] for r in runs["preload, generate"]]
    results = {}
    for config, rs in runs.items():
        walls = [r["generate_s"] for r in rs]
        results[config] = {
            **{k: rs[0][k] for k in ("policy", "kept_units", "budget_bytes", "decoder_step_reads_bytes")},
            "generate_s": statistics.median(walls), "rounds_generate_s": walls,
            "per_token_s": statistics.median(walls) / tokens,
            "vs_preload": paired_overhead(walls, reference),
            "weights_peak_bytes": max(r["weights_peak_bytes"] for r in rs),
            "last_step_skipped_units": rs[-1]["skipped_units"],
            "last_step_read_for_nothing_bytes": statistics.median(r["read_for_nothing_bytes"] for r in rs),
        }
    return {
        "input": f"{key} {tuple(x.shape)}", "units": len(m.units), "weights_bytes": m.total_bytes,
        "resident_bytes": m.resident_bytes, "largest_unit_bytes": m.largest_unit_bytes, "encoder_bytes": encoder_bytes,
        "decoder_bytes": decoder_bytes, "cross_attention_kv_bytes": cross_kv, "results": results,
    }


def markdown(data: dict[str, Any]) -> str:
    lines = [
        f"# Encoder-decoders generating {data['generated_tokens']} tokens greedily under a weight budget",
        "",
        f"{data['rounds']} alternating rounds; every sequence and score equal to the model's own generate "
        "(whole passes: to the model's own whole passes).",
    ]
    for name, d in data["models"].items():
        lines += [
            "",
            f"## {name}: {d['input']}",
            "",
            f"{mb(d['weights_bytes'])} MB of weights in {d['units']} units (largest {mb(d['largest_unit_bytes'])} MB): "
            f"{mb(d['resident_bytes'])} MB resident (the token embedding, tied to the head), encoder "
            f"{mb(d['encoder_bytes'])} MB, decoder {mb(d['decoder_bytes'])} MB of which "
            f"{mb(d['cross_attention_kv_bytes'])} MB are the cross-attention k/v projections a cached step skips.",
            "",
            "| configuration | budget (MB) | ran | kept units | weights held (MB) | a cached step reads (MB) "
            "| skipped units in a step | read for nothing in a step (MB) | generate | per token | vs preload (90 % CI) |",
            "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for config, r in d["results"].items():
            o = r["vs_preload"]
            lines.append(
                f"| {config} | {mb(r['budget_bytes'])} | {r['policy']} | {r['kept_units']} | {mb(r['weights_peak_bytes'])} | "
                f"{mb(r['decoder_step_reads_bytes'])} | {r['last_step_skipped_units']} | "
                f"{mb(r['last_step_read_for_nothing_bytes'])} | {r['generate_s'] * 1e3:.0f} ms | "
                f"{r['per_token_s'] * 1e3:.1f} ms | {o['median'] * 100:+.0f} % ({o['ci90_low'] * 100:+.0f} .. "
                f"{o['ci90_high'] * 100:+.0f}) |"
            )
    lines += [
        "",
        "\"a cached step reads\" counts the decoder units neither kept nor skipped (the cross-attention k/v "
        "projections: the first step computes them, and from the third the reader expects them skipped, as the "
        "step before; the second reads them ahead for nothing); \"whole passes\" reads the encoder too, every token.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
