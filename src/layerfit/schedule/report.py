"""What a run reports: per-job response times, deadlines, memory over time, utilisation.

The same record serves the simulator and (later) the real executor, so their results
can be compared field by field. A figure that does not exist (the mean response of a
run in which no job completed) is ``None``, so the JSON stays strict (no ``NaN``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from layerfit.errors import JobRejectedError
from layerfit.schedule.dispatch import JobState, JobStatus
from layerfit.schedule.ledger import MemorySample
from layerfit.sizes import format_bytes

if TYPE_CHECKING:
    from layerfit.schedule.ledger import Admission
    from layerfit.schedule.tasks import Task


@dataclass(frozen=True)
class TaskRecord:
    """One task's run: which worker, when, how much slower than profiled, how admitted."""

    task: str
    job: str
    network: str
    kind: str
    layer: int
    worker: int
    start: float
    end: float
    slowdown: float
    admission: str
    memory: int

    @classmethod
    def of(
        cls,
        task: Task,
        worker: int,
        start: float,
        end: float,
        admission: Admission,
        slowdown: float = 1.0,
    ) -> TaskRecord:
        """The record of ``task`` run by ``worker`` from ``start`` to ``end``, admitted
        as ``admission``; ``slowdown`` is the simulator's paging factor (a real run is
        not slowed by a model, 1). The one way the simulator and the real executor
        record a task, so that their reports compare field by field."""
        return cls(
            task.id,
            task.job,
            task.network,
            task.kind.name,
            task.layer,
            worker,
            start,
            end,
            slowdown,
            admission.value,
            task.memory,
        )


@dataclass(frozen=True)
class JobResult:
    """One job's outcome."""

    id: str
    networks: tuple[str, ...]
    arrival: float
    started: float | None
    finished: float | None
    response: float | None
    deadline: float | None
    missed_deadline: bool
    status: str
    error: str | None = None
    min_budget: int | None = None  # rejected for its size: the budget that would serve it

    @classmethod
    def from_state(cls, state: JobState) -> JobResult:
        return cls(
            id=state.job.id,
            networks=tuple(p.name for p in state.job.networks),
            arrival=state.job.arrival,
            started=state.started,
            finished=state.finished,
            response=state.response_time if state.status is JobStatus.DONE else None,
            deadline=state.job.deadline,
            missed_deadline=state.missed_deadline,
            status=state.status.value,
            error=None if state.error is None else str(state.error),
            min_budget=(
                state.error.min_budget if isinstance(state.error, JobRejectedError) else None
            ),
        )


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), ``q`` in [0, 100]."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class RunReport:
    """The result of running a workload under one policy, budget and worker count."""

    policy: str
    workers: int
    budget: int
    physical_memory: int
    executor: str  # "simulator" or "real"
    jobs: list[JobResult]
    tasks: list[TaskRecord] = field(default_factory=list)
    memory: list[tuple[float, int]] = field(default_factory=list)  # ledger (estimates)
    resident: list[tuple[float, int]] = field(default_factory=list)  # actual bytes
    busy_time: list[float] = field(default_factory=list)
    progress_count: int = 0
    overcommit_count: int = 0
    peak_memory: int = 0
    peak_resident: int = 0
    estimate_factor: float = 1.0
    paging: dict[str, Any] | None = None
    contention: dict[str, Any] | None = None  # simulator: how concurrent tasks shared the machine
    workload: str = ""
    ledger_history: list[MemorySample] = field(default_factory=list, repr=False)

    @property
    def budget_violations(self) -> int:
        """Ledger samples above budget *not* explained by the progress rule or an
        allowed over-commit; always 0 unless the scheduling core is broken."""
        return sum(
            s.used - s.progress_held - s.overcommit_held > self.budget for s in self.ledger_history
        )

    @property
    def completed(self) -> list[JobResult]:
        return [j for j in self.jobs if j.status == JobStatus.DONE.value]

    @property
    def responses(self) -> list[float]:
        return [j.response for j in self.completed if j.response is not None]

    @property
    def makespan(self) -> float:
        finished = [j.finished for j in self.jobs if j.finished is not None]
        if not finished:
            return 0.0
        return max(finished) - min(j.arrival for j in self.jobs)

    @property
    def utilisation(self) -> list[float]:
        span = self.makespan
        return [busy / span if span > 0 else 0.0 for busy in self.busy_time]

    def response_stats(self) -> dict[str, float | None]:
        """Mean, median, 95th percentile and maximum response time; all ``None`` when no
        job completed (there is nothing to average)."""
        values = self.responses
        if not values:
            return dict.fromkeys(("mean", "p50", "p95", "max"))
        return {
            "mean": sum(values) / len(values),
            "p50": percentile(values, 50),
            "p95": percentile(values, 95),
            "max": max(values),
        }

    def unserved(self) -> str | None:
        """Why no job completed, with the budget the workload needs if the budget was the
        reason; ``None`` when at least one job completed (or there were none)."""
        if not self.jobs or self.completed:
            return None
        rejected = [j.min_budget for j in self.jobs if j.min_budget is not None]
        counts = Counter(j.status for j in self.jobs)
        message = f"no job was served ({', '.join(f'{n} {s}' for s, n in counts.items())})"
        if len(rejected) == len(self.jobs):
            need = max(rejected)
            message += (
                f": the budget of {format_bytes(self.budget)} is below every job's largest "
                f"task; the workload needs a budget of at least {format_bytes(need)} "
                f"({need} bytes)"
            )
        return message

    def summary(self) -> dict[str, Any]:
        """The headline numbers, JSON-ready."""
        counts: dict[str, int] = {}
        for job in self.jobs:
            counts[job.status] = counts.get(job.status, 0) + 1
        return {
            "workload": self.workload,
            "executor": self.executor,
            "policy": self.policy,
            "workers": self.workers,
            "budget_bytes": self.budget,
            "physical_memory_bytes": self.physical_memory,
            "estimate_factor": self.estimate_factor,
            "jobs": len(self.jobs),
            "jobs_by_status": counts,
            "response_time_s": self.response_stats(),
            "deadline_misses": sum(j.missed_deadline for j in self.jobs if j.deadline is not None),
            "makespan_s": self.makespan,
            "worker_utilisation": self.utilisation,
            "peak_ledger_bytes": self.peak_memory,
            "peak_resident_bytes": self.peak_resident,
            "progress_rule_fired": self.progress_count,
            "overcommits": self.overcommit_count,
            "budget_violations": self.budget_violations,
            "tasks": len(self.tasks),
            "slowed_tasks": sum(t.slowdown > 1.0 for t in self.tasks),
        }

    def to_dict(self, *, trace: bool = False) -> dict[str, Any]:
        """Summary, per-job results and memory over time; with ``trace`` every task too."""
        data = self.summary()
        data["paging_model"] = self.paging
        data["contention_model"] = self.contention
        data["job_results"] = [asdict(j) for j in self.jobs]
        data["memory_over_time"] = [[t, used] for t, used in _thin(self.memory)]
        data["resident_over_time"] = [[t, used] for t, used in _thin(self.resident)]
        if trace:
            data["task_trace"] = [asdict(t) for t in self.tasks]
        return data


def _thin(series: Sequence[tuple[float, int]], limit: int = 2000) -> list[tuple[float, int]]:
    """At most ``limit`` points, keeping the last value of every instant and the peaks."""
    collapsed: list[tuple[float, int]] = []
    for t, used in series:
        if collapsed and collapsed[-1][0] == t:
            collapsed[-1] = (t, used)
        else:
            collapsed.append((t, used))
    if len(collapsed) <= limit:
        return collapsed
    step = len(collapsed) / limit
    buckets = [collapsed[int(i * step) : int((i + 1) * step)] for i in range(limit)]
    return [max(bucket, key=lambda p: p[1]) for bucket in buckets if bucket]
