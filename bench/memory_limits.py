"""Memory a bench bounds and measures: memory cgroups (v1), the page cache, peak anonymous
memory and a process's high-water mark, a child run under a memory limit.

Imports nothing beyond the standard library at load, so a child running in another virtual
environment (bench/vs_mmap.py's llama.cpp) uses it too. Nothing here asserts a timing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

CGROUP_V1 = Path("/sys/fs/cgroup")


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


def vm_hwm(pid: int) -> int:
    """A process's peak resident memory since it started (``VmHWM``)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


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



def private_torch(cache: Path) -> Path:
    """A folder under ``cache`` holding a copy of the installed torch package (its bytes
    copied, not linked), for children to import first (``PYTHONPATH``): the kernel pages out,
    and a process's RssFile counts, a library page only where no other process maps it, and
    the bench's own process (and any other PyTorch process on a shared machine) maps the
    installed libraries' pages, where a board running layerfit alone has none."""
    import tempfile

    import torch

    root = Path(tempfile.mkdtemp(prefix="private-torch-", dir=cache))
    shutil.copytree(Path(torch.__file__).parent, root / "torch", symlinks=True)
    os.sync()  # clean pages: the page cache may drop them
    return root
