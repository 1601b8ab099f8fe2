"""Load/unload churn and requests of new shapes leave nothing behind (issue 52 item 4).

A server that loads and unloads a model while clients infer grew its RSS every cycle
until it was OOM-killed: each load makes a new scheduler profile of the model, and the
dispatcher's cache of reduced task graphs kept every profile it had seen alive (with its
graph) for the process's life. These tests count what such a leak would pile up — live
profiles, engines, threads, open file descriptors — after many cycles, against the count
after the first: no timing, no RSS.
"""

from __future__ import annotations

import gc
import os
import threading
from pathlib import Path

import pytest
import torch
from runtime_helpers import model_input, runtime_threads

from layerfit.engine.engine import Engine
from layerfit.errors import LayerfitError
from layerfit.schedule.profile import NetworkProfile
from layerfit.schedule.runtime.executor import Runtime

CYCLES = 12


def live(kind: type) -> int:
    """How many objects of exactly ``kind`` are alive after a full collection."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is kind)


def open_fds() -> int | None:
    """Open file descriptors of this process (None where /proc is not there)."""
    fds = Path("/proc/self/fd")
    return len(os.listdir(fds)) if fds.is_dir() else None


def footprint() -> dict[str, object]:
    """What a leak across load/unload cycles would grow (once the forward threads of the
    jobs just resolved have left: a job resolves as its last task ends, before its thread)."""
    for thread in threading.enumerate():
        if thread.name.startswith("layerfit-forward"):
            thread.join(60)
    return {
        "profiles": live(NetworkProfile),
        "engines": live(Engine),
        "threads": sorted(runtime_threads()),
        "fds": open_fds(),
    }


def test_load_unload_churn_with_clients_returns_to_the_first_cycles_footprint(repo):
    names = ["tiny", "chain"]
    rt = Runtime(repo, "200KB", workers=2)
    inputs = {name: model_input(name) for name in names}
    stop = threading.Event()
    served: list[int] = [0]
    failures: list[BaseException] = []

    def quiet_cycle() -> None:
        """Unload and load every model, then one request each: one engine per model."""
        for name in names:
            rt.unload_model(name)
            rt.load_model(name)
            rt.infer(name, inputs[name]).result(timeout=60)

    def client(k: int) -> None:
        while not stop.is_set():
            name = names[k % len(names)]
            k += 1
            try:
                rt.infer(name, inputs[name]).result(timeout=60)
                served[0] += 1
            except LayerfitError:
                pass  # unloaded while it was sent or queued: expected during churn
            except BaseException as exc:  # anything else fails the test below
                failures.append(exc)
                return

    try:
        quiet_cycle()
        before = footprint()
        clients = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for t in clients:
            t.start()
        try:
            for _ in range(CYCLES):
                for name in names:
                    rt.unload_model(name)
                    rt.load_model(name)
        finally:
            stop.set()
            for t in clients:
                t.join(120)
        assert not failures, failures
        assert served[0] > 0
        quiet_cycle()
        assert footprint() == before
    finally:
        rt.shutdown(wait=True)


def test_requests_that_grow_a_profile_leave_no_profile_behind(repo):
    # A batch larger than prepared is admitted under a profile of its own (its activations
    # grown): one new profile per request, which the graph cache must not keep.
    rt = Runtime(repo, "2MB", workers=1)
    try:
        rt.infer("chain", model_input("chain")).result(timeout=60)
        before = live(NetworkProfile)
        for batch in range(2, 2 + CYCLES):
            x = torch.cat([model_input("chain", seed=s) for s in range(batch)])
            assert rt.infer("chain", x).result(timeout=60).shape[0] == batch
        assert live(NetworkProfile) == before
    finally:
        rt.shutdown(wait=True)


@pytest.fixture(autouse=True)
def _no_threads_left():
    yield
    assert runtime_threads() == []
