"""Memory as the operating system sees it: peak RSS (resettable) and cgroup usage."""

from __future__ import annotations

from pathlib import Path

import psutil


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark of this process (Linux ``clear_refs`` 5)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """Peak resident set size since the process started or the last reset."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return psutil.Process().memory_info().rss


def rss_bytes() -> int:
    """Current resident set size."""
    return psutil.Process().memory_info().rss
