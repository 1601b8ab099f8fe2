"""Operator profiles, operator breadths and positional maxima (the paper's section 3).

The *profile* of operator ``t`` is the list of records live at ``t`` (``first_op ≤ t ≤
last_op``), sorted by non-increasing size with ties in record order (TFLite's
``CalculateTaskProfiles``). Its *breadth* is the sum of its sizes; the ``k``-th
*positional maximum* is the largest ``k``-th element over all profiles.

Only operators where some tensor starts need a profile: the profile of any other
operator ``t`` is a subset of the profile of the latest start before ``t`` (every
tensor live at ``t`` started at or before that start and ends at or after ``t``). So we
sweep the distinct ``first_op`` values instead of every operator index; this keeps the
work proportional to the sum of profile sizes and independent of how sparse the
operator numbering is, and the breadth order it induces is TFLite's (ties by op index).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from layerfit.memory.records import TensorUsageRecord


@dataclass(frozen=True)
class OperatorProfile:
    """Records (as indices into the record list) live at operator ``op``, largest first."""

    op: int
    members: tuple[int, ...]
    breadth: int


def operator_profiles(records: Sequence[TensorUsageRecord]) -> list[OperatorProfile]:
    """Profiles of every operator where a tensor starts, in operator order."""
    order = sorted(range(len(records)), key=lambda i: (records[i].first_op, i))
    live: list[tuple[int, int]] = []  # heap of (last_op, index)
    live_set: set[int] = set()
    profiles: list[OperatorProfile] = []
    pos = 0
    while pos < len(order):
        op = records[order[pos]].first_op
        while pos < len(order) and records[order[pos]].first_op == op:
            i = order[pos]
            heapq.heappush(live, (records[i].last_op, i))
            live_set.add(i)
            pos += 1
        while live and live[0][0] < op:
            live_set.discard(heapq.heappop(live)[1])
        members = tuple(sorted(live_set, key=lambda i: (-records[i].size, i)))
        profiles.append(OperatorProfile(op, members, sum(records[i].size for i in members)))
    return profiles


def positional_maximums(records: Sequence[TensorUsageRecord]) -> list[int]:
    """The ``k``-th largest tensor size over all operator profiles, for every ``k``."""
    result: list[int] = []
    for profile in operator_profiles(records):
        for k, i in enumerate(profile.members):
            size = records[i].size
            if k < len(result):
                if size > result[k]:
                    result[k] = size
            else:
                result.append(size)
    return result


def max_breadth(records: Sequence[TensorUsageRecord]) -> int:
    """The largest operator breadth (0 for no records): the most bytes live at once.

    A sweep over the records' starts and ends, O(n log n), rather than the operator
    profiles, which list and sort every live tensor at every start."""
    events: list[tuple[int, int]] = []
    for r in records:
        events.append((r.first_op, r.size))
        events.append((r.last_op + 1, -r.size))
    events.sort()  # at equal op index, ends (negative) come first
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return peak


def maximal_cliques(records: Sequence[TensorUsageRecord]) -> list[OperatorProfile]:
    """The operator profiles not contained in the next one (maximal sets of live tensors).

    Profile ``j`` is inside profile ``j + 1`` exactly when none of its tensors ends
    before the next start, so these are the maximal cliques of the interval graph:
    two tensors conflict if and only if both belong to one of them.
    """
    profiles = operator_profiles(records)
    out = []
    for j, p in enumerate(profiles):
        if j + 1 == len(profiles) or any(
            records[i].last_op < profiles[j + 1].op for i in p.members
        ):
            out.append(p)
    return out
