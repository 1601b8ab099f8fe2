"""Letting a thread's OpenMP team go, checked in a fresh process (teams are per thread
and live as long as it does) by the helper threads the process holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch  # noqa: F401 (loads PyTorch's OpenMP, which the skip conditions look for)

from layerfit.engine.openmp import (
    _libgomp,
    release_thread_team,
    set_compute_threads,
    without_thread_team,
)
from layerfit.errors import LayerfitError

# Two intra-op threads, so a parallel kernel starts a team with one helper on any machine.
# Native threads are those Python does not know: OpenMP's helpers among them.
_SCRIPT = """
import json, os, threading, torch
from layerfit.engine.openmp import release_thread_team, without_thread_team

torch.set_num_threads(2)

def native():
    python = {t.native_id for t in threading.enumerate()}
    return {int(t) for t in os.listdir("/proc/self/task")} - python

def helpers():  # native threads started since the script began and still alive
    return len(native() - before)

conv = torch.nn.Conv2d(3, 8, 3).eval()
x = torch.randn(1, 3, 64, 64)
before = native()
with torch.no_grad():
    first = conv(x)
kept = helpers()
released = release_thread_team()
after_release = helpers()
with torch.no_grad():
    second = conv(x)  # a new team, the same bits
again = helpers()

def fails():
    torch.ones(1 << 20).add_(1)
    raise ValueError("on purpose")

try:
    without_thread_team(fails)()
except ValueError:
    pass
after_wrapped = helpers()
print(json.dumps({"kept": kept, "released": released, "after_release": after_release, "again": again,
                  "after_wrapped": after_wrapped, "same": bool(torch.equal(first, second))}))
"""


def run_fresh(script: str) -> dict:
    """What ``script`` prints last (JSON), run in a fresh process free of OpenMP settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_"))}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(_libgomp() is None, reason="PyTorch's OpenMP here is not libgomp")
def test_a_released_team_leaves_and_the_next_kernel_starts_one_with_the_same_bits() -> None:
    seen = run_fresh(_SCRIPT)
    assert seen["kept"] == 1, seen  # the main thread's team: one helper beside it
    assert seen["released"] is True and seen["after_release"] == 0, seen
    assert seen["again"] == 1 and seen["same"], seen
    assert seen["after_wrapped"] == 0, seen  # released though the work raised


def test_without_thread_team_returns_what_the_work_returns() -> None:
    assert without_thread_team(lambda a, b=0: a + b)(2, b=3) == 5
    assert isinstance(release_thread_team(), bool)  # a thread with no team: nothing to free


# A thread's kernels start a team of (threads - 1) helpers, counted while the thread lives
# as the native threads that appeared during its work (the helpers of a thread that has
# ended may leave meanwhile, which a plain count would subtract).
_THREADS_SCRIPT = """
import json, os, threading, torch
from layerfit.engine.openmp import set_compute_threads

torch.set_num_threads(2)
conv = torch.nn.Conv2d(3, 8, 3).eval()
x = torch.randn(1, 3, 64, 64)

def native():
    python = {t.native_id for t in threading.enumerate()}
    return {int(t) for t in os.listdir("/proc/self/task")} - python

def team_of_a_new_thread():
    seen = []
    def work():
        before = native()
        with torch.no_grad():
            conv(x)
        seen.append(len(native() - before))
    t = threading.Thread(target=work)
    t.start()
    t.join()
    return seen[0]

two = team_of_a_new_thread()
in_effect = set_compute_threads(1)
one = team_of_a_new_thread()
print(json.dumps({"two": two, "in_effect": in_effect, "one": one, "kept": set_compute_threads(None)}))
"""


@pytest.mark.skipif(_libgomp() is None, reason="PyTorch's OpenMP here is not libgomp")
def test_compute_threads_apply_to_every_thread_that_runs_its_first_kernel_afterwards() -> None:
    seen = run_fresh(_THREADS_SCRIPT)
    assert seen == {"two": 1, "in_effect": 1, "one": 0, "kept": 1}, seen  # a team of one has no helper


@pytest.mark.parametrize("bad", [0, -2, True, 1.5, "2"])
def test_a_thread_count_that_is_not_a_whole_number_of_one_or_more_is_refused(bad: object) -> None:
    with pytest.raises(LayerfitError, match=r"--threads must be a whole number of threads, 1 or more"):
        set_compute_threads(bad, "--threads")  # type: ignore[arg-type]
