"""A fixture running a test with one PyTorch intra-op thread.

On a small machine shared with other processes, several intra-op threads per operator
stall each other; one thread keeps these tests fast. The previous setting is restored.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
