"""Read-ahead from a pass's tail: a cached decode step with none, with the read-ahead
starting when the pass ends, and with it starting once the pass's last streamed unit is
done (``read_ahead=True`` now), paired in one process.

A decoder's head is the unit `auto` keeps first, so after the pass's last streamed unit
its kernels run with nothing to read: 8-9 ms of the 0.5 GB Llama's 100 ms step at the
budget ``bench/vs_mmap.py`` gives it at 637 MB, 18-22 ms of the 2.1 GB one's 310 ms at
1637 MB. The read-ahead now starts there (``UnitStream.read_next_early``) instead of at
the pass's end; *end* is the read-ahead as it was (that hook turned off here).

Each model (``bench/vs_mmap.py``'s decoders, prepared in its cache) runs a 32-token
prompt and ``--steps`` cached steps of one token per configuration, ``--rounds`` times,
the three configurations alternating in one process (the order reversed every other
round); a configuration's time is the median of its steps, and its row the median of its
rounds. Every step's logits equal the model's own (``torch.equal``), checked each round.
No memory limit: this measures the pipeline, not the page cache. Writes
``bench/results/read_ahead_tail.{json,md}``::

    .venv/bin/python bench/read_ahead_tail.py [--rounds 7] [--steps 8]

``--budgets vs-mmap`` runs each decoder at every budget ``bench/results/vs_mmap.json``
gave layerfit where it streamed (``--modes off,tail`` leaves *end* out), to say whether
the read-ahead pays at every limit that bench measures::

    .venv/bin/python bench/read_ahead_tail.py --budgets vs-mmap --modes off,tail --output read_ahead_tail_budgets
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, machine, off_main, write_results  # noqa: E402
from vs_mmap import CACHE, PROMPT, build_model, prepared  # noqa: E402

# The budgets bench/vs_mmap.py gave each decoder at the limit of its last results where
# layerfit was furthest from 3x mmap with room left (637 MB and 1637 MB).
BUDGETS = {"llama-0.5g": 198_800_000, "llama-2.1g": 1_186_700_000}
MODES = ("off", "end", "tail")


def vs_mmap_budgets(name: str) -> list[int]:
    """The budgets ``bench/results/vs_mmap.json`` gave layerfit's ``name`` where it streamed."""
    rows = json.loads((RESULTS / "vs_mmap.json").read_text())["models"][name]["rows"]
    return sorted({r["budget_bytes"] for r in rows
                   if r["config"] == "layerfit" and r.get("returncode") == 0 and r.get("engine_read_per_step_bytes")})


def reference(name: str, steps: int) -> tuple[list[list[int]], list[torch.Tensor]]:
    """The model's own greedy decode: the ids of each call and each call's logits."""
    model = build_model(name)
    ids = torch.randint(100, 30000, (1, PROMPT), generator=torch.Generator().manual_seed(3))
    calls, logits, past = [ids], [], None
    with torch.no_grad():
        for _ in range(steps + 1):
            out = model(calls[-1], past_key_values=past, use_cache=True)
            logits.append(out.logits)
            past = out.past_key_values
            calls.append(out.logits[:, -1:].argmax(-1))
    return [c.tolist() for c in calls[:-1]], logits


def decode(directory: Path, budget: int, mode: str, calls: list[list[int]], logits: list[torch.Tensor]) -> float:
    """The median cached step of ``mode`` (its logits checked); see the module's docstring."""
    from layerfit.engine import load
    from layerfit.engine.stream import UnitStream

    early = UnitStream.read_next_early
    if mode == "end":  # the read-ahead as it started before: when the pass ends
        UnitStream.read_next_early = lambda self, run, i: None
    try:
        with load(directory, budget=budget, read_ahead=mode != "off") as engine, torch.no_grad():
            past, times = None, []
            for k, ids in enumerate(calls):
                t0 = time.perf_counter()
                out = engine(torch.tensor(ids), past_key_values=past, use_cache=True)
                times.append(time.perf_counter() - t0)
                if not torch.equal(out.logits, logits[k]):
                    raise SystemExit(f"{directory.parent.name} {mode}: call {k}'s logits differ from the model's")
                past = out.past_key_values
    finally:
        UnitStream.read_next_early = early
    return statistics.median(times[1:])


def markdown(data: dict[str, Any]) -> str:
    modes = data.get("modes", list(MODES))
    lines = [
        "# Read-ahead from a pass's tail",
        "",
        f"A cached decode step (median of {data['steps']}), {data['rounds']} rounds, the configurations "
        "alternating in one process: *off* no read-ahead; *end* the read-ahead starting when the pass ends (as "
        "before); *tail* starting once the pass's last streamed unit is done (`read_ahead=True` now). Every "
        "step's logits equal the model's own. Generated by `bench/read_ahead_tail.py`.",
        "",
        "| model | budget (MB) | " + " | ".join(f"{m} (ms)" for m in modes) + " | tail ÷ off | "
        + ("tail ÷ end | " if "end" in modes else "") + "tail ÷ off by round |",
        "|---|---:|" + "---:|" * (len(modes) + 1 + ("end" in modes)) + "---|",
    ]
    for r in data["rows"]:
        med = {m: statistics.median(r[m]) for m in modes}
        by_round = ", ".join(f"{t / o:.2f}" for t, o in zip(r["tail"], r["off"], strict=True))
        lines.append(
            f"| {r['model']} | {r['budget_bytes'] / 1e6:.1f} | " + " | ".join(f"{med[m] * 1e3:.1f}" for m in modes)
            + f" | {med['tail'] / med['off']:.3f} | "
            + (f"{med['tail'] / med['end']:.3f} | " if "end" in modes else "") + f"{by_round} |"
        )
    ratios = [statistics.median(r["tail"]) / statistics.median(r["off"]) for r in data["rows"]]
    lines += ["", f"*tail ÷ off* over the rows: median {statistics.median(ratios):.3f}, "
              f"from {min(ratios):.3f} to {max(ratios):.3f}."]
    m = data["machine"]
    lines += ["", f"Machine: {m.get('cpu')}, {m.get('cores', '?')} cores, torch {m.get('torch')}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(BUDGETS))
    p.add_argument("--budgets", choices=("fixed", "vs-mmap"), default="fixed",
                   help="fixed: the one budget of each model above; vs-mmap: each one vs_mmap.json gave it")
    p.add_argument("--modes", default=",".join(MODES), help="of off, end, tail (off and tail are needed)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--output", default="read_ahead_tail")
    args = p.parse_args(argv)
    modes = tuple(args.modes.split(","))
    if not {"off", "tail"} <= set(modes) <= set(MODES):
        p.error(f"--modes: off and tail, and end if wanted, not {args.modes}")
    data: dict[str, Any] = {"machine": machine(), "rounds": args.rounds, "steps": args.steps, "modes": list(modes),
                            "args": {"budgets": args.budgets, "modes": args.modes, "rounds": args.rounds,
                                     "steps": args.steps, "output": args.output}, "rows": []}
    for name in args.models.split(","):
        if name not in BUDGETS:
            p.error(f"unknown model {name}: use {', '.join(BUDGETS)}")
        prepared(name, CACHE / name)
        calls, logits = off_main(lambda name=name: reference(name, args.steps))
        for budget in [BUDGETS[name]] if args.budgets == "fixed" else vs_mmap_budgets(name):
            runs: dict[str, list[float]] = {m: [] for m in modes}
            for r in range(args.rounds):
                for mode in modes if r % 2 == 0 else modes[::-1]:
                    step = off_main(lambda mode=mode, name=name, budget=budget, calls=calls, logits=logits: decode(
                        CACHE / name / "prepared", budget, mode, calls, logits))
                    runs[mode].append(step)
                    print(name, budget, r, mode, f"{step * 1e3:.1f} ms", flush=True)
            data["rows"].append({"model": name, "budget_bytes": budget, **runs})
    js, md = write_results(args.output, data, markdown(data))
    print(f"wrote {js} and {md}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
