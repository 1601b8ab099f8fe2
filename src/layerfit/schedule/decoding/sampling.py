"""How one sequence chooses its next token from the model's logits: greedy or sampled.

Every sequence of a batch chooses on its own row of logits with its own settings and
its own random generator, so a seeded request draws the same tokens whoever shares its
steps (its logits are the model's for it alone, within the batch's tolerance: see
:mod:`layerfit.schedule.decoding.batch_step`). Temperature 0 is greedy (the argmax, the first
of equal ones, as ``torch.argmax`` and transformers' greedy search choose); otherwise
transformers' own logits warpers divide by the temperature and cut to the ``top_k``
largest and to the smallest set whose probability reaches ``top_p``, and one token is
drawn. A temperature so small that the divided logits overflow (``1e-300``) chooses
as its limit does, the argmax: never infinities or NaN in the probabilities.
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
    """The next token from one row of logits (``[vocab]``): the argmax, or a draw after
    transformers' own warpers (temperature, top-k, top-p, in ``generate``'s order)."""
    if sampling.greedy:
        return int(torch.argmax(logits))
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    scores = TemperatureLogitsWarper(sampling.temperature)(None, logits.float()[None])
    if not bool(torch.isfinite(scores.amax())) or bool(torch.isnan(scores).any()):
        # the division overflowed (a temperature near 0): its limit is greedy
        return int(torch.argmax(logits))
    if 0 < sampling.top_k < scores.shape[-1]:
        scores = TopKLogitsWarper(sampling.top_k)(None, scores)
    if sampling.top_p < 1:
        scores = TopPLogitsWarper(sampling.top_p)(None, scores)
    return int(torch.multinomial(torch.softmax(scores[0], -1), 1, generator=generator))


__all__ = ["Sampling", "choose"]
