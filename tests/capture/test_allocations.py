"""What the captured eager pass holds at once (``ModelGraph.pass_peak_bytes``).

The usage records see what leaf modules hand each other; the pass also holds what
functional code makes between them (attention scores, a key/value cache returned inside
an object). These tests check the measured peak against sizes worked out by hand, against
the CPU allocator's own account of plain ``model(x)`` (torch.profiler's memory events),
and against a simulation of random allocation scripts.
"""

from __future__ import annotations

import tinymodels
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.profiler import ProfilerActivity, profile

from layerfit.capture import capture
from layerfit.capture.allocations import PassAllocations
from layerfit.capture.graph import ModelGraph
from layerfit.schedule.runtime.profiler import activation_estimate_bytes, activation_peak_bytes

F32 = 4


class Attention(nn.Module):
    """One projection module; the scores and their softmax are functional code."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.q = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q(x)
        scores = torch.softmax(q @ q.transpose(-1, -2), -1)
        return scores @ q


class Cache:
    """Tensors returned inside a plain object, as Hugging Face returns its caches."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k, self.v = k, v


class WithCache(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, Cache]:
        return self.lin(x), Cache(x.repeat(1, 8, 1), x.repeat(1, 8, 1))


class Views(nn.Module):
    """Returns views of its weight and of its input: nothing new is allocated."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.w.t(), x.view(-1)


def _profiler_peak(model: nn.Module, x: torch.Tensor) -> int:
    """Peak of what the CPU allocator handed out during plain ``model(x)``, plus the input."""
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model(x)
    events = sorted(
        (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
    )
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    return peak + x.nbytes


def test_attention_scores_made_by_functional_code_are_counted():
    x = torch.randn(1, 512, 64)
    g = capture(Attention().eval(), x, method="hooks")
    q = 512 * 64 * F32
    scores = 512 * 512 * F32
    # input, q, the scores and their softmax live at once
    assert g.pass_peak_bytes == x.nbytes + q + 2 * scores
    # the leaf-module records see the input, q and the output only
    assert activation_peak_bytes(g) < x.nbytes + q + scores
    assert activation_estimate_bytes(g) == g.pass_peak_bytes


def test_pass_peak_is_what_the_cpu_allocator_gives_plain_pytorch():
    model, x = Attention().eval(), torch.randn(1, 256, 64)
    assert capture(model, x, method="hooks").pass_peak_bytes == _profiler_peak(model, x)


def test_cnn_pass_peak_is_at_least_the_records_and_at_most_the_allocator():
    # eager batch norm does not write over its input as the records allow; the allocator
    # also counts scratch inside kernels, which the pass's tensors do not
    model, x = tinymodels.tiny_cnn().eval(), torch.randn(1, 3, 16, 16)
    g = capture(model, x)
    assert g.method == "fx"
    assert activation_peak_bytes(g) <= g.pass_peak_bytes <= _profiler_peak(model, x)
    assert activation_estimate_bytes(g) == g.pass_peak_bytes


def test_a_cache_returned_inside_an_object_is_counted():
    x = torch.randn(1, 16, 32)
    g = capture(WithCache().eval(), x, method="hooks")
    assert g.pass_peak_bytes == x.nbytes + x.nbytes + 2 * 8 * x.nbytes  # input, output, k, v
    assert activation_peak_bytes(g) == 2 * x.nbytes  # the records miss k and v


def test_views_of_weights_and_inputs_allocate_nothing():
    x = torch.randn(2, 4)
    assert capture(Views().eval(), x, method="hooks").pass_peak_bytes == x.nbytes


class InPlace(nn.Module):
    """An in-place op hands back the tensor it was given: one storage, seen twice."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.add_(1).relu_()
        return y


def test_in_place_ops_and_recurrent_kernels_count_each_storage_once():
    x = torch.randn(4, 8)
    assert capture(InPlace().eval(), x, method="hooks").pass_peak_bytes == 2 * x.nbytes
    # nn.LSTM/GRU hand back tensors they were given as well (this raised before)
    model, x = tinymodels.recurrent().eval(), torch.randn(1, 5, 8)
    g = capture(model, x)
    assert activation_peak_bytes(g) <= g.pass_peak_bytes <= _profiler_peak(model, x)


def test_graph_round_trips_the_pass_peak_and_older_graphs_read_as_unmeasured():
    g = capture(Attention(16).eval(), torch.randn(1, 8, 16), method="hooks")
    assert ModelGraph.from_json(g.to_json()).pass_peak_bytes == g.pass_peak_bytes > 0
    older = g.to_dict()
    del older["pass_peak_bytes"]
    read = ModelGraph.from_dict(older)
    assert read.pass_peak_bytes == 0
    assert activation_estimate_bytes(read) == activation_peak_bytes(read)


# A script of steps: ("make", n) allocates n floats and keeps them; ("view", i) keeps a
# view of a kept tensor; ("drop", i) lets go of a kept tensor (its storage goes when no
# view of it is kept either).
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("make"), st.integers(1, 4096)),
        st.tuples(st.just("view"), st.integers(0, 63)),
        st.tuples(st.just("drop"), st.integers(0, 63)),
    ),
    max_size=40,
)


class Script(nn.Module):
    def __init__(self, steps: list[tuple[str, int]]) -> None:
        super().__init__()
        self.steps = steps
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        kept: list[torch.Tensor] = []
        for step, n in self.steps:
            if step == "make":
                kept.append(torch.ones(n) * x[0, 0])
            elif kept and step == "view":
                kept.append(kept[n % len(kept)][1:])
            elif kept:
                kept.pop(n % len(kept))
        return tuple(kept)


def _expected_peak(steps: list[tuple[str, int]], input_bytes: int) -> int:
    kept: list[int] = []  # the storage (its index in sizes) each kept tensor views
    sizes: list[int] = []
    peak = live = input_bytes
    for step, n in steps:
        if step == "make":
            # torch.ones(n) and the product both live until the product is made
            peak = max(peak, live + 2 * n * F32)
            sizes.append(n * F32)
            kept.append(len(sizes) - 1)
            live += n * F32
        elif kept and step == "view":
            kept.append(kept[n % len(kept)])
        elif kept:
            storage = kept.pop(n % len(kept))
            if storage not in kept:
                live -= sizes[storage]
    return peak


@settings(max_examples=60, deadline=None)
@given(steps=STEPS)
def test_peak_follows_every_allocation_and_release(steps):
    model, x = Script(steps).eval(), torch.randn(1, 4)
    tracker = PassAllocations(weights=list(model.parameters()), inputs=[x])
    with torch.no_grad(), tracker:
        out = model(x)
    assert tracker.peak == _expected_peak(steps, x.nbytes)
    del out
    assert tracker.live == x.nbytes  # everything the pass made is gone with its output
