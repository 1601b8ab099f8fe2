"""Several tokens per weight stream: prompt lookup, a draft model and batches, under a budget.

Streaming makes a decoder's token cost the bytes it reads, and a pass reads them once
however many tokens it checks. This bench decodes 24 tokens greedily with transformers'
own ``generate`` through ``engine.generate`` on a Llama-style decoder (the 0.5 GB model of
``bench/decoding.py``, saved as a Hugging Face folder and prepared with ``hf:``),
preloaded and at 25 / 50 / 75 % of its weights, in five ways:

* ``plain``: one pass per token;
* ``lookup``: prompt-lookup decoding (``prompt_lookup_num_tokens=8``), on an
  editing-style prompt (a passage, then its start again);
* ``draft``: assisted generation with a draft that is the target's own embedding, first
  layer, norm and head (an early exit of the target, as LayerSkip drafts), kept resident
  and counted in the budget (the engine's budget is the share less the draft's bytes);
* ``batch B`` for B = 2, 4, 8: B prompts decoded together, one pass per step for all.

For each: passes (weight streams), new tokens, tokens per stream, tokens/s (a batch:
all its sequences' tokens), the KV cache's bytes at the end (beside the budget), and
whether the tokens equal the model's own plain greedy decode (lookup and draft must,
whatever they propose; a batch's sequences equal each decoded alone). Medians of
alternating rounds. Random weights do not copy from a prompt as trained models do, so
lookup's acceptance here comes only from the repetitions the model falls into itself;
the table says how many tokens each pass verified. Writes
``bench/results/speculative.{json,md}``::

    .venv/bin/python bench/speculative.py [--rounds 2] [--tokens 24]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from processes import off_main  # noqa: E402
from reporting import machine, mb, progress, write_results  # noqa: E402
from storage import direct_read_bandwidth  # noqa: E402

CACHE = Path(__file__).parent / ".cache" / "speculative"
SHARES = (None, 0.75, 0.5, 0.25)
BATCHES = (2, 4, 8)


def folder() -> Path:
    """The decoder of ``bench/decoding.py`` saved as Hugging Face publishes it (once)."""
    out = CACHE / "llama"
    if not (out / "config.json").is_file():
        from decoding import llama

        llama().save_pretrained(out, max_shard_size="200MB")
    return out


def streamed_bytes(engine: Any) -> int:
    """Weight bytes one pass reads: every unit neither kept nor read by rows."""
    if engine.policy.name == "preload":
        return 0
    skip = set(engine.kept_units) | set(engine.rows_units)
    return sum(b.nbytes for i, b in enumerate(engine.blocks) if i not in skip)


def draft_of(reference: Any) -> Any:
    """The target's early exit: its embedding, first layer, final norm and head."""
    import transformers

    config = transformers.LlamaConfig(**{**reference.config.to_dict(), "num_hidden_layers": 1})
    draft = transformers.LlamaForCausalLM(config).eval()
    state = {k: v for k, v in reference.state_dict().items() if ".layers." not in k or ".layers.0." in k}
    draft.load_state_dict(state)
    return draft


def prompts(count: int) -> torch.Tensor:
    """``count`` editing-style prompts of 48 tokens: a 32-token passage, then its start."""
    rows = []
    for k in range(count):
        passage = (torch.arange(32) * (17 + 2 * k) + 11 * k) % 31000 + 500
        rows.append(torch.cat([passage, passage[:16]]))
    return torch.stack(rows)


def run(engine: Any, mode: str, tokens: int, draft: Any, make_prompts: Callable[[int], torch.Tensor] = prompts,
        lookup: int = 8, single: int = 1) -> dict[str, Any]:
    """One decode of a batch, or (plain, lookup, draft) decodes of the first ``single``
    prompts one after another: passes, tokens, seconds, the sequences (one row per
    prompt) and the KV cache's bytes (the last decode's)."""
    passes: list[int] = []
    run_pass = engine.run_pass

    def counted(*args: Any, **kwargs: Any) -> Any:
        passes.append(1)
        return run_pass(*args, **kwargs)

    engine.run_pass = counted
    batch = int(mode.split()[1]) if mode.startswith("batch") else 1
    inputs = [make_prompts(batch)] if batch > 1 else list(make_prompts(single).split(1))
    options: dict[str, Any] = {"max_new_tokens": tokens, "min_new_tokens": tokens, "do_sample": False,
                               "use_cache": True, "return_dict_in_generate": True}
    if mode == "lookup":
        options["prompt_lookup_num_tokens"] = lookup
    if mode == "draft":
        options["assistant_model"] = draft
    seconds, sequences = 0.0, []
    try:
        for ids in inputs:
            t0 = time.perf_counter()
            out = engine.generate(ids, attention_mask=torch.ones_like(ids), **options)
            seconds += time.perf_counter() - t0
            sequences.append(out.sequences)
    finally:
        del engine.run_pass
    cache = getattr(out, "past_key_values", None)
    kv = sum(t.numel() * t.element_size() for t in _tensors(cache))
    return {"passes": len(passes), "new_tokens": batch * tokens * len(inputs), "seconds": seconds,
            "kv_cache_bytes": kv, "sequences": torch.cat(sequences)}


READ_AHEAD = " (read-ahead)"
"""A mode's suffix when it runs with the read-ahead across passes (``read_ahead=True``)."""


def measure(prepared: Path, manifest: Any, draft: Any, draft_bytes: int, expected: list[torch.Tensor], tokens: int,
            rounds: int, bandwidth: float, make_prompts: Callable[[int], torch.Tensor] = prompts, lookup: int = 8,
            assisted: dict[str, list[torch.Tensor]] | None = None,
            ablate_read_ahead: bool = False, single: int = 1) -> dict[str, dict[str, dict[str, Any]]]:
    """Every mode at every share, in ``rounds`` alternating rounds: the table's rows.

    ``expected[i]``: the model's own plain greedy decode of ``make_prompts(8)[i]`` alone;
    ``assisted[mode]``: where given, transformers' own ``generate`` of that mode (the same
    lookup or draft) without the engine, which a row's ``equal_assisted`` compares with.
    ``ablate_read_ahead``: plain and the draft also run with the read-ahead across
    passes (``read_ahead=True``), in the same rounds. ``single``: plain, lookup and the
    draft decode the first ``single`` prompts one after another (their time summed), so
    one prompt's luck does not decide how many tokens a pass accepts."""
    from layerfit.engine import load

    modes = ["plain", "lookup", "draft", *(f"batch {b}" for b in BATCHES)]
    if ablate_read_ahead:
        modes += ["plain" + READ_AHEAD, "draft" + READ_AHEAD]
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    equal: dict[tuple[str, str], bool] = {}
    same_assisted: dict[tuple[str, str], bool] = {}
    cells = [(share, mode) for _ in range(rounds) for share in SHARES for mode in modes]
    for share, mode in progress(cells, "speculative", total=len(cells)):
        key = "preload" if share is None else f"{int(share * 100)}%"
        base = mode.removesuffix(READ_AHEAD)
        if share is None and base != mode:
            continue  # preloaded: nothing streams
        budget = None if share is None else int(manifest.total_bytes * share) - (draft_bytes if base == "draft" else 0)
        if budget is not None and budget < manifest.resident_bytes + manifest.largest_unit_bytes:
            results.setdefault(key, {}).setdefault(mode, [])  # the draft leaves too little for the target
            continue
        with load(prepared, budget=budget, read_ahead=base != mode) as engine:
            r = off_main(lambda engine=engine, mode=base: run(engine, mode, tokens, draft, make_prompts, lookup, single))
            r["bytes_per_pass"] = streamed_bytes(engine)
            r["weights_peak_bytes"] = engine.last_weights_peak + (draft_bytes if base == "draft" else 0)
        sequences = r.pop("sequences")
        same = all(torch.equal(sequences[i:i + 1], expected[i]) for i in range(sequences.shape[0]))
        equal[(key, mode)] = equal.get((key, mode), True) and same
        if assisted is not None and base in assisted:
            hf = all(torch.equal(sequences[i:i + 1], assisted[base][i]) for i in range(sequences.shape[0]))
            same_assisted[(key, mode)] = same_assisted.get((key, mode), True) and hf
        results.setdefault(key, {}).setdefault(mode, []).append(r)
        print(key, mode, dict(r.items()), "equal" if same else "DIFFERENT", flush=True)
    table = {
        key: {
            mode: {
                "passes": runs[0]["passes"],
                "new_tokens": runs[0]["new_tokens"],
                "tokens_per_stream": runs[0]["new_tokens"] / runs[0]["passes"],
                "tokens_per_s": statistics.median(r["new_tokens"] / r["seconds"] for r in runs),
                "tokens_per_s_by_round": [r["new_tokens"] / r["seconds"] for r in runs],
                "kv_cache_bytes": runs[0]["kv_cache_bytes"],
                "bytes_per_token": runs[0]["bytes_per_pass"] * runs[0]["passes"] / runs[0]["new_tokens"],
                "floor_s": _floor(runs, results.get("preload", {}).get(mode.removesuffix(READ_AHEAD), []), bandwidth),
                "seconds": statistics.median(r["seconds"] for r in runs),
                "weights_peak_bytes": max(r["weights_peak_bytes"] for r in runs),
                "equal": equal[(key, mode)],
                **({"equal_assisted": same_assisted[(key, mode)]} if (key, mode) in same_assisted else {}),
            }
            for mode, runs in by_mode.items()
            if runs
        }
        for key, by_mode in results.items()
    }
    return table


def _floor(runs: list[dict[str, Any]], preloaded: list[dict[str, Any]], bandwidth: float) -> float | None:
    """The least a decode can take: per pass, the larger of reading its streamed bytes at
    the disk's direct-I/O bandwidth and the same mode's preloaded pass (its compute)."""
    if not runs or not preloaded:
        return None
    compute = statistics.median(r["seconds"] / r["passes"] for r in preloaded)
    return runs[0]["passes"] * max(runs[0]["bytes_per_pass"] / bandwidth, compute)


def _tensors(cache: Any) -> list[torch.Tensor]:
    """The tensors a transformers cache holds (its layers' keys and values)."""
    if cache is None:
        return []
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [t for layer in layers for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
                if isinstance(t, torch.Tensor)]
    return [t for pair in cache for t in pair if isinstance(t, torch.Tensor)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--output", default="speculative")
    args = p.parse_args(argv)

    import transformers

    from layerfit.store import prepare, read_manifest

    transformers.logging.set_verbosity_error()
    source = folder()
    prepared = CACHE / "llama-prepared"
    try:
        manifest = read_manifest(prepared)
    except Exception:  # missing or stale: prepare it again
        manifest = off_main(lambda: prepare("hf:" + str(source), prepared, force=True))
    reference = off_main(lambda: transformers.LlamaForCausalLM.from_pretrained(source).eval())
    draft = off_main(lambda reference=reference: draft_of(reference))
    draft_bytes = sum(t.numel() * t.element_size() for t in draft.state_dict().values())
    # The model's own plain greedy decode of every prompt alone: what each mode must give
    # (off the main thread, like every tensor op of the bench's: processes.off_main).
    expected = off_main(lambda reference=reference: [reference.generate(
        prompts(8)[i:i + 1], max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False) for i in range(8)])
    del reference
    bandwidth = direct_read_bandwidth(prepared / manifest.weights_file)
    table = measure(prepared, manifest, draft, draft_bytes, expected, args.tokens, args.rounds, bandwidth)
    data = {"machine": machine(), "rounds": args.rounds, "tokens": args.tokens, "weights_bytes": manifest.total_bytes,
            "direct_io_bandwidth_bps": bandwidth,
            "draft_bytes": draft_bytes, "table": table}
    js, md = write_results(args.output, data, markdown(data))
    print(f"wrote {js} and {md}")
    return 0


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# Several tokens per weight stream",
        "",
        f"The Llama-style decoder of `bench/decoding.py` ({mb(data['weights_bytes'])} MB), {data['tokens']} new "
        "tokens per sequence, greedy, through `engine.generate` (transformers' own generate); the draft is the "
        f"target's early exit ({mb(data['draft_bytes'])} MB, resident, counted in the budget). Medians of "
        f"{data['rounds']} alternating rounds. *equal*: every sequence equals the model's own plain greedy decode of it "
        "alone. *vs plain*: tokens/s over plain's at the same budget. *× floor*: time over the floor, each pass's "
        "larger of its streamed bytes at the disk's direct-I/O bandwidth "
        f"({data['direct_io_bandwidth_bps'] / 1e9:.2f} GB/s, measured in the run) and the same mode's preloaded pass. "
        "KV cache: bytes at the end, beside the budget. "
        "A budget without a draft row leaves, less the draft, too little for the target's largest unit.",
        "",
        *table_lines(data["table"]),
    ]
    return "\n".join(lines) + "\n"


def table_lines(table: dict[str, dict[str, dict[str, Any]]], assisted: bool = False) -> list[str]:
    """The markdown table of ``measure``'s rows (``assisted``: with an *equal to HF* column)."""
    lines = [
        "| budget | mode | passes | tokens/stream | tokens/s | vs plain | MB read per token | × floor | KV cache (MB) | "
        "weights peak (MB) | equal |" + (" equal to HF |" if assisted else ""),
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|" + ("---|" if assisted else ""),
    ]
    for key, modes in table.items():
        plain = modes["plain"]["tokens_per_s"]
        for mode, r in modes.items():
            lines.append(
                f"| {key} | {mode} | {r['passes']} | {r['tokens_per_stream']:.2f} | {r['tokens_per_s']:.1f} | "
                f"{r['tokens_per_s'] / plain:.2f} | {mb(r['bytes_per_token'])} | "
                f"{r['seconds'] / r['floor_s']:.2f} | {mb(r['kv_cache_bytes'])} | {mb(r['weights_peak_bytes'])} | {r['equal']} |"
                + (f" {r.get('equal_assisted', '-')} |" if assisted else "")
            )
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
