"""Tokens per pass on a trained GGUF model from the command line: an editing prompt (#56).

Issue #56 asks for prompt lookup measured on a real chat model published as GGUF, on an
editing prompt. No published model is downloaded here (nothing is, at run time or in a
bench), so the nearest real thing is used: the byte-level Llama that
``bench/gguf_tolerance.py`` trains on the running Python's standard library and quantizes
to Q4_0 with llama.cpp's own quantizer. It is prepared with ``layerfit prepare gguf:`` and
run in the default packed mode (int4 kernels), every step through the real command,
``layerfit generate --json``, one process each.

*Editing prompts*: source the model never trained on (its held-out tail of the standard
library). Each of ``--prompts`` passages is a top-level ``def`` of up to ``PASSAGE`` bytes;
the prompt is the passage, a comment asking for it again with its function renamed, and
the renamed ``def`` line, so that the text to come is the passage again with one name
changed: the edit a person asks of a code model. ``--tokens`` new tokens greedily, plain
against ``--prompt-lookup N``, at each budget (every weight, and half of them), rounds
alternating. Reported: passes, tokens per pass, tokens/s (the command's own, its first
token's wait included), and whether every lookup text equals the plain one (greedy tokens
must not change)::

    PYTHONPATH=src .venv/bin/python bench/speculative_gguf.py [--rounds 3] [--prompts 4] [--tokens 96]

It needs ``bench/gguf_tolerance.py``'s Q4_0 file (run that bench first, ``--quants Q4_0``
is enough). Writes ``bench/results/speculative_gguf.{json,md}``.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from gguf_tolerance import CACHE as TOLERANCE_CACHE  # noqa: E402
from gguf_tolerance import TRAINING, text_of, tokens_of, trained  # noqa: E402
from moe_decoding import corpus  # noqa: E402
from reporting import machine, mb, write_results  # noqa: E402
from speculative_trained import cli_generate  # noqa: E402

CACHE = BENCH / ".cache" / "speculative_gguf"
PASSAGE = 700  # bytes of a function at most
LOOKUP = 8
SHARES = (1.0, 0.5)


def prepared_folder(gguf: Path) -> Path:
    """The GGUF file prepared by the command (again whenever the store's preparing code or
    the file changes: a key of both)."""
    out = CACHE / "prepared"
    key = f"{gguf.stat().st_size}-{gguf.stat().st_mtime_ns}-{_store_key()}"
    stamp = CACHE / "prepared.key"
    if stamp.is_file() and stamp.read_text() == key and (out / "manifest.json").is_file():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "layerfit.cli", "prepare", f"gguf:{gguf}", "-o", str(out), "--force"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"prepare failed: {proc.stderr.strip()[-400:]}")
    stamp.write_text(key)
    return out


def _store_key() -> str:
    """The last commit that changed the store (what prepare writes)."""
    proc = subprocess.run(["git", "-C", str(BENCH.parent), "log", "-1", "--format=%h", "--", "src/layerfit/store"],
                          capture_output=True, text=True)
    return proc.stdout.strip()


def editing_prompts(held: bytes, count: int) -> list[dict[str, Any]]:
    """``count`` prompts from the held-out source: a top-level function (one whose body
    fits ``PASSAGE`` bytes), then a comment asking for it renamed, then its renamed
    ``def`` line: the continuation is the function again, one name changed."""
    prompts = []
    for match in re.finditer(rb"\ndef (\w+)\(", held):
        start = match.start() + 1
        end = held.find(b"\n\n", start)
        if end < 0 or not 200 <= end - start <= PASSAGE:
            continue
        name = match.group(1)
        passage = held[start:end]
        renamed = passage.replace(name, name + b"_v2")
        head = renamed.split(b"\n", 1)[0] + b"\n"
        text = passage + b"\n\n\n# The same function, renamed " + name + b"_v2:\n" + head
        prompts.append({"name": name.decode(), "prompt_ids": tokens_of(text).tolist(), "bytes": len(text),
                        "edited_ids": tokens_of(renamed[len(head):]).tolist()})
        if len(prompts) == count:
            break
    return prompts


def measure(folder: Path, prompts: list[dict[str, Any]], tokens: int, rounds: int) -> dict[str, Any]:
    """Plain and lookup at each share, rounds alternating: by share and mode, passes,
    tokens per pass, tokens/s (medians over rounds), and whether lookup's texts are plain's."""
    runs: dict[tuple[str, str], list[list[dict[str, Any]]]] = {}
    for r in range(rounds):
        for share in SHARES:
            for mode, n in (("plain", None), ("lookup", LOOKUP)):
                reports = [cli_generate(folder, p["prompt_ids"], tokens, share, n) for p in prompts]
                runs.setdefault((f"{int(share * 100)}%", mode), []).append(reports)
                print(f"round {r + 1} {int(share * 100)}% {mode}: {sum(x['new_tokens'] for x in reports)} tokens "
                      f"in {sum(x['passes'] for x in reports)} passes", flush=True)
    table: dict[str, Any] = {}
    for (key, mode), by_round in runs.items():
        first = by_round[0]
        passes, new = sum(x["passes"] for x in first), sum(x["new_tokens"] for x in first)
        rates = [sum(x["new_tokens"] for x in rs) / sum(x["new_tokens"] / x["tokens_per_s"] for x in rs)
                 for rs in by_round]
        table.setdefault(key, {})[mode] = {
            "passes": passes, "new_tokens": new, "tokens_per_pass": new / passes,
            "tokens_per_s": statistics.median(rates), "tokens_per_s_by_round": rates,
            "budget_bytes": first[0]["budget_bytes"], "weights_peak_bytes": max(x["weights_peak_bytes"] for x in first),
            "per_prompt_tokens_per_pass": [x["tokens_per_pass"] for x in first],
            "token_ids": [x["token_ids"] for x in first],
        }
    for modes in table.values():
        plain, lookup = modes["plain"], modes["lookup"]
        lookup["equal_to_plain"] = lookup["token_ids"] == plain["token_ids"]
        lookup["vs_plain"] = lookup["tokens_per_s"] / plain["tokens_per_s"]
    return table


def copied(prompts: list[dict[str, Any]], made: list[list[int]]) -> list[int]:
    """Per prompt, how many of the tokens plain greedy decoding made are the edited passage's
    next ones before the first that is not: whether the model makes the edit at all."""
    counts = []
    for prompt, tokens in zip(prompts, made, strict=True):
        n = 0
        while n < min(len(tokens), len(prompt["edited_ids"])) and tokens[n] == prompt["edited_ids"][n]:
            n += 1
        counts.append(n)
    return counts


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# Tokens per pass on a trained GGUF model, from the command line (an editing prompt)", "",
        (__doc__ or "").split("\n\n", 1)[1].split("::")[0].strip(), "",
        f"Model: {data['model']}; {data['prompts']} prompts of {data['prompt_bytes']} bytes, {data['tokens']} new "
        f"tokens each, {data['rounds']} rounds; `--prompt-lookup {LOOKUP}`. Measured on {data['machine']['cores']} "
        f"cores, torch {data['machine']['torch']}, commit {data['machine']['layerfit_commit']}.", "",
        "| budget | mode | budget (MB) | passes | new tokens | tokens per pass | tokens/s (median) | "
        "lookup ÷ plain | lookup's tokens equal plain's |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for key, modes in data["table"].items():
        for mode, row in modes.items():
            lines.append(
                f"| {key} | {mode} | {mb(row['budget_bytes'])} | {row['passes']} | {row['new_tokens']} | "
                f"{row['tokens_per_pass']:.2f} | {row['tokens_per_s']:.1f} | "
                + (f"{row['vs_plain']:.2f}× | {'yes' if row['equal_to_plain'] else 'NO'} |" if mode == "lookup"
                   else "- | - |"))
    copies = data["copied_tokens"]
    lines += ["", f"Plain greedy decoding made the edited passage's next tokens for {copies} of its {data['tokens']} "
              "tokens per prompt before it left the passage. "
              + ("This model does not make the edit: its text soon repeats itself, and that repetition, not the "
                 "edit, is what prompt lookup guesses here. A decoder that does copy (`bench/speculative_trained.py`, "
                 "trained to) is where the command's tokens per pass on an edit are measured."
                 if max(copies) < data["tokens"] // 2 else "The model makes the edit; lookup guesses it from the prompt."),
              "", "The first prompt and what plain greedy decoding made of it (bytes shown as text):", "", "```",
              data["example"]["prompt"], "--- made:", data["example"]["made"], "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--tokens", type=int, default=96)
    p.add_argument("--output", default="speculative_gguf")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    data_bytes = corpus()
    folder, _ = trained(data_bytes)  # cached by bench/gguf_tolerance.py
    gguf = folder / "gguf" / "model.Q4_0.gguf"
    if not gguf.is_file():
        raise SystemExit(f"no {gguf.relative_to(TOLERANCE_CACHE.parent)}: run bench/gguf_tolerance.py --quants Q4_0 first")
    prepared = prepared_folder(gguf)
    held = data_bytes[int(len(data_bytes) * (1 - TRAINING["held_out"])):]  # the part gguf_tolerance never trained on
    prompts = editing_prompts(held, args.prompts)
    table = measure(prepared, prompts, args.tokens, args.rounds)
    first = prompts[0]
    made = table["100%"]["plain"]["token_ids"][0]
    data = {
        "machine": machine(), "model": "byte-level Llama (4 layers, 256 wide) trained on the standard library, Q4_0",
        "gguf_bytes": gguf.stat().st_size, "prompts": len(prompts), "prompt_bytes": [x["bytes"] for x in prompts],
        "functions": [x["name"] for x in prompts], "tokens": args.tokens, "rounds": args.rounds, "lookup": LOOKUP,
        "table": table, "example": {"prompt": text_of(first["prompt_ids"]), "made": text_of(made)},
        "copied_tokens": copied(prompts, table["100%"]["plain"]["token_ids"]),
        "wall_s": time.perf_counter() - t0,
    }
    js, md = write_results(args.output, data, markdown(data))
    print(f"wrote {js} and {md} in {data['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
