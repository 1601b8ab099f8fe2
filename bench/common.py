"""Shared benchmark plumbing: isolated child runs, cgroup memory, result files.

Imports nothing beyond the standard library at load, so a child running in another
virtual environment (bench/vs_mmap.py's llama.cpp) uses it too. Each measured
configuration runs in a fresh child process, so peak RSS belongs to that
configuration alone. Where a memory cgroup (v1) can be created (as root), the child runs
inside its own cgroup and ``cgroup_peak_bytes`` reports ``memory.max_usage_in_bytes``,
which also counts the page cache the child caused. Nothing here asserts a timing.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"
CGROUP_V1 = Path("/sys/fs/cgroup")


def layerfit_commit() -> str | None:
    """The commit of the code measured (``-dirty`` when ``src/`` differs from it), or None
    outside a git checkout: a result says which defaults and which code it measured."""
    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "src"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return rev + ("-dirty" if changed else "")


def machine() -> dict[str, Any]:
    """What the numbers were measured on, and the commit of the code measured."""
    import psutil
    import torch

    return {
        "layerfit_commit": layerfit_commit(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "load_average_at_start": os.getloadavg(),
    }


def own_memory_cgroup() -> Path | None:
    """This process's memory cgroup directory (v1), or None."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                directory = CGROUP_V1 / "memory" / path.lstrip("/")
                return directory if (directory / "memory.usage_in_bytes").is_file() else None
    return None


class Cgroup:
    """A temporary cgroup (v1) of ``controller`` (``memory`` by default, or ``blkio``);
    ``None``-like (``available`` False) where not allowed."""

    def __init__(self, controller: str = "memory") -> None:
        self.path = CGROUP_V1 / controller / f"layerfit-bench-{uuid.uuid4().hex[:8]}"
        try:
            self.path.mkdir()
            self.available = True
        except OSError:
            self.available = False

    def enter_fn(self):
        if not self.available:
            return None
        procs = str(self.path / "cgroup.procs")

        def enter() -> None:
            with open(procs, "w") as fh:
                fh.write(str(os.getpid()))

        return enter

    def peak_bytes(self) -> int | None:
        if not self.available:
            return None
        return int((self.path / "memory.max_usage_in_bytes").read_text())

    def oom_kills(self) -> int:
        """How many processes the kernel killed for this memory cgroup's limit."""
        with contextlib.suppress(OSError, ValueError):
            for line in (self.path / "memory.oom_control").read_text().splitlines():
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
        return 0

    def remove(self) -> None:
        if self.available:
            with contextlib.suppress(OSError):
                self.path.rmdir()


# SanDisk Extreme A2 64 GB on a Raspberry Pi 4 (pidramble.com microSD benchmarks)
SD_CARD = {"read_bps": 43_700_000, "write_bps": 36_300_000, "read_iops": 1800, "write_iops": 900}


def block_device(path: Path) -> str:
    """``major:minor`` of the whole disk holding ``path`` (throttles apply to disks)."""
    st = os.stat(path)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    sysfs = Path("/sys/dev/block") / dev
    if (sysfs / "partition").exists():
        dev = (sysfs.resolve().parent / "dev").read_text().strip()
    return dev


class Storage:
    """Where a child's block I/O goes: as it is (``vm``) or throttled like an SD card.

    The throttle grants bytes per time slice, and reads that start within about 0.15 s of
    earlier reads are credited with the idle part of that slice: up to twice as fast as
    the card (``bench/sd_throttle.py``). A bench that times requests calls ``settle()``
    before each, so no request's speed depends on how long the disk idled before it.
    """

    SETTLE_S = 0.5  # idle time after which the throttle reads at its rate again (measured: 0.2 s)

    def __init__(self, kind: str, path: Path) -> None:
        if kind not in ("vm", "sd"):
            raise SystemExit(f"--storage: vm or sd, got {kind!r}")
        self.kind = kind
        self.device = block_device(path)
        self.throttle: Cgroup | None = None
        if kind == "sd":
            self.throttle = Cgroup("blkio")
            if not self.throttle.available:
                raise SystemExit("--storage sd needs a blkio cgroup (v1), i.e. root")
            for key, value in SD_CARD.items():
                (self.throttle.path / f"blkio.throttle.{key}_device").write_text(f"{self.device} {value}")

    @property
    def cgroup(self) -> Path | None:
        return None if self.throttle is None else self.throttle.path

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "device": self.device, **(SD_CARD if self.kind == "sd" else {})}

    def settle(self) -> None:
        """Idle until the throttle has forgotten earlier reads (a no-op for ``vm``)."""
        if self.throttle is not None:
            time.sleep(self.SETTLE_S)

    def bytes_read(self) -> int | None:
        """Bytes read so far through the throttle (``None`` for ``vm``): what the card served."""
        if self.throttle is None:
            return None
        for line in (self.throttle.path / "blkio.throttle.io_service_bytes").read_text().splitlines():
            fields = line.split()
            if len(fields) == 3 and fields[0] == self.device and fields[1] == "Read":
                return int(fields[2])
        return 0

    def enter_fn(self):
        """A ``preexec_fn`` that puts a child under the throttle from its start."""
        return None if self.throttle is None else self.throttle.enter_fn()

    def enter_here(self) -> None:
        """Put this whole process under the throttle (a no-op for ``vm``)."""
        if self.throttle is not None:
            (self.throttle.path / "cgroup.procs").write_text(str(os.getpid()))

    def leave_here(self) -> None:
        """Take this process back out of the throttle (to the blkio root)."""
        if self.throttle is not None:
            (CGROUP_V1 / "blkio" / "cgroup.procs").write_text(str(os.getpid()))

    def remove(self) -> None:
        if self.throttle is not None:
            self.throttle.remove()


class AnonPeak:
    """The process's peak anonymous memory (RssAnon), sampled every 20 ms on a thread:
    what the cgroup cannot reclaim, unlike the page cache of the mapped checkpoint."""

    def __init__(self) -> None:
        self.peak = 0
        threading.Thread(target=self._sample, daemon=True).start()

    def peak_now(self) -> int:
        """The peak including this moment (the sampler may not have run since the last change)."""
        time.sleep(0.05)
        return self.peak

    def _sample(self) -> None:
        while True:
            with open("/proc/self/status") as fh:
                for line in fh:
                    if line.startswith("RssAnon:"):
                        self.peak = max(self.peak, int(line.split()[1]) * 1024)
            time.sleep(0.02)


def train_step(model: Any, optimizer: Any, schedule: Any, ids: Any, labels: Any, bf16: bool) -> Any:
    """One optimizer step of a causal language model on ``ids`` (its loss on ``labels``),
    under bf16 autocast on the CPU when ``bf16``, gradients clipped to norm 1; the loss."""
    import torch

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(ids, labels=labels).loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    schedule.step()
    return loss


def off_main(fn: Callable[[], Any]) -> Any:
    """``fn()`` on a fresh thread, its exception re-raised here. A bench's own tensor work
    runs there: a thread that ran PyTorch kernels keeps an OpenMP team until it ends, and
    a team on the main thread would slow every forward thread measured after it (README)."""
    out: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # handed back to the caller
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]


def run_child(script: str, args: list[str], timeout: float = 1800) -> dict[str, Any]:
    """Run ``python script --child ARGS`` in its own cgroup; its last stdout line is JSON."""
    cg = Cgroup()
    try:
        proc = subprocess.run(
            [sys.executable, script, "--child", *args],
            capture_output=True, text=True, timeout=timeout, preexec_fn=cg.enter_fn(),
        )
        if proc.returncode != 0:
            return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["failed"]}
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        result["cgroup_peak_bytes"] = cg.peak_bytes()
        return result
    finally:
        cg.remove()


def drop_page_cache() -> None:
    """Write dirty pages back and drop the page cache (root): the next child starts cold."""
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("3")


def limited_child(
    script: str | Path, args: list[str], limit: int | None, python: str | Path = sys.executable, timeout: float = 1800,
) -> dict[str, Any]:
    """Run ``python script --child ARGS`` in a fresh memory cgroup (v1) limited to ``limit``
    bytes (None: no limit), after dropping the page cache: the limit then counts every page
    the child brings in, its libraries' and its mapped files' included. Its last stdout
    line is JSON; the result adds ``returncode``, ``oom_kills`` and ``cgroup_peak_bytes``
    (``error``, the last line it printed, when it failed)."""
    cgroup = CGROUP_V1 / "memory" / f"layerfit-bench-{uuid.uuid4().hex[:8]}"
    cgroup.mkdir()
    try:
        if limit is not None:
            (cgroup / "memory.limit_in_bytes").write_text(str(limit))
        drop_page_cache()

        def enter() -> None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))

        proc = subprocess.run(
            [str(python), str(script), "--child", *args], capture_output=True, text=True, preexec_fn=enter,
            timeout=timeout,
        )
        oom = next((int(line.split()[1]) for line in (cgroup / "memory.oom_control").read_text().splitlines()
                    if line.startswith("oom_kill ")), 0)
        result: dict[str, Any] = {"returncode": proc.returncode, "oom_kills": oom}
        if proc.returncode == 0:
            result.update(json.loads(proc.stdout.strip().splitlines()[-1]))
        else:
            result["error"] = ((proc.stderr or proc.stdout).strip().splitlines() or ["killed"])[-1][:300]
        result["cgroup_peak_bytes"] = int((cgroup / "memory.max_usage_in_bytes").read_text())
        return result
    finally:
        for _ in range(50):  # the child's pages leave the group as it is torn down
            try:
                cgroup.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def write_results(name: str, data: dict[str, Any], markdown: str) -> tuple[Path, Path]:
    RESULTS.mkdir(parents=True, exist_ok=True)
    js, md = RESULTS / f"{name}.json", RESULTS / f"{name}.md"
    js.write_text(json.dumps(data, indent=2, default=str) + "\n")
    md.write_text(markdown)
    return js, md


def progress(items: Any, label: str, total: int | None = None) -> Any:
    """``items`` one by one, with a bar labelled ``label`` on stderr where it is a terminal
    (layerfit.console.track): nothing where the output is piped or logged, nor in a child
    whose environment has no layerfit (its items, plainly)."""
    try:
        from layerfit.console import track
    except ImportError:
        return items
    return track(items, label, total=total)


def mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e6:.1f}"


def prepared_zoo_model(name: str, resolution: int, cache: Path) -> Path:
    """A zoo model prepared at ``resolution`` x ``resolution`` under ``cache`` (reused)."""
    from layerfit import zoo
    from layerfit.errors import LayerfitError
    from layerfit.store import prepare, read_manifest

    entry = zoo.get(name)
    shape = (*entry.input_shape[:-2], resolution, resolution)
    out = cache / f"{name}-{resolution}"
    try:
        manifest = read_manifest(out)
        # prepared before the captured pass was measured: its estimates would be the old ones
        if manifest.input_shape == shape and manifest.graph.pass_peak_bytes:
            return out
    except LayerfitError:
        pass  # missing or stale: prepare it again
    prepare(name, out, input_shape=shape, force=True)
    return out


def paired_overhead(times: list[float], reference: list[float], seed: int = 0) -> dict[str, float]:
    """Median of per-round ratios ``times[k] / reference[k] - 1`` with a 90 % bootstrap
    interval, and the ratio of the fastest runs. Rounds run the configurations back to
    back, so slow drift of a shared machine cancels in each ratio; interference only ever
    slows a run down, so the fastest runs show what each configuration costs undisturbed."""
    import random
    import statistics

    ratios = [t / r for t, r in zip(times, reference, strict=True)]
    rnd = random.Random(seed)
    boot = sorted(statistics.median(rnd.choices(ratios, k=len(ratios))) for _ in range(2000))
    return {
        "median": statistics.median(ratios) - 1,
        "ci90_low": boot[100] - 1,
        "ci90_high": boot[1899] - 1,
        "min_ratio": min(times) / min(reference) - 1,
        "rounds": len(ratios),
    }


class StealMeter:
    """Share of CPU time the hypervisor gave to others (``steal`` in /proc/stat) and the
    load average, over a measured stretch: says how quiet the machine was."""

    def __init__(self) -> None:
        self.start = self._read()

    @staticmethod
    def _read() -> tuple[int, int]:
        try:
            fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        except (OSError, ValueError):
            return 0, 0
        return (fields[7] if len(fields) > 7 else 0), sum(fields)

    def stop(self) -> dict[str, float]:
        steal, total = self._read()
        d_total = total - self.start[1]
        return {
            "steal_share": (steal - self.start[0]) / d_total if d_total > 0 else 0.0,
            "load_average_1m": os.getloadavg()[0],
        }


def _direct_pass(path: Path, buffer: Any, size: int | None) -> tuple[int, float]:
    """One pass reading ``path`` from its start with ``O_DIRECT`` into ``buffer`` (one
    request of the buffer's length each), up to ``size`` bytes (None: to its end): the
    bytes read and the seconds it took."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
    try:
        t0, done = time.perf_counter(), 0
        while size is None or done < size:
            got = os.preadv(fd, [buffer], done)
            if got <= 0:
                break
            done += got
        return done, time.perf_counter() - t0
    finally:
        os.close(fd)


def direct_read_bandwidth(path: Path, limit: int = 1024 * 2**20, chunks: tuple[int, ...] = (8 * 2**20, 64 * 2**20),
                          repeats: int = 2) -> float:
    """Bytes per second reading ``path`` (its first ``limit`` bytes) with O_DIRECT into a
    pre-faulted buffer, the best of ``chunks``-byte requests (each the median of
    ``repeats`` passes): the disk's speed the same minute a bench runs, past the page
    cache, at the request sizes the engine's coalesced reads take (an unfaulted buffer or
    small requests measure well below what the engine reads at). The buffer is the
    engine's own kind (huge pages where granted: bench/hugepage_reads.py)."""
    from layerfit.store.reader import aligned_buffer

    rates = []
    for chunk in chunks:
        buffer = aligned_buffer(chunk)
        size = min(path.stat().st_size, limit) // chunk * chunk
        passes = []
        for _ in range(repeats):
            done, seconds = _direct_pass(path, buffer, size)
            passes.append(done / seconds)
        buffer.close()
        rates.append(sorted(passes)[len(passes) // 2])
    return max(rates)


def direct_read_once(path: Path, chunk: int) -> dict[str, Any]:
    """Read ``path`` whole with ``O_DIRECT`` in ``chunk``-byte reads into a pre-faulted
    buffer of the engine's own kind (huge pages where granted), as the engine reads a
    unit (an unfaulted one halved the rate of 256 MiB reads here), page cache dropped
    first: one pass, as a row (bench/vs_mmap.py's and bench/pipeline_floor.py's records)."""
    from layerfit.store.reader import aligned_buffer

    drop_page_cache()
    buffer = aligned_buffer(chunk)
    try:
        total, seconds = _direct_pass(path, buffer, None)
    finally:
        buffer.close()
    return {"file": str(path), "bytes": total, "seconds": seconds, "bytes_per_s": total / seconds, "chunk_bytes": chunk}


def launch_server(command: list[str], env: dict[str, str] | None = None, preexec_fn: Any = None,
                  wait: float = 300) -> tuple[subprocess.Popen, str]:
    """Start ``layerfit serve`` (``command``) and return the process and its base URL,
    read from the line it prints when it listens; its output is drained so the pipe
    never fills. A server that does not start in ``wait`` seconds is killed."""
    import re

    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            preexec_fn=preexec_fn)
    found: list[str] = []
    ready = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            match = re.search(r"at (http://\S+)/v2", line)
            if match and not found:
                found.append(match.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(wait) or not found:
        proc.kill()
        proc.wait()
        raise SystemExit("the server did not start")
    return proc, found[0]


def vm_hwm(pid: int) -> int:
    """A process's peak resident memory since it started (``VmHWM``)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for process {pid}")
