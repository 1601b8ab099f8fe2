"""Work run apart from the bench's main thread: off the main thread, in a fresh child process
(its peak RSS its own), or as a server process awaited until it answers.

Imports nothing beyond the standard library at load, so a child running in another virtual
environment (bench/vs_mmap.py's llama.cpp) uses it too. Nothing here asserts a timing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Any

from memory_limits import Cgroup


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

