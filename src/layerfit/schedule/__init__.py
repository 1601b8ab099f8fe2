"""Multi-request, memory-aware scheduling (MASA / EdgeCaffe; the map: ``docs/architecture.md``).

A *job* is one input analysed by several networks. Each network becomes init, load,
execute and unload tasks with dependencies (:mod:`~layerfit.schedule.graph`); a policy
(:mod:`~layerfit.schedule.policies`) picks the next task for each idle worker; a
:class:`MemoryLedger` keeps the reserved memory within a budget; the
:class:`Dispatcher` ties them together for the discrete-event simulator
(:func:`simulate`) and the real executor alike. :func:`solve_optimal` gives the exact
optimum of small instances (CP-SAT).

The package has three rooms above a shared core. The core, at this level: tasks and
their graphs (:mod:`.tasks`, :mod:`.graph`), network profiles (:mod:`.profile`), the
dispatcher (:mod:`.dispatch`), the ledger (:mod:`.ledger`), run reports and their
pictures (:mod:`.report`, :mod:`.plot`), the contention model (:mod:`.contention`), the
command files (:mod:`.files`) and the policies (:mod:`.policies`). Above it:
:mod:`.runtime` (the real executor), :mod:`.decoding` (language models' decode loop) and
:mod:`.experiments` (the thesis's simulator, optimum, bounds and workloads).

Names are loaded on first use so that ``import layerfit.cli.schedule`` stays cheap.
"""

from __future__ import annotations

from layerfit.lazy import lazy_exports

_EXPORTS = {
    "Admission": "ledger",
    "Arrival": "experiments.workload",
    "Assignment": "dispatch",
    "ContentionModel": "contention",
    "Dispatcher": "dispatch",
    "InferenceJob": "runtime.executor",
    "Job": "tasks",
    "JobResult": "report",
    "JobState": "dispatch",
    "JobStatus": "dispatch",
    "LayerProfile": "profile",
    "MemoryLedger": "ledger",
    "ModelInfo": "runtime.repository",
    "NetworkProfile": "profile",
    "OptimalSchedule": "experiments.optimal",
    "POLICIES": "policies",
    "PagingModel": "experiments.penalty",
    "Policy": "policies",
    "ProfileSet": "profile",
    "RunReport": "report",
    "Runtime": "runtime.executor",
    "RuntimeConfig": "runtime.config",
    "Scheme": "tasks",
    "Task": "tasks",
    "TaskKind": "tasks",
    "Workload": "experiments.workload",
    "batch_workload": "experiments.workload_generators",
    "build_graph": "graph",
    "build_job_graph": "graph",
    "draw_graph": "graph",
    "load_contention": "contention",
    "load_profiles": "profile",
    "load_workload": "experiments.workload",
    "make_policy": "policies",
    "measure_contention": "runtime.profiler",
    "parse_workload": "experiments.workload",
    "plot_run": "plot",
    "policy_names": "policies",
    "profile_from_graph": "profile",
    "response_time_bound": "experiments.bounds",
    "simulate": "experiments.simulator",
    "solve_jobs": "experiments.optimal",
    "solve_optimal": "experiments.optimal",
    "stochastic_workload": "experiments.workload_generators",
    "thesis_profiles": "experiments.thesis",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
