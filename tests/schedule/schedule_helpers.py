"""Small builders shared by the schedule tests."""

from __future__ import annotations

from collections.abc import Sequence

from layerfit.schedule.profile import LayerProfile, NetworkProfile
from layerfit.schedule.tasks import NetworkPlan, Pool, Task, TaskKind


def net(
    name: str,
    weights: Sequence[int],
    load: Sequence[float] | None = None,
    execs: Sequence[float] | None = None,
    exec_memory: Sequence[int] | None = None,
    kinds: Sequence[str] | None = None,
    init_time: float = 0.0,
    init_memory: int = 0,
    load_memory: Sequence[int | None] | None = None,
) -> NetworkProfile:
    """A network whose layer i has ``weights[i]`` bytes (load time = weights unless given);
    ``load_memory[i]`` is its load's peak (the weights when ``None``)."""
    n = len(weights)
    load = load if load is not None else [float(w) for w in weights]
    execs = execs if execs is not None else [1.0] * n
    exec_memory = exec_memory if exec_memory is not None else [0] * n
    kinds = kinds if kinds is not None else ["conv"] * n
    load_memory = load_memory if load_memory is not None else [None] * n
    return NetworkProfile(
        name,
        tuple(
            LayerProfile(
                f"l{i}",
                kinds[i],
                load[i],
                execs[i],
                weights[i],
                load_memory=load_memory[i],
                exec_memory=exec_memory[i],
            )
            for i in range(n)
        ),
        init_time=init_time,
        init_memory=init_memory,
    )


def task(
    name: str,
    kind: TaskKind = TaskKind.LOAD,
    memory: int = 0,
    duration: float = 1.0,
    network: str = "n",
    job: str = "j",
    seq: int = 0,
    pool: Pool = Pool.CONV,
    cost: float = 0.0,
    job_seq: int = 0,
    layer: int = 0,
) -> Task:
    """A free-standing task for policy unit tests; ``ready_seq`` is ``seq``.

    Its network plan is empty (nothing known beyond the task itself), so ``masa-fair``
    checks nothing but the memory gate; tests of its safety check use tasks built by
    :func:`layerfit.schedule.graph.network_tasks`."""
    t = Task(
        id=name,
        job=job,
        network=network,
        network_name=network,
        network_index=0,
        kind=kind,
        layer=layer,
        layer_name=name,
        duration=duration,
        memory=memory,
        retained=memory if kind is TaskKind.LOAD else 0,
        pool=pool,
        network_cost=cost,
        job_seq=job_seq,
        plan=NetworkPlan(init=0, layers=()),
    )
    t.ready_seq = seq
    return t
