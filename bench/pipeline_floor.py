"""The floor a two-stage pipeline can reach with the read buffer a budget leaves.

The decoding benches' floor is ``max(bytes read ÷ the disk's rate, the step preloaded)``:
it assumes the reader never waits for room. A reader whose buffer holds a few units does
wait: while kept units' kernels run, the buffer stays full and the disk idles. This bench
measures, for each budget ``bench/results/vs_mmap.json`` gave layerfit where it streamed:

* *measured*: layerfit's step (``auto`` at that budget, the read-ahead on; median of
  ``--steps`` steps), no memory limit;
* *issue floor*: the floor above, with the disk's rate measured just before and after
  (the model's own weights file read whole in 8 MiB direct reads; the higher);
* *buffer floor*: the same pass replayed in an ideal two-stage pipeline. Each unit
  computes as long as it did preloaded (its kernel and the code up to the next one, from
  a traced preloaded step, scaled to the median preloaded step); each streamed unit is read at the disk's rate, in order,
  as soon as the buffer has room, and its room comes back when its kernel ends; a
  kernel starts when the one before it ended and its unit is read. The reader runs
  across passes without a break (no request cost, no ragged end, no thread to wake):
  no reader with this buffer does better. *at layerfit's rule*: the same, but the next
  pass's reads start only once the pass's last streamed unit is done, as layerfit's
  read-ahead starts.

Writes ``bench/results/pipeline_floor.{json,md}``::

    .venv/bin/python bench/pipeline_floor.py [--models llama-0.5g,llama-2.1g,resnet152] [--steps 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from processes import off_main  # noqa: E402
from reporting import machine, write_results  # noqa: E402
from storage import direct_read_once  # noqa: E402
from vs_mmap import (  # noqa: E402
    BANDWIDTH_CHUNKS,
    CACHE,
    CNN,
    prepared,
    runner,
    streaming_budgets,
)

PASSES = 12  # replayed: the last pass's time is the steady state


def traced_steps(work: Path, name: str, steps: int, budget: int | None) -> tuple[list[float], Any, Any]:
    """The step times of one decode (or ``steps`` CNN passes) after its first pass, the
    traced timeline of the last, and the engine's plan, every output checked."""
    from layerfit.engine import load, output_digest

    expected = json.loads((work / "expected.json").read_text())
    want = expected["digests"]
    with load(work / "prepared", budget=budget, trace=True) as engine:
        run = runner(name, engine, expected)
        times = []
        for k in range(steps + 1):
            t0 = time.perf_counter()
            out = run(k)
            times.append(time.perf_counter() - t0)
            if output_digest(out) != (want[0] if name == CNN else want[k]):
                raise SystemExit(f"{name} at {budget}: pass {k}'s output differs from the model's")
        ring = engine.stream.ring.capacity if engine.stream.ring is not None else 0
        gathered = set(engine.plan.weights.gathered)
        return times[1:], engine.last_timeline, {"ring_bytes": ring, "gathered": gathered}


def compute_times(timeline: Any, units: int) -> list[float]:
    """Each unit's compute in a preloaded pass: from its kernel's start to the next one's
    (the last: to the pass's end); the code before the first kernel goes to unit 0."""
    starts = {e.unit: e.start for e in timeline.events if e.stage == "kernel"}
    order = sorted(starts, key=starts.get)
    if order != list(range(units)):  # the replay runs units in their order
        raise SystemExit(f"the preloaded trace ran {len(order)} kernels of {units} units, or not in their order")
    bounds = [0.0] + [starts[u] for u in order[1:]] + [timeline.latency_s]
    return [bounds[k + 1] - bounds[k] for k in range(units)]


def replay(compute: list[float], reads: dict[int, int], rows: set[int], ring: int, rate: float,
           continuous: bool) -> float:
    """The steady-state pass of the ideal pipeline (see the module's docstring): units run
    in order; ``reads`` maps each streamed unit to the bytes it reads; units in ``rows``
    are read by rows, which the ids of their own pass decide (not before it begins)."""
    if not reads:
        return sum(compute)
    last = max(reads)
    reader, clock, held, held_bytes = 0.0, 0.0, deque(), 0
    last_done = 0.0  # when the last pass's last streamed unit's kernel ended
    ends = []
    for p in range(PASSES):
        begun = clock
        for i, seconds in enumerate(compute):
            if i not in reads:
                clock += seconds
                continue
            need, start = reads[i], reader
            if i in rows:
                start = max(start, begun)
            elif p and not continuous:
                start = max(start, last_done)
            while held and held_bytes + need > ring:  # the oldest reads give their room back
                nbytes, free = held.popleft()
                held_bytes -= nbytes
                start = max(start, free)
            reader = start + need / rate
            clock = max(clock, reader) + seconds
            held.append((need, clock))
            held_bytes += need
            if i == last:
                last_done = clock
        ends.append(clock)
    return ends[-1] - ends[-2]


def measure(name: str, steps: int) -> list[dict[str, Any]]:
    """Every streaming budget of ``name``: measured, the issue's floor, the buffer's."""
    from layerfit.store import read_manifest

    work = CACHE / name
    prepared(name, work)
    units = len(read_manifest(work / "prepared").units)
    weights = work / "prepared" / "weights.safetensors"
    pre_times, pre_timeline, _ = off_main(lambda: traced_steps(work, name, steps, None))
    preloaded = statistics.median(pre_times)
    traced = compute_times(pre_timeline, units)  # one pass's split, scaled to the median step
    compute = [c * preloaded / sum(traced) for c in traced]
    rows = []
    for budget in streaming_budgets(name):
        before = direct_read_once(weights, BANDWIDTH_CHUNKS[0])["bytes_per_s"]
        times, timeline, plan = off_main(lambda budget=budget: traced_steps(work, name, steps, budget))
        after = direct_read_once(weights, BANDWIDTH_CHUNKS[0])["bytes_per_s"]
        rate = max(before, after)
        reads: dict[int, int] = {}
        for e in timeline.events:
            if e.stage == "read":
                reads[e.unit] = reads.get(e.unit, 0) + e.nbytes
        gathered = {e.unit for e in timeline.events if e.stage == "read" and e.unit in plan["gathered"]}
        step, total = statistics.median(times), sum(reads.values())
        issue = max(total / rate, preloaded)
        ideal = replay(compute, reads, gathered, plan["ring_bytes"], rate, continuous=True)
        rule = replay(compute, reads, gathered, plan["ring_bytes"], rate, continuous=False)
        rows.append({"model": name, "budget_bytes": budget, "ring_bytes": plan["ring_bytes"],
                     "read_per_step_bytes": total, "rate_bytes_per_s": rate, "rates_bytes_per_s": [before, after],
                     "preloaded_step_s": preloaded, "step_s": step, "steps_s": times, "issue_floor_s": issue,
                     "buffer_floor_s": ideal, "rule_floor_s": rule, "step_over_issue_floor": step / issue,
                     "step_over_buffer_floor": step / ideal, "buffer_floor_over_issue_floor": ideal / issue})
        print(f"{name} at {budget / 1e6:.1f} MB: step {step * 1e3:.1f} ms, issue floor {issue * 1e3:.1f}, "
              f"buffer floor {ideal * 1e3:.1f} (layerfit's rule {rule * 1e3:.1f}), ring {plan['ring_bytes'] / 1e6:.1f} MB, "
              f"{total / 1e6:.1f} MB at {rate / 1e9:.2f} GB/s", flush=True)
    return rows


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# The floor a two-stage pipeline can reach with the read buffer a budget leaves",
        "",
        "For each budget `bench/results/vs_mmap.json` gave layerfit where it streamed, no memory limit, the read-ahead "
        f"on: *step*, the median of {data['steps']} steps; *issue floor*, max(bytes read ÷ the disk's rate, the step "
        "preloaded), the floor the decoding benches report; *buffer floor*, the same pass replayed in an ideal "
        "pipeline with this budget's read buffer (each unit's compute as preloaded, reads at the disk's rate, in order, "
        "as soon as the buffer has room, across passes without a break; rows read once their pass begins); *rule*: "
        "the same with the next pass's reads starting once the pass's last streamed unit is done, as layerfit's "
        "read-ahead starts. The disk's rate: the model's own weights file read whole in 8 MiB direct reads just before "
        "and after, the higher. Generated by `bench/pipeline_floor.py`.",
        "",
        "| model | budget (MB) | read buffer (MB) | read per step (MB) | rate (GB/s) | preloaded (ms) | step (ms) "
        "| issue floor (ms) | buffer floor (ms) | rule (ms) | step ÷ issue floor | step ÷ buffer floor "
        "| buffer floor ÷ issue floor |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["rows"]:
        lines.append(
            f"| {r['model']} | {r['budget_bytes'] / 1e6:.1f} | {r['ring_bytes'] / 1e6:.1f} | "
            f"{r['read_per_step_bytes'] / 1e6:.1f} | {r['rate_bytes_per_s'] / 1e9:.2f} | "
            f"{r['preloaded_step_s'] * 1e3:.1f} | {r['step_s'] * 1e3:.1f} | {r['issue_floor_s'] * 1e3:.1f} | "
            f"{r['buffer_floor_s'] * 1e3:.1f} | {r['rule_floor_s'] * 1e3:.1f} | {r['step_over_issue_floor']:.2f} | "
            f"{r['step_over_buffer_floor']:.2f} | {r['buffer_floor_over_issue_floor']:.2f} |")
    m = data["machine"]
    lines += ["", f"Machine: {m.get('cpu')}, {m.get('cores', '?')} cores, torch {m.get('torch')}, "
              f"layerfit {m.get('layerfit_commit')}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=f"llama-0.5g,llama-2.1g,{CNN}")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--output", default="pipeline_floor")
    args = p.parse_args(argv)
    data: dict[str, Any] = {"machine": machine(), "steps": args.steps, "rows": []}
    for name in args.models.split(","):
        data["rows"] += measure(name, args.steps)
    js, md = write_results(args.output, data, markdown(data))
    print(f"wrote {js} and {md}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
