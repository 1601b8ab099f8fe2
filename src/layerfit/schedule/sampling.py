"""How one sequence chooses its next token from the model's logits: greedy or sampled.

Every sequence of a batch chooses on its own row of logits with its own settings and
its own random generator, so a seeded request draws the same tokens whoever shares its
steps (its logits are the model's for it alone, within the batch's tolerance: see
:mod:`layerfit.schedule.batch_step`). Temperature 0 is greedy (the argmax, the first
of equal ones, as ``torch.argmax`` and transformers' greedy search choose); otherwise
the logits are divided by the temperature, cut to the ``top_k`` largest and to the
smallest set whose probability reaches ``top_p``, and one token is drawn.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import torch

from layerfit.errors import InputError


@dataclass(frozen=True)
class Sampling:
    """The sampling settings of one request, named as the OpenAI and Triton APIs name
    them: ``temperature`` (0: greedy), ``top_p`` (1: off), ``top_k`` (0: off) and
    ``seed`` (None: a fresh random one)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise InputError(f"temperature must be a finite number, 0 (greedy) or more, not {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InputError(f"top_p must be in (0, 1], not {self.top_p}")
        if self.top_k < 0:
            raise InputError(f"top_k must be 0 (off) or more, not {self.top_k}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise InputError(f"seed must be from 0 to 2**63 - 1, not {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def generator(self) -> torch.Generator | None:
        """The sequence's own random generator (None when greedy: nothing is drawn)."""
        if self.greedy:
            return None
        generator = torch.Generator()
        generator.manual_seed(self.seed if self.seed is not None else secrets.randbits(63))
        return generator


def choose(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> int:
    """The next token from one row of logits (``[vocab]``)."""
    if sampling.greedy:
        return int(torch.argmax(logits))
    scores = logits.float() / sampling.temperature
    if 0 < sampling.top_k < scores.numel():
        kth = torch.topk(scores, sampling.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, -math.inf)
    if sampling.top_p < 1:
        ordered, order = torch.sort(scores, descending=True)
        cumulative = torch.softmax(ordered, -1).cumsum(-1)
        # keep each token whose predecessors' probability is below top_p (the first always)
        cut = (cumulative - torch.softmax(ordered, -1)) >= sampling.top_p
        scores = scores.scatter(0, order[cut], -math.inf)
    probs = torch.softmax(scores, -1)
    return int(torch.multinomial(probs, 1, generator=generator))


__all__ = ["Sampling", "choose"]
