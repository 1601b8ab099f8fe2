"""How a budget is spent on a model's weights: the policy that runs, the units kept
resident, and the size of each unit buffer.

The engine configures itself from this plan, and ``layerfit inspect --budget`` shows it
without loading the model. It is arithmetic on unit sizes only, and it refuses a budget
below the minimum with an error that names the minimum and why.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from layerfit.engine.policies import (
    AUTO,
    Policy,
    choose_kept_units,
    get_policy,
    least_room_to_keep,
    resolve_pipeline,
)
from layerfit.errors import BudgetError, LayerfitError
from layerfit.sizes import format_bytes, format_bytes_exact


@dataclass(frozen=True)
class WeightPlan:
    """``policy`` runs; ``kept`` units (``auto``) stay resident beside the buffers;
    ``gathered`` units (embedding tables, see :mod:`layerfit.engine.gather`) are read by
    rows when they run: never kept, and the read buffer holds their rows in their turn
    (room for one row at least, and what the budget leaves, up to whole tables);
    ``buffer_bytes`` is the read buffer, ``device_buffer_bytes`` the copy stage's;
    ``expert_cache_bytes`` what ``auto`` leaves for single experts used often
    (:mod:`layerfit.engine.expert_cache`)."""

    policy: Policy
    kept: frozenset[int]
    kept_bytes: int
    buffer_bytes: int
    device_buffer_bytes: int
    gathered: frozenset[int] = frozenset()
    expert_cache_bytes: int = 0


def plan_weights(
    pipeline: str,
    unit_sizes: list[int],
    resident: int,
    budget: int | None,
    stages: int,
    gatherable: Mapping[int, int] | None = None,
    runs: Sequence[int] | None = None,
    experts: frozenset[int] = frozenset(),
) -> WeightPlan:
    """The plan of ``pipeline`` for units of ``unit_sizes`` bytes and ``resident`` bytes of
    resident tensors under ``budget`` (None: the policy's own size) with 2 or 3 stages.
    ``gatherable`` maps units read by rows when the policy streams to the least buffer
    room their rows take (one row and its read): they are never kept, and the buffer
    holds that room for them instead of their bytes. ``runs`` weighs the units ``auto``
    may keep by how often each runs (see :func:`~layerfit.engine.policies.choose_kept_units`).
    ``experts``: the gatherable units that are routed experts; under ``auto``, the budget
    beyond what the read buffer needs to keep reading ahead (:func:`_experts_buffer`)
    goes to the expert cache instead of a larger buffer."""
    three = stages == 3
    policy = get_policy(resolve_pipeline(pipeline, resident + sum(unit_sizes), budget))
    gathered = dict(gatherable) if policy.streams and gatherable else {}
    others = [i for i in range(len(unit_sizes)) if i not in gathered]
    sizes = [unit_sizes[i] for i in others]  # what the buffers and the kept units share
    largest = max(sizes, default=0)
    floor = max(gathered.values(), default=0)  # set aside before auto keeps units
    kept: set[int] = set()
    if pipeline == AUTO and policy.runs_ahead and budget is not None:
        room = budget - resident - floor
        weights = None if runs is None else [runs[i] for i in others]
        kept = {others[j] for j in choose_kept_units(sizes, room, buffers=2 if three else 1, runs=weights)}
        least = least_room_to_keep(sizes, buffers=2) if three and not kept else None
        if least is not None and budget < resident + least < resident + 2 * largest:
            raise BudgetError(  # auto's minimum is then below async's: name it
                f"budget {format_bytes_exact(budget)} is below the minimum for this model: "
                f"{format_bytes_exact(resident + least)}, for pipeline auto with three stages: its largest "
                "units kept, and a read and a device buffer of two of the next each; async alone needs "
                f"{format_bytes_exact(resident + 2 * largest)}"
            )
    kept_bytes = sum(unit_sizes[i] for i in kept)
    streamed = [unit_sizes[i] for i in others if i not in kept]
    if gathered and not streamed:  # nothing else streams: the table streams whole, as before
        return plan_weights(pipeline, unit_sizes, resident, budget, stages, runs=runs)
    streamed += gathered.values()  # the rows take their turn in the buffer
    capacity, device_capacity = _buffer_sizes(policy, streamed, resident + kept_bytes, budget, three)
    if gathered and budget is not None:
        # Room the budget leaves may hold more rows (a long prompt), up to whole tables;
        # with three stages the rows stay in the read buffer (looked up on the host).
        spare = (budget - resident - kept_bytes - device_capacity) // 4096 * 4096 - capacity
        capacity += max(0, min(spare, sum(unit_sizes[i] for i in gathered)))
    cache = 0
    if pipeline == AUTO and experts & gathered.keys() and budget is not None and not three:
        # single experts serve more than a read buffer longer than it needs
        cache = max(0, capacity - _experts_buffer(unit_sizes, kept, gathered, experts)) // 4096 * 4096
        capacity -= cache
    return WeightPlan(policy, frozenset(kept), kept_bytes, capacity, device_capacity, frozenset(gathered), cache)


PROMPT_ROWS = 512
"""Distinct tokens of a prompt whose embedding rows the read buffer of a model of routed
experts holds at once beside the rest (its least room per table holds one row)."""


def _experts_buffer(
    unit_sizes: list[int], kept: set[int], gathered: Mapping[int, int], experts: frozenset[int]
) -> int:
    """The read buffer a model of routed experts needs to lose no read-ahead: the largest
    experts unit's place (its chosen experts land there when it runs), beside every
    streamed unit the reader reads ahead up to the next table read when it runs (it stops
    there), and each embedding table's rows for a prompt of :data:`PROMPT_ROWS` distinct
    tokens (a longer one is read in the room there is, as on any buffer)."""
    gap = longest = 0
    for i, size in enumerate(unit_sizes):
        if i in gathered:
            gap = 0
        elif i not in kept:
            gap += size
            longest = max(longest, gap)
    room = max((gathered[i] for i in gathered if i in experts), default=0)
    tables = sum(min(unit_sizes[i], PROMPT_ROWS * gathered[i]) for i in gathered if i not in experts)
    return room + longest + tables


def _buffer_sizes(policy: Policy, sizes: list[int], resident: int, budget: int | None, three: bool) -> tuple[int, int]:
    """(read buffer, device buffer) bytes for ``budget``; a clear error below the minimum.
    Three stages split the budget evenly between the two buffers."""
    largest = max(sizes, default=0)
    if three and policy.external:
        raise LayerfitError("pipeline 'external' takes units from a unit source in host memory: it runs with stages=2 on cpu")
    copies = 2 if three and not policy.resident else 1  # read + device buffer
    if policy.resident and budget is not None and budget < resident + sum(sizes):
        raise BudgetError(
            f"preload keeps every weight resident and needs {format_bytes_exact(resident + sum(sizes))}; "
            f"the budget is {format_bytes_exact(budget)}: raise it, or stream the weights with pipeline "
            f"'auto' or 'async', from {format_bytes_exact(resident + (2 if three else 1) * largest)}"
        )
    if budget is not None and budget < resident + copies * largest:
        raise BudgetError(
            f"budget {format_bytes_exact(budget)} is below the minimum for this model: "
            f"{format_bytes_exact(resident + copies * largest)}, "
            + ("2 x " if copies == 2 else "")
            + f"the largest unit ({format_bytes(largest)})"
            + (f" + resident tensors ({format_bytes(resident)})" if resident else "")
            + ("; three stages hold a read and a device buffer" if copies == 2 else "")
        )
    rings_budget = None if budget is None else budget - resident
    if copies == 1:  # one buffer: the read buffer, or (preload, three stages) the device one
        capacity = policy.buffer_bytes(sizes, rings_budget)
        return (0, capacity) if three else (capacity, 0)
    each = policy.minimum_bytes(sizes)
    if rings_budget is not None and rings_budget < 2 * each:
        raise BudgetError(
            f"the three-stage {policy.name} pipeline needs a read and a device buffer "
            f"of {format_bytes(each)} each: the minimum budget is {format_bytes_exact(resident + 2 * each)}, "
            f"the budget is {format_bytes_exact(budget)}"
        )
    capacity = policy.buffer_bytes(sizes, None if rings_budget is None else rings_budget // 2)
    return capacity, capacity
