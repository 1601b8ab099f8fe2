"""What an engine will hold and stream for a prepared model under a config: nothing
read, nothing allocated.

:func:`plan` is the pure half of configuring an engine: the units (layers grouped as the
config says), which embedding tables are read by rows, how often each unit runs as the
model generates, and the :class:`~layerfit.engine.weight_plan.WeightPlan` (policy, kept
units, buffer sizes). The engine builds its buffers and hooks from it; ``layerfit
inspect --budget`` prints it without loading a byte of weights.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch import nn

from layerfit.engine.config import EngineConfig
from layerfit.engine.device import device_stages
from layerfit.engine.expert_guess import guessing_routers
from layerfit.engine.experts import experts_segment, routed_module
from layerfit.engine.gather import gathered_units, least_room
from layerfit.engine.part_units import unit_runs
from layerfit.engine.units import Block, make_blocks
from layerfit.engine.weight_plan import WeightPlan, plan_weights
from layerfit.errors import BudgetError
from layerfit.sizes import format_bytes
from layerfit.store.manifest import Manifest


@dataclass(frozen=True)
class MemoryPlan:
    """What the engine holds for weights: resident tensors plus the unit buffers.

    ``buffer_bytes`` is the read (host) buffer; ``device_buffer_bytes`` is the copy
    stage's device buffer (0 without a copy stage); ``kept_bytes`` holds the units
    pipeline ``auto`` keeps resident beside the buffer (0 otherwise);
    ``expert_cache_bytes`` the single experts it keeps as they are used.
    """

    resident_bytes: int
    buffer_bytes: int
    largest_unit_bytes: int
    total_weight_bytes: int
    device_buffer_bytes: int = 0
    kept_bytes: int = 0
    expert_cache_bytes: int = 0

    @property
    def minimum_budget(self) -> int:
        return self.resident_bytes + self.largest_unit_bytes

    @property
    def weight_bytes(self) -> int:
        """Every byte held for weights: what the budget bounds."""
        return (self.resident_bytes + self.kept_bytes + self.buffer_bytes + self.device_buffer_bytes
                + self.expert_cache_bytes)


@dataclass(frozen=True)
class EnginePlan:
    """How an engine configured by ``config`` runs the model: its ``blocks`` (the
    streamed units), the ``weights`` plan, the ``memory`` it holds, the units whose
    tables may be read by rows (``rows``: unit → least buffer room) and how often each
    unit runs as the model generates (``runs``; None: once per inference)."""

    config: EngineConfig
    budget_bytes: int | None
    blocks: tuple[Block, ...]
    rows: dict[int, int]
    runs: tuple[int, ...] | None
    weights: WeightPlan
    memory: MemoryPlan


def plan(manifest: Manifest, config: EngineConfig, model: nn.Module | None = None) -> EnginePlan:
    """The plan of ``config`` for ``manifest``'s model. ``model`` (the skeleton, when it
    can be built) tells which tables are plain ``nn.Embedding`` modules read by rows and
    which units an encoder-decoder runs once per input; without it every gatherable
    table counts and every unit runs once. A budget below the minimum is a
    :class:`~layerfit.errors.BudgetError` naming the minimum (and, for a share, the bytes)."""
    stages = device_stages(config.device, config.stages)
    blocks = make_blocks(manifest.units, config.units)
    rows: dict[int, int] = {}
    # Rows land in the read buffer and are used there, with PyTorch's own activations
    # (the planned arena replays the captured ops whole). With two stages (cpu) the
    # kernels use them in place: embedding rows and routed experts. With three, an
    # embedding is looked up on the host, where its rows were read, and its output moved
    # to the device; experts must run on the device, so they are read whole there.
    if config.gather_rows and config.activations == "default":
        for i in gathered_units(blk.segments for blk in blocks):
            segment = blocks[i].segments[0]
            if stages == 3 and experts_segment(segment):
                continue
            if model is None or _plain_embedding(model, blocks[i]) or _routed_experts(model, blocks[i]):
                rows[i] = least_room(segment)
    runs = None if model is None else unit_runs(model, blocks)  # a decoder runs per token
    budget = config.budget
    budget_bytes = None if budget is None else budget.bytes_for(manifest.total_bytes)
    sizes = [b.nbytes for b in blocks]
    experts = frozenset(i for i in rows if config.expert_cache and experts_segment(blocks[i].segments[0]))

    def spend(sizes: list[int], resident: int) -> tuple[WeightPlan, dict[int, int]]:
        weights = plan_weights(config.pipeline, sizes, resident, budget_bytes, stages, rows, runs, experts)
        if config.pipeline == "auto" and budget_bytes is not None and weights.gathered:
            return _keep_experts_whole(blocks, sizes, resident, budget_bytes, stages, rows, runs, weights,
                                       config.expert_cache)
        return weights, rows

    try:
        weights, spent_rows = spend(sizes, manifest.resident_bytes)
    except BudgetError as exc:
        if budget is None or not budget.is_share:
            raise
        raise BudgetError(f"{exc} ({budget} of its {format_bytes(manifest.total_bytes)} of weights)") from None
    routed = {i for i in spent_rows if experts_segment(blocks[i].segments[0])}
    guessing = model is not None and config.expert_prefetch and config.pipeline == "auto" and weights.policy.runs_ahead
    routers = guessing_routers(model, blocks, routed) - weights.kept if guessing else set()
    if routers:
        # The routers that guess the next MoE layer's experts stay in memory (a few KB
        # each), where the budget allows: planned as resident, then kept.
        held = sum(sizes[i] for i in routers)
        try:
            planned, planned_rows = spend([0 if i in routers else n for i, n in enumerate(sizes)],
                                          manifest.resident_bytes + held)
            weights, spent_rows = dataclasses.replace(
                planned, kept=planned.kept | routers, kept_bytes=planned.kept_bytes + held), planned_rows
        except BudgetError:  # no room beside the minimum: no guesses
            pass
    rows = spent_rows
    largest = max((rows[i] if i in weights.gathered else n for i, n in enumerate(sizes)), default=0)
    memory = MemoryPlan(
        manifest.resident_bytes,
        weights.buffer_bytes,
        largest,
        manifest.total_bytes,
        weights.device_buffer_bytes,
        weights.kept_bytes,
        weights.expert_cache_bytes,
    )
    return EnginePlan(config, budget_bytes, tuple(blocks), rows, None if runs is None else tuple(runs), weights, memory)


def _plain_embedding(model: nn.Module, block: Block) -> bool:
    """Whether the table of a gatherable unit belongs to a plain ``nn.Embedding`` without
    ``max_norm`` (whose lookup the engine replays on the rows it reads)."""
    name = block.segments[0].name
    try:
        module = model.get_submodule(name) if name else model
    except AttributeError:
        return False
    return type(module) is nn.Embedding and module.max_norm is None


def _keep_experts_whole(
    blocks: list[Block], sizes: list[int], resident: int, budget: int, stages: int,
    rows: dict[int, int], runs: list[int] | None, weights: WeightPlan, cache: bool = True,
) -> tuple[WeightPlan, dict[int, int]]:
    """Spend what ``auto`` leaves of the budget after every other unit it keeps on keeping
    whole units of experts, which then read nothing per token (routed, a token reads k of
    E experts of each): the most such units the budget keeps beside everything it already
    kept, found by bisection (the plan with n kept is feasible for every smaller n)."""
    experts = [i for i in sorted(rows) if experts_segment(blocks[i].segments[0])]

    def trial(n: int) -> WeightPlan | None:
        whole = set(experts[:n])
        try:
            rest = {i: r for i, r in rows.items() if i not in whole}
            cacheable = frozenset(experts) - whole if cache else frozenset()
            plan_n = plan_weights("auto", sizes, resident, budget, stages, rest, runs, cacheable)
        except BudgetError:
            return None
        return plan_n if whole | weights.kept <= plan_n.kept else None

    low, high, best = 0, len(experts), None
    while low < high:
        mid = (low + high + 1) // 2
        found = trial(mid)
        if found is None:
            high = mid - 1
        else:
            low, best = mid, found
    if best is None:
        return weights, rows
    return best, {i: r for i, r in rows.items() if i not in set(experts[:low])}


def _routed_experts(model: nn.Module, block: Block) -> bool:
    """Whether a gatherable unit of experts belongs to a module that takes the router's
    choice (and so computes with the chosen experts only)."""
    segment = block.segments[0]
    if not experts_segment(segment):
        return False
    try:
        module = model.get_submodule(segment.name) if segment.name else model
    except AttributeError:
        return False
    return routed_module(module)


__all__ = ["EnginePlan", "MemoryPlan", "plan"]
