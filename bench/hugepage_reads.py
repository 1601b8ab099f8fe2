"""Direct reads into 4 KiB pages against reads into transparent huge pages.

A direct read lands in the buffer's physical pages; a disk queue takes a bounded number
of scatter-gather segments per request (``/sys/block/DEV/queue/max_segments``: 254 on
this VM's virtio disk), so a read of a few MiB into scattered 4 KiB pages is split into
several requests, while huge pages make each 2 MiB one segment. This bench reads the
same file with O_DIRECT into a buffer of each kind, alternating in every round, at the
request sizes the engine uses (its coalesced units are up to 4 MiB), and reports each
kind's bandwidth and the per-round ratio. The 4 KiB buffer is made as the engine made
it before (``MAP_POPULATE``), the huge-page one by :func:`layerfit.store.reader.aligned_buffer`;
each is made fresh in every round, since where its pages land is the point. Writes
``bench/results/hugepage_reads.{json,md}``::

    python bench/hugepage_reads.py [--file PATH] [--rounds 7] [--megabytes 256]
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reporting import machine, paired_overhead, write_results  # noqa: E402
from storage import block_device  # noqa: E402

from layerfit.store.reader import aligned_buffer  # noqa: E402

SIZES = (1, 4, 16)  # MiB per read request


def small_pages(nbytes: int) -> mmap.mmap:
    """A pre-faulted anonymous buffer in 4 KiB pages (huge pages refused for it)."""
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    view = memoryview(buf)
    for off in range(0, nbytes, mmap.PAGESIZE):
        view[off] = 0
    view.release()
    return buf


def huge_pages_of(buf: mmap.mmap) -> int:
    """Bytes of ``buf`` the kernel backs with huge pages (its smaps entry)."""
    import ctypes

    start = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for k, line in enumerate(lines):
        head = line.split()[0]
        if "-" in head and int(head.split("-")[0], 16) == start:
            for entry in lines[k + 1:]:
                if entry.startswith("AnonHugePages:"):
                    return int(entry.split()[1]) * 1024
    return 0


def read_rate(path: Path, buf: mmap.mmap, nbytes: int, request: int) -> float:
    """Bytes per second reading ``nbytes`` of ``path`` with O_DIRECT in ``request``-byte reads."""
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    try:
        t0, done = time.perf_counter(), 0
        while done < nbytes:
            at = done % len(buf)
            got = os.preadv(fd, [view[at : at + request]], done)
            if got <= 0:
                break
            done += got
        return done / (time.perf_counter() - t0)
    finally:
        os.close(fd)
        view.release()


def default_file() -> Path:
    """The largest prepared weights file under bench/.cache."""
    files = sorted((Path(__file__).parent / ".cache").rglob("weights.*"), key=lambda p: p.stat().st_size)
    if not files:
        raise SystemExit("no prepared weights under bench/.cache: run bench/decoding.py first, or pass --file")
    return files[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--file", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--megabytes", type=int, default=256, help="MiB read per measurement")
    ap.add_argument("--buffer-megabytes", type=int, default=100)
    ap.add_argument("--output", default="hugepage_reads")
    args = ap.parse_args()
    path = args.file or default_file()
    nbytes = min(args.megabytes * 2**20, path.stat().st_size // 2**20 * 2**20)
    size = args.buffer_megabytes * 2**20
    kinds = {"4 KiB pages": small_pages, "huge pages": aligned_buffer}
    rates: dict[str, dict[int, list[float]]] = {k: {s: [] for s in SIZES} for k in kinds}
    huge_bytes: dict[str, list[int]] = {k: [] for k in kinds}
    for _ in range(args.rounds):
        for kind, make in kinds.items():
            buf = make(size)
            huge_bytes[kind].append(huge_pages_of(buf))
            for s in SIZES:
                rates[kind][s].append(read_rate(path, buf, nbytes, s * 2**20))
            buf.close()
    dev = block_device(path)
    queue = Path("/sys/dev/block") / dev / "queue"  # major:minor links to the disk's own folder

    def queue_value(name: str) -> str | None:
        return (queue / name).read_text().strip() if (queue / name).exists() else None

    results: dict[str, Any] = {
        kind: {f"{s} MiB": {"median_bps": statistics.median(r), "all_bps": r} for s, r in by_size.items()}
        for kind, by_size in rates.items()
    }
    ratios = {f"{s} MiB": paired_overhead(rates["huge pages"][s], rates["4 KiB pages"][s]) for s in SIZES}
    data = {
        "benchmark": "hugepage_reads", "machine": machine(), "file": str(path), "bytes_per_measurement": nbytes,
        "buffer_bytes": size, "rounds": args.rounds, "device": dev, "max_segments": queue_value("max_segments"),
        "max_sectors_kb": queue_value("max_sectors_kb"),
        "transparent_hugepage": Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
        if Path("/sys/kernel/mm/transparent_hugepage/enabled").exists() else None,
        "huge_page_bytes": {k: statistics.median(v) for k, v in huge_bytes.items()},
        "results": results, "huge_over_small": ratios,
    }
    lines = [
        "# Direct reads into 4 KiB pages against transparent huge pages", "",
        f"File {path.name} ({nbytes / 2**20:.0f} MiB read per measurement) on disk {dev} (max_segments "
        f"{data['max_segments']}, max_sectors_kb {data['max_sectors_kb']}); THP: {data['transparent_hugepage']}. "
        f"{args.rounds} rounds, the two buffers alternating, each made fresh per round "
        f"({size / 2**20:.0f} MiB; huge pages granted: {data['huge_page_bytes']['huge pages'] / 2**20:.0f} MiB "
        f"and {data['huge_page_bytes']['4 KiB pages'] / 2**20:.0f} MiB).", "",
        "| request | 4 KiB pages (GB/s) | huge pages (GB/s) | huge ÷ 4 KiB (median of rounds) | 90 % interval |",
        "|---|---:|---:|---:|---|",
    ]
    for s in SIZES:
        key, r = f"{s} MiB", ratios[f"{s} MiB"]
        lines.append(
            f"| {key} | {results['4 KiB pages'][key]['median_bps'] / 1e9:.2f} | "
            f"{results['huge pages'][key]['median_bps'] / 1e9:.2f} | {1 + r['median']:.2f}× | "
            f"{1 + r['ci90_low']:.2f}–{1 + r['ci90_high']:.2f}× |"
        )
    js, md = write_results(args.output, data, "\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {js} and {md}")


if __name__ == "__main__":
    main()
