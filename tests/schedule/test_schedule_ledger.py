"""The memory ledger: admissions, the progress rule, retained memory, waiting."""

from __future__ import annotations

import threading

import pytest

from layerfit.errors import ScheduleError
from layerfit.schedule.ledger import Admission, MemoryLedger


def test_fit_progress_and_refusal():
    ledger = MemoryLedger(10, clock=lambda: 0.0)
    assert ledger.acquire("a", 6) is Admission.FIT
    with pytest.raises(ScheduleError, match="needs 6 B but only 4 B of 10 B are free and 1 task"):
        ledger.acquire("b", 6)
    ledger.finish("a", keep=6)  # retained: still reserved, nothing running
    assert (ledger.used, ledger.running) == (6, 0)
    assert ledger.acquire("b", 6) is Admission.PROGRESS  # nothing runs: may run alone
    assert ledger.progress_count == 1 and ledger.free == -2
    assert ledger.acquire("c", 0) is Admission.FIT  # zero bytes always fit
    ledger.check()


def test_overcommit_is_counted_separately():
    ledger = MemoryLedger(10)
    ledger.acquire("a", 8)
    assert ledger.acquire("b", 8, allow_overcommit=True) is Admission.OVERCOMMIT
    assert (ledger.overcommit_count, ledger.progress_count, ledger.peak) == (1, 0, 16)
    ledger.check()
    # a budget-ignoring policy on one worker: nothing else runs, yet it did not wait for
    # the budget, so going over is an over-commit, not the progress rule
    alone = MemoryLedger(10)
    alone.acquire("a", 8, allow_overcommit=True)
    alone.finish("a", keep=8)
    assert alone.acquire("b", 8, allow_overcommit=True) is Admission.OVERCOMMIT
    assert (alone.overcommit_count, alone.progress_count) == (1, 0)
    alone.check()


def test_finish_keeps_then_release_and_release_owner_free():
    ledger = MemoryLedger(100)
    ledger.acquire("load", 30, owner="n1")
    ledger.finish("load", keep=20)
    assert ledger.held("load") == 20
    ledger.acquire("init", 5, owner="n1")
    ledger.finish("init", keep=5)
    ledger.acquire("running", 7, owner="n1")
    assert ledger.release("load") == 20
    assert ledger.release("load") == 0
    assert ledger.release_owner("n1", keep={"running"}) == 5
    assert ledger.used == 7 and ledger.held("running") == 7


def test_transfer_moves_a_reservation_to_a_new_key_and_owner_unchanged():
    ledger = MemoryLedger(100)
    ledger.acquire("load", 60, owner="net")
    ledger.finish("load", keep=40)
    assert ledger.transfer("load", "cached", owner="cache") is Admission.FIT
    assert ledger.held("load") == 0 and ledger.held("cached") == 40 and ledger.used == 40
    assert ledger.release_owner("net") == 0  # the network no longer owns it
    assert ledger.transfer("gone", "other") is None and ledger.used == 40
    ledger.acquire("x", 10)
    with pytest.raises(ScheduleError, match="already holds"):
        ledger.transfer("x", "cached")
    ledger.finish("x")
    ledger.acquire("big", 90)  # nothing runs: admitted by the progress rule, and kept so
    ledger.finish("big", keep=90)
    assert ledger.transfer("big", "big2") is Admission.PROGRESS
    ledger.check()  # above budget only by the progress reservation, wherever it moved
    assert ledger.release_owner("cache") == 40 and ledger.release("big2") == 90 and ledger.used == 0


def test_history_records_every_change_with_the_clock():
    now = [0.0]
    ledger = MemoryLedger(10, clock=lambda: now[0])
    now[0] = 1.5
    ledger.acquire("a", 4)
    now[0] = 2.0
    ledger.finish("a")
    assert [(s.time, s.used, s.running) for s in ledger.history] == [
        (0.0, 0, 0),
        (1.5, 4, 1),
        (2.0, 0, 0),
    ]


def test_bad_inputs():
    with pytest.raises(ScheduleError, match="positive"):
        MemoryLedger(0)
    ledger = MemoryLedger(10)
    ledger.acquire("a", 1)
    with pytest.raises(ScheduleError, match="already holds"):
        ledger.acquire("a", 1)
    with pytest.raises(ScheduleError, match="holds no memory"):
        ledger.finish("zzz")


def test_a_waiting_thread_wakes_on_release_without_polling():
    ledger = MemoryLedger(10)
    ledger.acquire("a", 10)
    woke = threading.Event()

    def waiter():
        if ledger.wait(lambda: ledger.fits(5), timeout=5.0):
            woke.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    assert not woke.wait(0.05)
    ledger.finish("a")
    thread.join(5.0)
    assert woke.is_set() and not thread.is_alive()
