"""Execute one prepared model under a weight budget: ``layerfit.load(DIR, budget=...)``."""

from layerfit.engine.engine import Engine, MemoryPlan, load
from layerfit.engine.measure import flat_outputs, measure, output_digest
from layerfit.engine.policies import POLICIES, get_policy

__all__ = ["POLICIES", "Engine", "MemoryPlan", "flat_outputs", "get_policy", "load", "measure", "output_digest"]
