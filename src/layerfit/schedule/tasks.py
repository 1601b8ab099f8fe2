"""Tasks, dependency schemes and jobs: the vocabulary of multi-request scheduling.

A *job* is one input analysed by a set of networks (thesis §7.1: an arrival of one image
with the networks that must analyse it). Every network of a job becomes tasks
(thesis §4.1):

- ``INIT``   builds the network's structure and placeholders (once per network);
- ``LOAD``   reads one layer's parameters into memory;
- ``EXEC``   executes one layer on the output of the previous one;
- ``UNLOAD`` frees the layer's parameters.

Memory follows the *locked memory model* of thesis §4.2.4: a task reserves ``memory``
bytes while it runs; of those, ``retained`` bytes stay locked after it finishes until
one of the tasks naming it in ``releases`` finishes (a load's weights stay until its
unload; an init's structure stays until the network completes). The same record is used
by the ledger, the simulator and the CP model, so all three count memory identically.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from layerfit.backports import StrEnum

if TYPE_CHECKING:
    from layerfit.schedule.profile import NetworkProfile


class TaskKind(StrEnum):
    """What a task does; the value is the one-letter prefix used in task ids."""

    INIT = "I"
    LOAD = "L"
    EXEC = "E"
    UNLOAD = "U"


class Scheme(StrEnum):
    """How a network's tasks depend on each other (thesis §4.1.2, Figures 4.3–4.8).

    - ``partial``: ``I < L_i``, ``L_i < E_i < U_i``, ``E_i < E_{i+1}`` — loads are free to
      run ahead (MASA's graph).
    - ``linear``: partial plus ``U_i < L_{i+1}``: one layer resident at a time, the least
      memory and no overlap.
    - ``bulk``: partial plus ``L_j < E_0`` for every layer and ``E_last < U_i``: load the
      whole network, execute it, free it (how Caffe and PyTorch run a model).
    - ``deepeye``: the convolutional part is loaded in bulk before it executes while the
      fully connected part loads alongside; across the networks of one job conv loads,
      conv executions and FC loads each form one chain (DeepEye; EdgeCaffe's ConvFC
      orchestration).
    """

    PARTIAL = "partial"
    LINEAR = "linear"
    BULK = "bulk"
    DEEPEYE = "deepeye"


class Pool(StrEnum):
    """Which DeepEye pool a task belongs to: the convolutional part or the FC part."""

    CONV = "conv"
    FC = "fc"


@dataclass(frozen=True)
class NetworkPlan:
    """The scheduler's memory estimates for a whole network, shared by all its tasks.

    A policy sees a task only once it is ready; to know what a network in flight still
    needs (``masa-fair``'s safety check) it needs the layers it has not seen yet.
    ``init`` is held from the init task until the network ends; ``layers`` holds, per
    layer in execution order, ``(load memory, retained, execute memory)`` — the same
    figures as the network's load and execute tasks.
    """

    init: int
    layers: tuple[tuple[int, int, int], ...]


@dataclass(eq=False)
class Task:
    """One schedulable unit of work of one network of one job.

    Identity is the object itself (``eq=False``); ``id`` is unique within a dispatcher.
    ``memory``/``retained`` are what the scheduler *believes* (profiled estimates,
    possibly scaled for a sensitivity analysis); ``actual_memory``/``actual_retained`` are
    what the task really uses — the simulator charges those to physical memory.
    ``ready_seq`` is stamped by the dispatcher when the task becomes ready; policies use
    it as the first-come order.
    """

    id: str
    job: str
    network: str  # unique id of the network instance: "<job>/<index>.<name>"
    network_name: str
    network_index: int
    kind: TaskKind
    layer: int  # -1 for INIT
    layer_name: str
    duration: float
    memory: int = 0
    retained: int = 0
    releases: tuple[str, ...] = ()
    pool: Pool = Pool.CONV
    network_cost: float = 0.0  # total duration of the network's tasks (SNF's key)
    plan: NetworkPlan | None = field(default=None, repr=False)  # None for hand-made tasks
    job_seq: int = 0
    actual_memory: int | None = None
    actual_retained: int | None = None
    ready_seq: int = field(default=-1, compare=False)

    def __post_init__(self) -> None:
        if self.actual_memory is None:
            self.actual_memory = self.memory
        if self.actual_retained is None:
            self.actual_retained = self.retained
        if not 0 <= self.retained <= self.memory:
            raise ValueError(f"task {self.id}: retained {self.retained} not in [0, {self.memory}]")

    @property
    def frees_memory(self) -> bool:
        """Execute and unload tasks lead to memory being freed (MASA runs them first)."""
        return self.kind in (TaskKind.EXEC, TaskKind.UNLOAD)

    def __repr__(self) -> str:
        return f"Task({self.id}, {self.duration:g}s, {self.memory}B)"


@dataclass(frozen=True)
class Job:
    """One input analysed by a set of networks, arriving at ``arrival`` (seconds).

    ``deadline`` is relative to the arrival; ``input`` names the data (a path or tag) and
    is carried through untouched for the real executor.
    """

    id: str
    networks: tuple[NetworkProfile, ...]
    arrival: float = 0.0
    deadline: float | None = None
    input: str | None = None
    seq: int = 0


def task_id(network_uid: str, kind: TaskKind, layer: int) -> str:
    """The id of a task: ``<network uid>/<kind letter><layer>`` (``I`` has no layer)."""
    return (
        f"{network_uid}/{kind.value}"
        if kind is TaskKind.INIT
        else f"{network_uid}/{kind.value}{layer}"
    )
