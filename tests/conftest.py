"""Shared test setup: tests/ on sys.path so `tinymodels:...` factories import, and trusted."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
# The test factories (tests/tinymodels.py) are trusted to rebuild the models they prepare,
# in this process and in the CLI and server processes the tests start; the trust tests
# remove this to see the refusal.
os.environ["LAYERFIT_TRUST_FACTORY"] = "tinymodels,test_activation_arena"
