"""Multi-request, memory-aware scheduling (MASA / EdgeCaffe; DESIGN.md layer 7).

A *job* is one input analysed by several networks. Each network becomes init, load,
execute and unload tasks with dependencies (:mod:`~layerfit.schedule.graph`); a policy
(:mod:`~layerfit.schedule.policies`) picks the next task for each idle worker; a
:class:`MemoryLedger` keeps the reserved memory within a budget; the
:class:`Dispatcher` ties them together for the discrete-event simulator
(:func:`simulate`) and the real executor alike. :func:`solve_optimal` gives the exact
optimum of small instances (CP-SAT).

Names are loaded on first use so that ``import layerfit.cli.schedule`` stays cheap.
"""

from __future__ import annotations

from layerfit.lazy import lazy_exports

_EXPORTS = {
    "Admission": "ledger",
    "Arrival": "workload",
    "Assignment": "dispatch",
    "ContentionModel": "contention",
    "Dispatcher": "dispatch",
    "InferenceJob": "runtime",
    "Job": "tasks",
    "JobResult": "report",
    "JobState": "dispatch",
    "JobStatus": "dispatch",
    "LayerProfile": "profile",
    "MemoryLedger": "ledger",
    "ModelInfo": "repository",
    "NetworkProfile": "profile",
    "OptimalSchedule": "optimal",
    "POLICIES": "policies",
    "PagingModel": "penalty",
    "Policy": "policies",
    "ProfileSet": "profile",
    "RunReport": "report",
    "Runtime": "runtime",
    "RuntimeConfig": "runtime_config",
    "Scheme": "tasks",
    "Task": "tasks",
    "TaskKind": "tasks",
    "Workload": "workload",
    "batch_workload": "generate",
    "build_graph": "graph",
    "build_job_graph": "graph",
    "draw_graph": "graph",
    "load_contention": "contention",
    "load_profiles": "profile",
    "load_workload": "workload",
    "make_policy": "policies",
    "measure_contention": "profiler",
    "parse_workload": "workload",
    "plot_run": "plot",
    "policy_names": "policies",
    "profile_from_graph": "profile",
    "response_time_bound": "bounds",
    "simulate": "simulator",
    "solve_jobs": "optimal",
    "solve_optimal": "optimal",
    "stochastic_workload": "generate",
    "thesis_profiles": "thesis",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
