"""The real runtime: prepared models from a repository, N worker threads, one memory budget.

Requests come in through the front end (:mod:`.frontend`, inputs checked by :mod:`.inputs`),
the dispatcher (:mod:`layerfit.schedule.dispatch`) turns them into tasks under the shared
policy and ledger (:mod:`.core`), the workers (:mod:`.workers`) run each network's units
through the engine (:mod:`.network_run`), and loaded weights stay in the spare budget
(:mod:`.weight_cache`). :class:`Runtime` (:mod:`.executor`) is the facade over those rooms;
:class:`RuntimeConfig` (:mod:`.config`) its typed settings; the repository (:mod:`.repository`)
and profiler (:mod:`.profiler`) say which models exist and what each costs.

Names are loaded on first use: importing :mod:`.config` must not import PyTorch.
"""

from __future__ import annotations

from layerfit.lazy import lazy_exports

_EXPORTS = {
    "InferenceJob": "executor",
    "Job": "executor",
    "ModelInfo": "repository",
    "ModelRepository": "repository",
    "Runtime": "executor",
    "RuntimeConfig": "config",
    "measure_contention": "profiler",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
