"""Real memory cgroups (v1) for tests that run a command within a limit: created where the
machine allows it (root, the v1 memory controller mounted), else the reason to skip."""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

MEMORY_V1 = Path("/sys/fs/cgroup/memory")


def unavailable() -> str | None:
    """Why no memory cgroup can be made here (None: one can)."""
    if not (MEMORY_V1 / "memory.limit_in_bytes").is_file():
        return "no cgroup v1 memory controller at /sys/fs/cgroup/memory"
    if os.geteuid() != 0:
        return "making a memory cgroup needs root"
    return None


class MemoryCgroup:
    """A cgroup limited to ``limit`` bytes; :meth:`run` runs a command in it."""

    def __init__(self, limit: int) -> None:
        self.path = MEMORY_V1 / f"layerfit-test-{uuid.uuid4().hex[:8]}"
        self.path.mkdir()
        (self.path / "memory.limit_in_bytes").write_text(str(limit))

    def run(self, args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
        procs = self.path / "cgroup.procs"
        return subprocess.run(
            args, capture_output=True, text=True, timeout=timeout,
            preexec_fn=lambda: procs.write_text(str(os.getpid())),
        )

    def oom_kills(self) -> int:
        """Processes the kernel killed for this cgroup's limit."""
        for line in (self.path / "memory.oom_control").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def peak_bytes(self) -> int:
        return int((self.path / "memory.max_usage_in_bytes").read_text())

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.rmdir()


@contextlib.contextmanager
def memory_cgroup(limit: int) -> Iterator[MemoryCgroup]:
    """A fresh memory cgroup of ``limit`` bytes, removed afterwards."""
    cgroup = MemoryCgroup(limit)
    try:
        yield cgroup
    finally:
        cgroup.remove()
