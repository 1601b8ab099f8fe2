"""Task dependency graphs: each network of a job as init/load/execute/unload tasks.

The partial graph comes straight from the layer semantics (thesis §4.1): ``I < L_i``,
``L_i < E_i < U_i`` and ``E_i < E_{i+1}``. The other schemes add edges to it (§4.1.2,
Figures 4.6–4.8) and every graph is transitively reduced, which removes the edges the
additions made redundant without changing which orders are allowed.

Nodes are task ids; each node's ``task`` attribute is its :class:`Task`.

The reduction is computed here, on plain lists, and networkx is imported only by the
functions that return or draw a ``networkx.DiGraph``: the runtime and the server build
their graphs without it, and so do not carry its 12 MB of modules (measured RSS on
this machine) within a budget of tens of megabytes.
"""

from __future__ import annotations

import copy
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from layerfit.errors import ScheduleError
from layerfit.extras import require
from layerfit.schedule.profile import NetworkProfile
from layerfit.schedule.tasks import Job, NetworkPlan, Pool, Scheme, Task, TaskKind, task_id
from layerfit.store.outputs import save_figure

if TYPE_CHECKING:
    import networkx as nx


def network_tasks(
    profile: NetworkProfile,
    network_uid: str,
    *,
    job: str = "job",
    index: int = 0,
    job_seq: int = 0,
    estimate_factor: float = 1.0,
) -> list[Task]:
    """The tasks of one network instance, init first, then per layer load, execute, unload.

    ``estimate_factor`` scales the memory the *scheduler* is told (``memory``,
    ``retained``) while ``actual_*`` keep the profile's figures — the sensitivity
    analysis of thesis §7.6. About 95 lines on purpose: the thesis's task graph of one
    network (its edges and the memory each task takes and leaves) reads as one
    statement, in the order the tasks run.
    """
    fc_start = profile.fc_start
    cost = profile.total_time

    def est(value: int) -> int:
        return int(round(value * estimate_factor))

    init_id = task_id(network_uid, TaskKind.INIT, -1)
    layer_memory = [
        (est(layer.load_peak), min(est(layer.memory), est(layer.load_peak)), est(layer.exec_memory))
        for layer in profile.layers
    ]
    common = {
        "job": job,
        "network": network_uid,
        "network_name": profile.name,
        "network_index": index,
        "network_cost": cost,
        "plan": NetworkPlan(init=est(profile.init_memory), layers=tuple(layer_memory)),
        "job_seq": job_seq,
    }
    tasks = [
        Task(
            id=init_id,
            kind=TaskKind.INIT,
            layer=-1,
            layer_name="init",
            duration=profile.init_time,
            memory=est(profile.init_memory),
            retained=est(profile.init_memory),
            actual_memory=profile.init_memory,
            actual_retained=profile.init_memory,
            pool=Pool.CONV,
            **common,
        )
    ]
    for i, layer in enumerate(profile.layers):
        pool = Pool.FC if i >= fc_start else Pool.CONV
        load_id = task_id(network_uid, TaskKind.LOAD, i)
        peak = layer.load_peak
        load_memory, retained, exec_memory = layer_memory[i]
        tasks.append(
            Task(
                id=load_id,
                kind=TaskKind.LOAD,
                layer=i,
                layer_name=layer.name,
                duration=layer.load_time,
                memory=load_memory,
                retained=retained,
                actual_memory=peak,
                actual_retained=layer.memory,
                pool=pool,
                **common,
            )
        )
        tasks.append(
            Task(
                id=task_id(network_uid, TaskKind.EXEC, i),
                kind=TaskKind.EXEC,
                layer=i,
                layer_name=layer.name,
                duration=layer.exec_time,
                memory=exec_memory,
                actual_memory=layer.exec_memory,
                pool=pool,
                **common,
            )
        )
        tasks.append(
            Task(
                id=task_id(network_uid, TaskKind.UNLOAD, i),
                kind=TaskKind.UNLOAD,
                layer=i,
                layer_name=layer.name,
                duration=profile.unload_time,
                releases=(load_id,),
                pool=pool,
                **common,
            )
        )
    return tasks


def _edges(profile: NetworkProfile, uid: str, scheme: Scheme) -> list[tuple[str, str]]:
    n = len(profile.layers)

    def t(kind: TaskKind, layer: int = -1) -> str:
        return task_id(uid, kind, layer)

    L, E, U, INIT = TaskKind.LOAD, TaskKind.EXEC, TaskKind.UNLOAD, TaskKind.INIT
    edges = []
    for i in range(n):  # the partial graph (Figure 4.3)
        edges += [(t(INIT), t(L, i)), (t(L, i), t(E, i)), (t(E, i), t(U, i))]
        if i + 1 < n:
            edges.append((t(E, i), t(E, i + 1)))
    if scheme is Scheme.LINEAR:  # Figure 4.6: the next load waits for this layer's unload
        edges += [(t(U, i), t(L, i + 1)) for i in range(n - 1)]
    elif scheme is Scheme.BULK:  # Figure 4.7: load everything, execute, free everything
        edges += [(t(L, j), t(E, 0)) for j in range(n)]
        edges += [(t(E, n - 1), t(U, i)) for i in range(n)]
    elif scheme is Scheme.DEEPEYE:  # Figure 4.8: conv part loaded in bulk before it runs
        split = profile.fc_start
        if split > 0:
            edges += [(t(L, j), t(E, 0)) for j in range(split)]
    return edges


def _deepeye_links(
    profiles: Sequence[NetworkProfile], uids: Sequence[str]
) -> list[tuple[str, str]]:
    """Inter-network chains of one job: conv loads, conv executions and fc loads each in order.

    The first conv execution of the job waits for the last conv load of the job, as
    EdgeCaffe's DeepEye orchestration does: all conv layers of the job are loaded first.
    """
    conv_loads: list[str] = []
    conv_exec_first: list[str] = []
    conv_exec_last: list[str] = []
    fc_loads: list[str] = []
    for profile, uid in zip(profiles, uids, strict=True):
        split = profile.fc_start
        conv_loads += [task_id(uid, TaskKind.LOAD, j) for j in range(split)]
        if split > 0:
            conv_exec_first.append(task_id(uid, TaskKind.EXEC, 0))
            conv_exec_last.append(task_id(uid, TaskKind.EXEC, split - 1))
        fc_loads += [task_id(uid, TaskKind.LOAD, j) for j in range(split, len(profile.layers))]
    edges = list(zip(conv_loads, conv_loads[1:], strict=False))
    edges += list(zip(fc_loads, fc_loads[1:], strict=False))
    edges += list(zip(conv_exec_last, conv_exec_first[1:], strict=False))
    if conv_loads and conv_exec_first:
        edges.append((conv_loads[-1], conv_exec_first[0]))
    return edges


def build_graph(
    profiles: Sequence[NetworkProfile],
    scheme: Scheme | str = Scheme.PARTIAL,
    *,
    job: str = "job",
    job_seq: int = 0,
    estimate_factor: float = 1.0,
) -> nx.DiGraph:
    """The transitively reduced task graph of ``profiles`` analysed together as one job."""
    require("networkx")  # the schedule extra
    import networkx as nx

    tasks, successors = _reduced_graph(
        profiles, scheme, job=job, job_seq=job_seq, estimate_factor=estimate_factor
    )
    graph = nx.DiGraph()
    for task in tasks:
        graph.add_node(task.id, task=task)
    graph.add_edges_from((task.id, tasks[j].id) for task, succ in zip(tasks, successors, strict=True) for j in succ)
    return graph


def _reduced_graph(
    profiles: Sequence[NetworkProfile],
    scheme: Scheme | str,
    *,
    job: str,
    job_seq: int,
    estimate_factor: float,
) -> tuple[list[Task], list[tuple[int, ...]]]:
    """The tasks of ``profiles`` as one job, in order, and each task's successors in the
    transitively reduced graph (indices into the tasks, ascending, so successors and FIFO
    tie-breaks are reproducible)."""
    scheme = parse_scheme(scheme)
    tasks: list[Task] = []
    edges: list[tuple[str, str]] = []
    uids = [f"{job}/{index}.{profile.name}" for index, profile in enumerate(profiles)]
    for index, (profile, uid) in enumerate(zip(profiles, uids, strict=True)):
        tasks += network_tasks(
            profile, uid, job=job, index=index, job_seq=job_seq, estimate_factor=estimate_factor
        )
        edges += _edges(profile, uid, scheme)
    if scheme is Scheme.DEEPEYE and len(profiles) > 1:
        edges += _deepeye_links(profiles, uids)
    position = {task.id: index for index, task in enumerate(tasks)}
    successors: list[set[int]] = [set() for _ in tasks]
    for a, b in edges:
        successors[position[a]].add(position[b])
    order = _topological_order(successors)
    if order is None:  # cannot happen for the schemes above
        raise ScheduleError(f"the {scheme.value} graph of job {job} has a cycle")
    return tasks, transitive_reduction(successors, order)


def _topological_order(successors: Sequence[set[int]]) -> list[int] | None:
    """The nodes in an order where every edge points forward, or ``None`` for a cycle."""
    indegree = [0] * len(successors)
    for succ in successors:
        for j in succ:
            indegree[j] += 1
    ready = [i for i, d in enumerate(indegree) if d == 0]
    order: list[int] = []
    while ready:
        i = ready.pop()
        order.append(i)
        for j in successors[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append(j)
    return order if len(order) == len(successors) else None


def transitive_reduction(successors: Sequence[set[int]], order: Sequence[int]) -> list[tuple[int, ...]]:
    """The successors that remain once every edge implied by a longer path is removed
    (``order``: a topological order of the DAG). Each node's set of descendants is a bit
    set built from the back of ``order``; an edge ``u → v`` is implied exactly when ``v``
    descends from another successor of ``u``."""
    below = [0] * len(successors)  # bit j of below[i]: j is reachable from i by one edge or more
    reduced: list[tuple[int, ...]] = [()] * len(successors)
    for i in reversed(order):
        implied = 0
        for j in successors[i]:
            implied |= below[j]
        reduced[i] = tuple(sorted(j for j in successors[i] if not implied >> j & 1))
        reach = implied
        for j in successors[i]:
            reach |= 1 << j
        below[i] = reach
    return reduced


def build_job_graph(job: Job, scheme: Scheme | str, estimate_factor: float = 1.0) -> nx.DiGraph:
    """The task graph of a :class:`Job` under ``scheme``."""
    return build_graph(
        job.networks, scheme, job=job.id, job_seq=job.seq, estimate_factor=estimate_factor
    )


_TEMPLATE = "\x00template"


@dataclass
class TaskGraph:
    """A job's task graph in plain lists, for the dispatcher's inner loop.

    ``tasks[i]``'s successors are ``successors[i]`` (indices); ``indegree[i]`` counts its
    predecessors. :meth:`to_networkx` gives the same graph as :func:`build_job_graph`.
    """

    tasks: list[Task]
    successors: list[tuple[int, ...]]
    indegree: list[int]
    index: dict[str, int]

    def to_networkx(self) -> nx.DiGraph:
        require("networkx")  # the schedule extra
        import networkx as nx

        graph = nx.DiGraph()
        for task in self.tasks:
            graph.add_node(task.id, task=task)
        graph.add_edges_from(
            (self.tasks[i].id, self.tasks[j].id)
            for i, succ in enumerate(self.successors)
            for j in succ
        )
        return graph


class GraphCache:
    """Reduced graphs by composition, so a stream of similar jobs reduces each shape once.

    Transitive reduction costs O(V·E); a workload repeats a few compositions many times.
    The cache belongs to one dispatcher (no global state) and holds the profiles it keys
    on weakly: an entry goes when any of its profiles is collected (before that profile's
    id can be reused). A server makes a new profile each time it loads a model, and each
    time a request's shape or batch grows its activations, so entries that kept their
    profiles alive piled up for the process's life: a load/unload loop grew a server's
    RSS by about 0.7 MB a cycle (two zoo models) until the kernel killed it (#52 item 4).
    """

    def __init__(self, scheme: Scheme | str, estimate_factor: float = 1.0) -> None:
        check_estimate_factor(estimate_factor)
        self.scheme = parse_scheme(scheme)
        self.estimate_factor = estimate_factor
        self._templates: dict[tuple[int, ...], tuple[tuple[weakref.ref[NetworkProfile], ...], TaskGraph]] = {}

    def _template(self, job: Job) -> TaskGraph:
        key = tuple(id(p) for p in job.networks)
        entry = self._templates.get(key)
        if entry is None:
            tasks, successors = _reduced_graph(
                job.networks, self.scheme, job=_TEMPLATE, job_seq=0, estimate_factor=self.estimate_factor
            )
            indegree = [0] * len(tasks)
            for succ in successors:
                for j in succ:
                    indegree[j] += 1
            template = TaskGraph(
                tasks=tasks,
                successors=successors,
                indegree=indegree,
                index={t.id: i for i, t in enumerate(tasks)},
            )
            entry = self._templates[key] = (_dropped_with(self, key, job.networks), template)
        return entry[1]

    def job_graph(self, job: Job) -> TaskGraph:
        """``job``'s tasks (fresh objects, ids under ``job.id``) and dependencies."""
        template = self._template(job)
        cut, prefix = len(_TEMPLATE) + 1, job.id + "/"
        tasks = []
        for task in template.tasks:
            fresh = copy.copy(task)  # fields are immutable values; no __post_init__ needed
            fresh.id = prefix + task.id[cut:]
            fresh.job = job.id
            fresh.network = prefix + task.network[cut:]
            fresh.releases = tuple(prefix + r[cut:] for r in task.releases)
            fresh.job_seq = job.seq
            tasks.append(fresh)
        return TaskGraph(
            tasks=tasks,
            successors=template.successors,
            indegree=template.indegree,
            index={t.id: i for i, t in enumerate(tasks)},
        )


def _dropped_with(
    cache: GraphCache, key: tuple[int, ...], profiles: Sequence[NetworkProfile]
) -> tuple[weakref.ref[NetworkProfile], ...]:
    """Weak references to ``profiles`` whose callbacks drop ``cache``'s entry ``key`` when
    any of them is collected. The callback runs while the profile is freed, before its id
    can be reused, so a key always names live profiles; it holds the cache weakly too, so
    an entry does not keep its dispatcher alive through a cycle."""
    owner = weakref.ref(cache)

    def drop(_: weakref.ref[NetworkProfile]) -> None:
        live = owner()
        if live is not None:
            live._templates.pop(key, None)

    return tuple(weakref.ref(p, drop) for p in profiles)


def check_estimate_factor(factor: float, name: str = "estimate_factor") -> float:
    """``factor`` if it is a finite number > 0; memory estimates are rounded to whole
    bytes, which NaN or infinity cannot be."""
    if (
        isinstance(factor, bool)
        or not isinstance(factor, int | float)
        or not math.isfinite(factor)
        or factor <= 0
    ):
        raise ScheduleError(f"{name} must be a finite number > 0, got {factor!r}")
    return float(factor)


def parse_scheme(scheme: Scheme | str) -> Scheme:
    try:
        return Scheme(scheme)
    except ValueError:
        names = ", ".join(s.value for s in Scheme)
        raise ScheduleError(f"unknown scheme {scheme!r}; choose one of: {names}") from None


def tasks_of(graph: nx.DiGraph) -> list[Task]:
    """The graph's tasks in insertion order."""
    return [data["task"] for _, data in graph.nodes(data=True)]


def count_orders(graph: nx.DiGraph, limit: int = 10**6) -> int:
    """How many topological orders the graph has, counting up to ``limit`` (|T| in §4.1.2)."""
    require("networkx")  # the schedule extra
    import networkx as nx

    count = 0
    for _ in nx.all_topological_sorts(graph):
        count += 1
        if count >= limit:
            break
    return count


_COLOURS = {
    TaskKind.INIT: "#9e9e9e",
    TaskKind.LOAD: "#4e79a7",
    TaskKind.EXEC: "#f28e2b",
    TaskKind.UNLOAD: "#76b7b2",
}


def draw_graph(graph: nx.DiGraph, path: str | Path, title: str | None = None) -> Path:
    """Draw the graph left to right by dependency depth (Appendix B) and save it as an image."""
    require("matplotlib")  # the plot extra
    import matplotlib
    import networkx as nx

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layered = graph.copy()
    for depth, nodes in enumerate(nx.topological_generations(layered)):
        for node in nodes:
            layered.nodes[node]["depth"] = depth
    positions = nx.multipartite_layout(layered, subset_key="depth")
    tasks = {node: data["task"] for node, data in graph.nodes(data=True)}
    labels = {node: _short_label(task) for node, task in tasks.items()}
    depth_count = 1 + max(nx.get_node_attributes(layered, "depth").values(), default=0)
    width = max(6.0, 0.9 * depth_count)
    height = max(4.0, 0.35 * max(len(g) for g in nx.topological_generations(graph)))
    fig, ax = plt.subplots(figsize=(min(width, 60), min(height, 60)))
    nx.draw_networkx_edges(
        graph, positions, ax=ax, arrows=True, arrowsize=8, width=0.6, edge_color="#555555"
    )
    nx.draw_networkx_nodes(
        graph,
        positions,
        ax=ax,
        node_size=380,
        node_color=[_COLOURS[tasks[n].kind] for n in graph.nodes],
    )
    nx.draw_networkx_labels(graph, positions, labels=labels, ax=ax, font_size=6)
    ax.set_title(title or "task graph")
    ax.axis("off")
    return save_figure(fig, path, error=ScheduleError, close=True, dpi=150, bbox_inches="tight")


def _short_label(task: Task) -> str:
    prefix = f"{task.network_index}." if task.network_index else ""
    return prefix + (
        task.kind.value if task.kind is TaskKind.INIT else f"{task.kind.value}{task.layer}"
    )


def edges_by_label(graph: nx.DiGraph) -> set[tuple[str, str]]:
    """Edges as short labels (``("L0", "E0")``): handy for tests and printing."""
    tasks = {node: data["task"] for node, data in graph.nodes(data=True)}
    return {(_short_label(tasks[a]), _short_label(tasks[b])) for a, b in graph.edges}
