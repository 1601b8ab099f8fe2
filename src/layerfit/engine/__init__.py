"""Execute one prepared model under a weight budget: ``layerfit.load(DIR, budget=...)``.

Names load on first use (:mod:`layerfit.lazy`), so that importing a light submodule
(``layerfit.engine.openmp``) does not import PyTorch.
"""

from __future__ import annotations

from layerfit.lazy import lazy_exports

_EXPORTS = {
    "Engine": "engine",
    "EngineConfig": "config",
    "EnginePlan": "plan",
    "MemoryPlan": "plan",
    "load": "engine",
    "flat_outputs": "measurement",
    "measure": "measurement",
    "output_digest": "measurement",
    "PassCount": "generation",
    "POLICIES": "policies",
    "get_policy": "policies",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
