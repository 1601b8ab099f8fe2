"""Pipeline policies: when a unit's read may start, and how large the buffer is.

One engine executes every policy; a policy only answers two questions (Demand
Layering, Section IV):

* ``buffer_bytes`` — the weight buffer it needs for a given budget;
* ``read_may_start(i, kernels_started, kernels_done)`` — the gate on unit ``i``'s read,
  on top of the two constraints every policy shares: reads happen in order, and a read
  waits for room in the circular buffer (a unit's buffer is released only after its
  kernel completes).

``preload`` keeps every unit resident (the paper's Pre). ``sequential`` reads a unit only
after the previous kernel finished (one buffer of the largest unit). ``sync`` is the
lock-step pipeline: unit ``i+1`` is read while kernel ``i`` runs and neither stage runs
ahead (double buffers). ``async`` lets the reader run ahead as far as the circular buffer
allows (Algorithm 1). ``auto`` is not a policy of its own but a choice between two:
``preload`` when the budget holds every weight (or no budget is given), ``async``
otherwise, with the room beyond async's buffer keeping units resident (see
:func:`resolve_pipeline` and :func:`choose_kept_units`). ``external`` has no reader and
no buffer: every inference gets its units from a unit source (:mod:`layerfit.engine.source`), e.g. the multi-request
scheduler's load tasks. On CPU the copy stage vanishes: weights are used where they were
read, the paper's two-stage zero-copy pipeline. With a copy stage (three stages, see
:mod:`layerfit.engine.device`) ``copy_may_start`` gates each copy the same way, and the
read and the device buffer are each sized as the policy's buffer.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from layerfit.errors import BudgetError, LayerfitError
from layerfit.sizes import format_bytes, format_bytes_exact


@dataclass(frozen=True)
class Policy:
    """A named pipeline policy; see the module docstring. What sets the policies apart is
    data (``units_in_flight`` and the three flags) and the two gates, which the lock-step
    policies override (:class:`SequentialPolicy`, :class:`SyncPolicy`): the engine asks
    these, never the name."""

    name: str
    description: str
    units_in_flight: int  # minimum number of largest units the buffer must hold (0: all)
    resident: bool = False  # every unit bound for good at configuration (preload): nothing streams
    external: bool = False  # a unit source supplies every pass's units: no reader, no buffer
    runs_ahead: bool = False  # reads run ahead as far as the buffer allows (async), see below

    # ``runs_ahead``: adjacent units coalesce into one read, the reader waits for room for
    # a batch, the next pass is read ahead between passes, routed experts are guessed a
    # layer early, ``auto`` keeps units with the room beyond its buffer, and the buffer's
    # natural size is two of the largest unit (the gates below never hold it back).

    @property
    def streams(self) -> bool:
        """Whether the engine's own reader streams units through its buffer (neither
        preload nor external): only then are embedding tables read by rows."""
        return not self.resident and not self.external

    def minimum_bytes(self, unit_sizes: list[int]) -> int:
        """Smallest buffer this policy runs with."""
        if not unit_sizes:
            return 0
        if self.units_in_flight == 0:
            return sum(unit_sizes)
        return max(unit_sizes) * self.units_in_flight

    def buffer_bytes(self, unit_sizes: list[int], budget: int | None) -> int:
        """Buffer size for ``budget`` (default: the policy's natural size). Preload's need
        of every weight is checked by :func:`~layerfit.engine.weight_plan.plan_weights`,
        which knows the resident tensors and what streaming would need instead."""
        if self.external:  # the unit source owns the units' memory
            return 0
        total = sum(unit_sizes)
        largest = max(unit_sizes, default=0)
        if budget is None:
            natural = 2 * largest if self.runs_ahead else self.minimum_bytes(unit_sizes)
            return min(natural, total)  # never more than the whole model
        if budget < largest:
            raise BudgetError(
                f"budget of {format_bytes_exact(budget)} is below the largest unit ({format_bytes(largest)}): "
                f"the minimum budget is {format_bytes_exact(largest)}"
            )
        if self.units_in_flight > 1 and budget < self.units_in_flight * largest:  # sync's double buffer
            raise BudgetError(
                f"{self.name} double-buffers and needs {self.units_in_flight} x the largest unit = "
                f"{format_bytes_exact(self.units_in_flight * largest)}; "
                f"the budget is {format_bytes_exact(budget)}: raise it or use async"
            )
        # Units start on 4096-byte boundaries for direct I/O: a ragged tail is unusable.
        return min(budget // 4096 * 4096, total)

    def read_may_start(self, i: int, kernels_started: int, kernels_done: int, stages: int = 2) -> bool:
        """May unit ``i``'s read begin, given how many kernels started and finished?

        ``stages`` is 2 (read, kernel) or 3 (read, copy, kernel). Only the buffer holds
        the reads back here; the lock-step policies override it.
        """
        return True

    def copy_may_start(self, j: int, kernels_started: int, kernels_done: int) -> bool:
        """May unit ``j``'s copy begin (three stages), on top of Algorithm 1's constraints
        that its read finished and the device buffer has room for it?"""
        return True


@dataclass(frozen=True)
class SequentialPolicy(Policy):
    """Read (and copy) a unit only once the kernel before it finished."""

    def read_may_start(self, i: int, kernels_started: int, kernels_done: int, stages: int = 2) -> bool:
        return kernels_done >= i

    def copy_may_start(self, j: int, kernels_started: int, kernels_done: int) -> bool:
        return kernels_done >= j


@dataclass(frozen=True)
class SyncPolicy(Policy):
    """The lock-step pipeline: unit ``i`` is read in the cycle in which kernel
    ``i - (stages - 1)`` runs (paper Fig. 10b), and copied once kernel ``j - 1`` started."""

    def read_may_start(self, i: int, kernels_started: int, kernels_done: int, stages: int = 2) -> bool:
        return kernels_started >= i - (stages - 2)

    def copy_may_start(self, j: int, kernels_started: int, kernels_done: int) -> bool:
        return kernels_started >= j


POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy("preload", "all weights resident (paper: Pre)", 0, resident=True),
        SequentialPolicy("sequential", "read then execute each unit, one buffer (paper: Seq)", 1),
        SyncPolicy("sync", "lock-step read/execute pipeline, double buffers (paper: Sync)", 2),
        Policy("async", "reads run ahead within a circular buffer (paper: Async)", 1, runs_ahead=True),
        Policy("external", "units come from a unit source per inference (the scheduler); no buffer", 0,
               external=True),
    )
}


AUTO = "auto"


def get_policy(name: str) -> Policy:
    """The policy called ``name``; a clear error listing the choices otherwise."""
    try:
        return POLICIES[name]
    except KeyError:
        raise LayerfitError(
            f"unknown pipeline {name!r}: choose one of {', '.join([AUTO, *POLICIES])}"
        ) from None


def resolve_pipeline(name: str, weight_bytes: int, budget: int | None) -> str:
    """The policy that pipeline ``name`` runs for a model of ``weight_bytes`` (resident
    tensors and units) under ``budget``: ``name`` itself, except for ``auto``.

    ``auto`` keeps every weight resident (``preload``) when the budget holds them all or
    no budget is given: streaming then re-reads each unit on every inference for nothing,
    since its buffer would hold the whole model anyway. Below that it streams them
    (``async``), and the engine keeps what :func:`choose_kept_units` picks.
    """
    if name != AUTO:
        get_policy(name)
        return name
    return "preload" if budget is None or budget >= weight_bytes else "async"


REQUEST_BYTES = 256 * 1024
"""What one read request costs beyond its bytes, in bytes: about a direct read's latency
times the bandwidth (0.15 ms at 1.3 GB/s on the VM this was measured on; a Pi 4's
microSD card, 43.7 MB/s at 1800 reads/s, is nearer 24 KiB). It makes a small unit worth
keeping. The choice barely depends on the value: on the throttled card, 24 KiB and
256 KiB kept the same units of mobilenet_v2 and deeplab_v3 at 50-70 % of their weights,
while bytes alone (0) kept other units of deeplab_v3 at 70 %, 12 % slower."""


STREAMED_PER_BUFFER_BYTE = 8
"""At most this many bytes stream through the buffers per inference for each byte they
hold. Below that the reader idles while long kernels run, and every byte kept costs as
much read-ahead as it saves reading. Measured on resnet152 at 224 px with 26 % of its
weights as the budget: without the bound ``auto`` kept 54.5 MB and streamed 187 MB
through 8.4 MB, 25 % slower than async (all 242 MB through 63.5 MB); with it, it keeps
36.6 MB and matches async. resnet50 and mobilenet_v2 keep the same units either way."""


def choose_kept_units(
    unit_sizes: list[int],
    room: int,
    request_bytes: int = REQUEST_BYTES,
    buffers: int = 1,
    runs: Sequence[int] | None = None,
) -> set[int]:
    """Units ``auto`` keeps resident when ``room`` bytes hold some but not all of them;
    the rest stream through a circular buffer of the bytes left.

    Async reads every unit on every inference however large its buffer, so beyond the
    buffer that overlaps reading with computing, room is better spent keeping units.
    A unit kept saves its bytes and one request on every inference (``request_bytes``,
    see :data:`REQUEST_BYTES`). Each of the ``buffers`` buffers (two with a copy stage:
    the read and the device buffer) must hold two of the largest unit streamed, so that
    its stages overlap, and together they must hold at least one byte in
    :data:`STREAMED_PER_BUFFER_BYTE` of what streams. So for each candidate
    largest-streamed size ``m``, every larger unit is kept, two of ``m`` per buffer are
    set aside, and the rest of the room keeps the units that save the most per byte
    first (the smallest, when every unit runs once per inference) while the buffers stay
    large enough. The candidate that saves the most wins; none fits: nothing is kept and
    the room is the buffers. ``runs`` weighs each unit by how often it runs (an
    encoder-decoder's decoder once per generated token, its encoder once per input, see
    :func:`~layerfit.engine.parts.unit_runs`): a kept unit saves its reads that often.
    Of units that save alike, those streamed are spread through the pass
    (:func:`spread_streamed`).
    """
    n, total = len(unit_sizes), sum(unit_sizes)
    weight = [1] * n if runs is None else list(runs)
    # The most saved per byte kept first: a unit's reads and requests, as often as it runs.
    best_first = sorted(range(n), key=lambda i: (-weight[i] * (1 + request_bytes / max(unit_sizes[i], 1)), i))
    best: set[int] = set()
    best_saved = 0

    def buffers_hold_enough(kept_bytes: int) -> bool:
        return (room - kept_bytes) * STREAMED_PER_BUFFER_BYTE >= total - kept_bytes

    for m in sorted(set(unit_sizes), reverse=True):
        larger = [i for i in range(n) if unit_sizes[i] > m]
        kept_bytes = sum(unit_sizes[i] for i in larger)
        left = room - 2 * m * buffers - kept_bytes
        if m <= 0 or left < 0 or not buffers_hold_enough(kept_bytes):
            continue
        # One of size m streams: the one run least often (the last, when they run alike).
        streamed = max((i for i in range(n) if unit_sizes[i] == m), key=lambda i: (-weight[i], i))
        kept = set(larger)
        for i in best_first:
            size = unit_sizes[i]
            if size > left or size > m or not buffers_hold_enough(kept_bytes + size):
                continue  # a later one may be smaller
            if i != streamed:
                kept.add(i)
                kept_bytes += size
                left -= size
        saved = sum(weight[i] * (unit_sizes[i] + request_bytes) for i in kept)
        if saved > best_saved:
            best, best_saved = kept, saved
    return spread_streamed(best, [(weight[i], unit_sizes[i]) for i in range(n)])


def spread_streamed(kept: set[int], kinds: Sequence[Hashable]) -> set[int]:
    """``kept`` with as many of each kind of unit kept, but the streamed ones of each kind
    evenly spaced through the pass, the kind's last among them. Units of one kind (the
    same size, run as often) save alike, so the room rules cannot tell them apart.

    Keeping the first of a kind and streaming the rest puts every read at the end of
    the pass, where each waits for the kernel before it to free its place in the buffer
    while nothing else is left to compute: the pass takes its compute plus its reads.
    Spread out, each read overlaps the kernels of the kept units before it. Measured on a
    6-layer Llama (18 MLP projections of 3.1 MB) at 75 % of its weights, 7 of them
    streamed: 17.5-18.6 ms per generated token with the last seven streamed, 14.6-15.1 ms
    spread out (paired runs), where the reads alone, back to back, take about 10 ms here.
    """
    members: dict[Hashable, list[int]] = {}
    for i, kind in enumerate(kinds):
        members.setdefault(kind, []).append(i)
    spread: set[int] = set()
    for units in members.values():
        count, streams = len(units), sum(1 for i in units if i not in kept)
        streamed = {units[(k + 1) * count // streams - 1] for k in range(streams)}
        spread.update(i for i in units if i not in streamed)
    return spread


def least_room_to_keep(unit_sizes: list[int], buffers: int = 1) -> int | None:
    """The least room in which :func:`choose_kept_units` keeps a unit (None: it never
    can, with a single unit). Either every unit larger than some ``m`` is kept beside
    buffers of two of ``m`` each, or, beside buffers of two of the largest, the smallest
    other unit; and the buffers left hold one byte in :data:`STREAMED_PER_BUFFER_BYTE` of
    what streams. With a copy stage this can be less than async's own minimum (a read
    and a device buffer of the largest unit)."""
    if len(unit_sizes) < 2:
        return None
    total, largest = sum(unit_sizes), max(unit_sizes)

    def least(kept_bytes: int, buffer_bytes: int) -> int:
        stream_bound = kept_bytes - (-(total - kept_bytes) // STREAMED_PER_BUFFER_BYTE)  # kept + ceil(rest / 8)
        return max(kept_bytes + buffer_bytes, stream_bound)

    candidates = [least(sum(n for n in unit_sizes if n > m), 2 * m * buffers) for m in set(unit_sizes) if m < largest]
    candidates.append(least(min(unit_sizes), 2 * largest * buffers))  # one of the largest streams, not it
    return min(candidates)
