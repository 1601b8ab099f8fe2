"""Run a bench on two commits, alternating, and compare their numbers with the noise.

A refactoring must not slow anything down, and this machine is shared and noisy: a
before/after pair measured an hour apart compares the hour, not the code. This driver
checks out ``--before`` and ``--after`` as worktrees, runs each one's own copy of the
bench (``PYTHONPATH`` set to that tree's ``src``) in turn, ``--rounds`` times each,
alternating (before, after, before, after, ...), and then compares every timing the
bench's JSON reports: the median of each side, the ratio after / before, and the noise,
the spread between the rounds of one side (max / min - 1, the larger side's). A change
within the noise is no change that this machine can show.

    python bench/ab_commits.py --before e85f03a --after HEAD --rounds 2 \\
        --bench "demand_layering.py --quick" --output-flag --output --name refactor_dl

writes ``bench/results/<name>.{json,md}``. A bench whose result option is ``--name``
(``serve_load.py``) is given as ``--output-flag=--name``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from reporting import machine, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TIMING = re.compile(r"(^|/)(latency_s|token_s|prompt_s|median_s|p50_ms|p95_ms|throughput_rps|tokens_per_s|ttft_p50_s|token_gap_p50_s)$")
THROUGHPUTS = ("throughput_rps", "tokens_per_s")  # higher is faster; every other metric is a time


def numbers(data: Any, path: str = "") -> dict[str, float]:
    """Every numeric leaf of ``data`` by its path (``a/b/0/c``)."""
    out: dict[str, float] = {}
    if isinstance(data, dict):
        for k, v in data.items():
            out.update(numbers(v, f"{path}/{k}" if path else str(k)))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out.update(numbers(v, f"{path}/{i}"))
    elif isinstance(data, (int, float)) and not isinstance(data, bool):
        out[path] = float(data)
    return out


def worktree(rev: str, where: Path) -> Path:
    """A detached worktree of ``rev`` at ``where``, sharing this tree's ``bench/.cache``
    (models a bench trains or prepares once, keyed by what made them), so neither side
    trains or prepares again what the other already has."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-f", "--detach", str(where), rev],
                   check=True, capture_output=True)
    (ROOT / "bench" / ".cache").mkdir(exist_ok=True)
    (where / "bench" / ".cache").symlink_to(ROOT / "bench" / ".cache", target_is_directory=True)
    return where


def run_bench(tree: Path, bench: list[str], flag: str, name: str, timeout: float) -> dict[str, Any]:
    """Run ``tree``'s own bench with ``tree``'s library; its JSON result."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    cmd = [sys.executable, str(tree / "bench" / bench[0]), *bench[1:], flag, name]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=tree, env=env, check=True, timeout=timeout, stdout=subprocess.DEVNULL)
    result = tree / "bench" / "results" / f"{name}.json"
    data = json.loads(result.read_text())
    for suffix in (".json", ".md"):
        (tree / "bench" / "results" / f"{name}{suffix}").unlink(missing_ok=True)
    data["_wall_s"] = time.perf_counter() - t0
    return data


def compare(before: list[dict], after: list[dict], pattern: re.Pattern) -> list[dict[str, Any]]:
    """Per timing in both sides' results: medians, ratio and the rounds' spread."""
    b = [numbers(d) for d in before]
    a = [numbers(d) for d in after]
    keys = sorted(set.intersection(*(set(x) for x in b + a)))
    rows = []
    for key in keys:
        if not pattern.search(key):
            continue
        bv, av = [x[key] for x in b], [x[key] for x in a]
        if min(bv + av) <= 0:
            continue
        spread = max(max(bv) / min(bv), max(av) / min(av)) - 1
        ratio = statistics.median(av) / statistics.median(bv)
        slowdown = 1 / ratio if key.endswith(THROUGHPUTS) else ratio  # above 1: slower
        rows.append({
            "metric": key, "before": bv, "after": av, "before_median": statistics.median(bv),
            "after_median": statistics.median(av), "ratio": ratio, "noise": spread,
            "slower_beyond_noise": slowdown - 1 > spread,
        })
    return rows


def markdown(data: dict[str, Any]) -> str:
    lines = [
        f"# {data['bench']}: {data['before']} → {data['after']}, {data['rounds']} rounds each, alternating",
        "",
        "Ratio = after / before (medians; a throughput above 1 is faster, a time above 1 slower). "
        "Noise = the larger side's spread between its rounds (max / min − 1).",
        "",
        "| metric | before | after | ratio | noise | slower beyond noise |",
        "|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        lines.append(
            f"| {r['metric']} | {r['before_median']:.4g} | {r['after_median']:.4g} | {r['ratio']:.3f} | "
            f"{r['noise']:.1%} | {'yes' if r['slower_beyond_noise'] else ''} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True)
    p.add_argument("--after", default="HEAD")
    p.add_argument("--bench", required=True, help="the bench script and its arguments, e.g. 'decoding.py --rounds 3'")
    p.add_argument("--output-flag", default="--output", help="the bench's option naming its result file")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--metrics", default=TIMING.pattern, help="regex of the result paths to compare")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--name", required=True)
    args = p.parse_args()
    bench = shlex.split(args.bench)
    revs = {side: subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True,
                                 capture_output=True, text=True).stdout.strip()
            for side, rev in (("before", args.before), ("after", args.after))}
    with tempfile.TemporaryDirectory(prefix="ab-") as tmp:
        trees = {side: worktree(rev, Path(tmp) / side) for side, rev in revs.items()}
        try:
            runs: dict[str, list[dict]] = {"before": [], "after": []}
            for r in range(args.rounds):
                for side in ("before", "after"):
                    print(f"round {r + 1}: {side} ({revs[side]})", flush=True)
                    runs[side].append(run_bench(trees[side], bench, args.output_flag, f"ab_{side}_{r}", args.timeout))
        finally:
            for tree in trees.values():
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    data = {
        "bench": args.bench, "before": revs["before"], "after": revs["after"], "rounds": args.rounds,
        "machine": machine(), "rows": compare(runs["before"], runs["after"], re.compile(args.metrics)),
        "wall_s": {side: [d["_wall_s"] for d in runs[side]] for side in runs},
    }
    js, md = write_results(args.name, data, markdown(data))
    print(markdown(data))
    print(f"wrote {js} and {md}")


if __name__ == "__main__":
    main()
