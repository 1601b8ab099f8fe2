"""How faithfully the cgroup blkio throttle plays a microSD card: the same reads after idle gaps.

``--storage sd`` in the benches throttles reads to a Raspberry Pi 4's microSD card
(43.7 MB/s) with the kernel's blk-throttle. A card reads at its rate whatever it did
before; the throttle does not. It grants bytes per time slice, and a read that starts
while the slice of earlier reads is still open is credited with the idle part of that
slice, so it runs faster than the rate. Once the slice has lapsed, reads run at the rate.
How fast a request's reads are then depends on how long the disk was idle before it,
which is an artifact of the emulation. Any bench that times requests under the throttle
must start each timed request with the throttle settled, or whatever ran before biases it.

This bench measures that dependence. Each trial reads ``--before`` bytes (an earlier
request's reads), stays idle for a gap, then reads ``--probe`` bytes in two concurrent
O_DIRECT reads, the way the runtime's two workers load a network's units, and times the
probe. Gaps and trials are interleaved in a seeded random order. It reports per gap the
median, minimum and maximum time, and the probe's time at the throttle's rate. Writes
``bench/results/sd_throttle.{json,md}``; needs root (cgroup v1 blkio)::

    .venv/bin/python bench/sd_throttle.py
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reporting import machine, write_results  # noqa: E402
from storage import SD_CARD, Storage  # noqa: E402

from layerfit.store.manifest import ALIGN  # noqa: E402
from layerfit.store.reader import SegmentReader, aligned_buffer  # noqa: E402

DEFAULT_GAPS = "0,0.02,0.05,0.08,0.1,0.15,0.2,0.3,0.5,1"


def aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def read(reader: SegmentReader, offset: int, nbytes: int) -> None:
    """One direct read of ``nbytes`` at ``offset`` into a fresh aligned buffer, through the
    reader the engine's load tasks use."""
    buffer = aligned_buffer(nbytes)
    view = memoryview(buffer)
    reader.read_range(offset, nbytes, view, f"{nbytes} bytes at {offset}")
    view.release()
    buffer.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--file", type=Path, default=None,
                   help="a file of at least 64 MB on the disk to throttle (default: one made in bench/.cache)")
    p.add_argument("--gaps", default=DEFAULT_GAPS, help="idle seconds between the earlier reads and the probe")
    p.add_argument("--trials", type=int, default=8, help="probes per gap")
    p.add_argument("--before", type=float, default=5e6, help="bytes read before each gap")
    p.add_argument("--probe", type=float, default=8.9e6, help="bytes of the timed probe (two concurrent reads)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default="sd_throttle")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    path = args.file
    if path is None:
        path = Path(__file__).parent / ".cache" / "sd_throttle.bin"
        if not path.exists() or path.stat().st_size < 64 << 20:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as fh:
                for _ in range(64):
                    fh.write(os.urandom(1 << 20))
                fh.flush()
                os.fsync(fh.fileno())
    size = path.stat().st_size
    before = aligned(int(args.before))
    halves = (aligned(int(args.probe * 0.45)), aligned(int(args.probe * 0.55)))
    if size < before + 2 * max(halves) + ALIGN:
        raise SystemExit(f"{path} is too small for these reads ({size} bytes)")
    gaps = [float(g) for g in args.gaps.split(",")]
    rng = random.Random(args.seed)
    trials = [g for g in gaps for _ in range(args.trials)]
    rng.shuffle(trials)

    def offset(nbytes: int) -> int:
        return rng.randrange(0, (size - nbytes) // ALIGN) * ALIGN

    reader = SegmentReader(path, size)
    if reader.mode != "direct":
        reader.close()
        raise SystemExit(f"{path}: the filesystem refuses O_DIRECT, so reads would bypass the throttle")
    storage = Storage("sd", path)
    times: dict[float, list[float]] = {g: [] for g in gaps}
    try:
        storage.enter_here()
        time.sleep(1.0)
        for gap in trials:
            read(reader, offset(before), before)
            time.sleep(gap)
            readers = [threading.Thread(target=read, args=(reader, offset(n), n)) for n in halves]
            t = time.perf_counter()
            for r in readers:
                r.start()
            for r in readers:
                r.join()
            times[gap].append(time.perf_counter() - t)
    finally:
        storage.leave_here()
        storage.remove()
        reader.close()

    probe = sum(halves)
    at_rate = probe / SD_CARD["read_bps"]
    rows = [
        {
            "gap_s": g,
            "median_ms": statistics.median(v) * 1e3,
            "min_ms": min(v) * 1e3,
            "max_ms": max(v) * 1e3,
            "median_vs_rate": statistics.median(v) / at_rate,
        }
        for g, v in times.items()
    ]
    data: dict[str, Any] = {
        "machine": machine(), "storage": storage.describe(), "file": str(path),
        "before_bytes": before, "probe_bytes": probe, "probe_at_rate_ms": at_rate * 1e3,
        "trials": args.trials, "seed": args.seed, "rows": rows,
        "samples_ms": {str(g): [x * 1e3 for x in v] for g, v in times.items()},
        "wall_s": time.perf_counter() - t0,
    }
    write_results(args.output, data, markdown(data))
    print(markdown(data))
    return 0


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# The SD-card throttle: the same reads after idle gaps",
        "",
        f"Each trial reads {data['before_bytes'] / 1e6:.1f} MB, stays idle for the gap, then reads "
        f"{data['probe_bytes'] / 1e6:.1f} MB in two concurrent O_DIRECT reads (the probe, timed). "
        f"At the throttle's {data['storage']['read_bps'] / 1e6:.1f} MB/s the probe takes "
        f"{data['probe_at_rate_ms']:.0f} ms; a microSD card takes that whatever came before. "
        f"{data['trials']} trials per gap, interleaved.",
        "",
        "| idle gap, s | median, ms | min | max | median / at the rate |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in data["rows"]:
        lines.append(
            f"| {r['gap_s']:g} | {r['median_ms']:.0f} | {r['min_ms']:.0f} | {r['max_ms']:.0f} "
            f"| {r['median_vs_rate']:.2f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
