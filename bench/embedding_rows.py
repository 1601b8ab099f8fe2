"""An encoder's token embedding read by rows: BERT-base classifying 128 tokens.

BERT-base (110 M parameters, built from its config with seeded weights, nothing
downloaded) keeps a 94 MB word-embedding table, eleven times its next largest layer.
Streamed whole it sets the minimum budget and async's default buffer; read by the rows
its 128 ids look up (:mod:`layerfit.engine.gather`) it sets neither. Each configuration
runs with the table read by rows and streamed whole (``gather_rows=False``), in
alternating rounds in one process; reported per configuration: the minimum budget, the
weights held, the bytes read per inference and the median latency, the outputs checked
bit for bit against the model's own. Nothing asserts a timing. Writes
``bench/results/embedding_rows.{json,md}``::

    .venv/bin/python bench/embedding_rows.py [--rounds 5] [--runs 5]
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
from reporting import machine, mb, paired_overhead, write_results  # noqa: E402

from layerfit.store.trust import trust_factories  # noqa: E402

trust_factories(["embedding_rows"])  # this bench's own factories rebuild the models it prepares

CACHE = Path(__file__).parent / ".cache" / "embedding_rows"
TOKENS = 128


def bert() -> nn.Module:
    """BERT-base with a three-way classification head (30522-token vocabulary)."""
    import transformers
    from transformers import BertConfig, BertForSequenceClassification

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    return BertForSequenceClassification(BertConfig(num_labels=3)).eval()


def streamed_bytes(engine: Any) -> int:
    """Weight bytes one pass reads: every unit neither kept nor read by rows (plus the
    rows, a few hundred kB here, not counted)."""
    if engine.policy.name == "preload":
        return 0
    skip = set(engine.kept_units) | set(engine.rows_units)
    return sum(b.nbytes for i, b in enumerate(engine.blocks) if i not in skip)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--runs", type=int, default=5, help="timed inferences per configuration and round")
    p.add_argument("--output", default="embedding_rows")
    args = p.parse_args(argv)
    from layerfit.engine import load
    from layerfit.store import prepare

    t_start = time.perf_counter()
    CACHE.mkdir(parents=True, exist_ok=True)
    directory = CACHE / "bert"
    m = prepare("embedding_rows:bert", directory, input_shape=(1, TOKENS), input_dtype="int64", force=True)
    ids = torch.randint(0, 30522, (1, TOKENS), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = bert()(ids).logits
    base = {
        "preload": {"pipeline": "preload"},
        "async (default budget)": {"pipeline": "async"},
        "auto at 25%": {"pipeline": "auto", "budget": "25%"},
        "auto at 50%": {"pipeline": "auto", "budget": "50%"},
    }
    configs = dict(base)
    for config in list(base)[1:]:
        configs[f"{config}, table whole"] = {**base[config], "gather_rows": False}
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in configs}
    for _ in range(args.rounds):
        for config, options in configs.items():
            with load(directory, **options) as engine:
                engine(ids)  # the first pass verifies every unit's checksum
                times = []
                for _ in range(args.runs):
                    t0 = time.perf_counter()
                    out = engine(ids).logits
                    times.append(time.perf_counter() - t0)
                    assert torch.equal(out, expected), config
                runs[config].append({
                    "latency_s": statistics.median(times),
                    "weights_peak_bytes": engine.last_weights_peak,
                    "minimum_budget_bytes": engine.memory.minimum_budget,
                    "kept_units": len(engine.kept_units),
                    "rows_units": [engine.blocks[i].name for i in engine.rows_units],
                    "read_bytes": streamed_bytes(engine),
                    "policy": engine.policy.name,
                })
    reference = [r["latency_s"] for r in runs["preload"]]
    results = {}
    for config, rs in runs.items():
        latencies = [r["latency_s"] for r in rs]
        results[config] = {
            **{k: rs[0][k] for k in ("minimum_budget_bytes", "kept_units", "rows_units", "read_bytes", "policy")},
            "latency_s": statistics.median(latencies), "rounds_latency_s": latencies,
            "vs_preload": paired_overhead(latencies, reference),
            "weights_peak_bytes": max(r["weights_peak_bytes"] for r in rs),
        }
    data = {
        "machine": machine(), "tokens": TOKENS, "rounds": args.rounds, "runs": args.runs,
        "weights_bytes": m.total_bytes, "units": len(m.units),
        "table_bytes": max(u.nbytes for u in m.units), "results": results,
        "outputs_bit_identical": True, "wall_s": time.perf_counter() - t_start,
    }
    js, md = write_results(args.output, data, markdown(data))
    print(f"wrote {js} and {md}")
    return 0


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# BERT-base's token embedding read by rows",
        "",
        f"{mb(data['weights_bytes'])} MB of weights in {data['units']} units, the word-embedding table "
        f"{mb(data['table_bytes'])} MB; {data['tokens']} tokens per inference; median of {data['runs']} "
        f"inferences per round, {data['rounds']} alternating rounds; every output equal to the model's.",
        "",
        "| configuration | ran | read by rows | kept units | minimum budget (MB) | weights held (MB) | read per inference (MB) | latency | vs preload (90 % CI) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for config, r in data["results"].items():
        o = r["vs_preload"]
        lines.append(
            f"| {config} | {r['policy']} | {len(r['rows_units']) or '-'} | {r['kept_units']} | "
            f"{mb(r['minimum_budget_bytes'])} | {mb(r['weights_peak_bytes'])} | {mb(r['read_bytes'])} | "
            f"{r['latency_s'] * 1e3:.0f} ms | {o['median'] * 100:+.0f} % ({o['ci90_low'] * 100:+.0f} .. "
            f"{o['ci90_high'] * 100:+.0f}) |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
