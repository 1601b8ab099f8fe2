"""MASA that avoids memory deadlock: Algorithm 1 with a safety check (Banker's).

Algorithm 1 starts the smallest memory-taking task that fits. On the partial graph a
network's loads may run far ahead of its executions, so under load with a tight budget
the small loads of several networks fill memory while each of those networks waits for
one large load (AlexNet's 151 MB fc6) that no longer fits: a deadlock that only the
progress rule breaks, by running a task alone over the budget. Each firing
over-commits memory, which pages, which slows every task, which lets more requests
pile up. In the simulator (all-random at traffic intensity 1.2, a quarter of the bulk
peaks, thesis paging model) MASA fired the rule 2,137 times and its mean response
reached 145 s, against 0.7 s for Bulk.

``masa-fair`` (not in the thesis; ``masa`` stays the thesis's algorithm) keeps
Algorithm 1's order — execute and unload before load, ascending memory — but starts a
memory-taking task only if the state after it is *safe*: there is an order in which
every network in flight can finish, one after the other, each giving back what it holds
when it finishes (the Banker's algorithm; a new network claims its largest task). A
network runs its layers in order and unloads each after executing it, so when it
reaches a pending load it still holds only the loads of *later* layers: its claim is
the most any pending load needs beyond the loads it holds of earlier layers. (Counting
every held load as kept until the network ends made a network refuse to load its own
large layer before a smaller later one, and only the progress rule moved it on: EmotionNet
alone at 377 MB in ``bench/masa.py``.) When no task is safe and nothing runs, the oldest
job's task runs (the progress rule, first come first served instead of smallest first).
The safety check costs concurrency where one task nearly fills the budget (mixed-3 in
``bench/masa.py``). ``masa-fcfs`` avoids the deadlock in practice by order alone (arrival
order, as EdgeCaffe's code has it) without holding back a task that fits. Known gap: the
claim counts loads, not what the network's executions need beside them, nor networks
whose loads are not ready yet; with the thesis's profiles (13-50 MB of scratch per
execution) the progress rule still fires under heavy traffic at 1 GB.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable

from layerfit.schedule.policies.base import fits
from layerfit.schedule.policies.masa import Masa
from layerfit.schedule.tasks import Task, TaskKind


class MasaFair(Masa):
    """MASA whose memory-taking tasks must leave the networks in flight a safe state."""

    name = "masa-fair"

    def __init__(self, *, gated: bool = True) -> None:
        super().__init__(gated=gated)
        self._held: dict[str, dict[int, int]] = defaultdict(dict)  # network -> layer -> retained bytes
        self._retained: dict[str, tuple[str, str, int]] = {}  # load id -> (network, job, layer)
        self.unsafe_skips = 0  # tasks that fitted but were held back as unsafe

    # --- bookkeeping of what each network holds -------------------------------------

    def _take(self, task: Task) -> Task:
        task = super()._take(task)
        if task.kind is TaskKind.LOAD and task.retained:
            self._held[task.network][task.layer] = task.retained
            self._retained[task.id] = (task.network, task.job, task.layer)
        return task

    def complete(self, task: Task) -> None:
        super().complete(task)
        for key in task.releases:
            self._forget(key)

    def discard(self, job: Hashable) -> list[Task]:
        for key in [k for k, (_, owner, _) in self._retained.items() if owner == job]:
            self._forget(key)
        return super().discard(job)

    def _forget(self, key: str) -> None:
        """Load ``key``'s weights are gone: its network holds that much less."""
        entry = self._retained.pop(key, None)
        if entry is not None:
            network, _, layer = entry
            self._held[network].pop(layer, None)
            if not self._held[network]:
                del self._held[network]

    # --- choice ---------------------------------------------------------------------

    def next(self, worker: int, free_memory: int) -> Task | None:
        task = self._frees.first()
        if task is not None and fits(task, free_memory):
            return self._take(task)
        claims: dict[str, dict[int, int]] = defaultdict(dict)  # network -> layer -> ready load bytes
        for t in self._takes:
            if t.kind is TaskKind.LOAD:
                claims[t.network][t.layer] = t.memory
        for candidate in self._takes:  # ascending memory: stop at the first that does not fit
            if not fits(candidate, free_memory):
                break
            if self._safe(candidate, free_memory, claims):
                return self._take(candidate)
            self.unsafe_skips += 1
        if self.running == 0:  # progress rule: the oldest job's task goes first
            task = self._frees.first()
            if task is None:
                task = min(self._takes, key=lambda t: (t.job_seq, t.memory, t.ready_seq), default=None)
            if task is not None:
                return self._take(task)
        return None

    def _safe(self, candidate: Task, free_memory: int, claims: dict[str, dict[int, int]]) -> bool:
        """After ``candidate`` starts, can every network in flight still finish?"""
        free = free_memory - candidate.memory
        pending = {net: dict(loads) for net, loads in claims.items()}
        held = {net: dict(layers) for net, layers in self._held.items()}
        if candidate.kind is TaskKind.LOAD:
            del pending[candidate.network][candidate.layer]
            if candidate.retained:
                held.setdefault(candidate.network, {})[candidate.layer] = candidate.retained
        need = {net: _claim(loads, held.get(net, {})) for net, loads in pending.items()}
        if candidate.kind is TaskKind.INIT:
            need[candidate.network] = max(need.get(candidate.network, 0), candidate.network_largest)
        free += sum(sum(layers.values()) for net, layers in held.items() if net not in need)  # nothing left to load
        for net, claim in sorted(need.items(), key=lambda item: item[1]):
            if claim > free:
                return False
            free += sum(held.get(net, {}).values())
        return True


def _claim(pending: dict[int, int], held: dict[int, int]) -> int:
    """The most memory a network still needs beyond what it holds, running alone: at each
    pending load, the loads it holds of earlier layers have been executed and unloaded."""
    need = 0
    for layer, nbytes in pending.items():
        returned = sum(b for held_layer, b in held.items() if held_layer < layer)
        need = max(need, nbytes - returned)
    return need
