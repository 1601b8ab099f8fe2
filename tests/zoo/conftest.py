"""Zoo tests run torch single-threaded when the machine is overloaded.

On the shared two-core test machine, when other processes already keep the cores busy,
intra-op threads mostly wait for each other: a two-thread build measured 7× slower in
wall time than a one-thread build under a load of 7. The setting is restored after each
test so other test folders are unaffected.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _threads_for_load() -> Iterator[None]:
    before = torch.get_num_threads()
    busy = hasattr(os, "getloadavg") and os.getloadavg()[0] > (os.cpu_count() or 1)
    if busy:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
