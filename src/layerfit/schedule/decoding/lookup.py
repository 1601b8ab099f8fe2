"""Prompt lookup in the decode loop: a sequence guesses its next tokens from its own
n-grams, and one pass of the target verifies them.

**Proposing** (:func:`propose`) is transformers' prompt lookup
(``PromptLookupCandidateGenerator``) with ``max_matching_ngram_size`` :data:`MAX_NGRAM`:
the sequence's last n tokens (n from :data:`MAX_NGRAM` down to 1) are looked for among its
earlier ids (prompt and output), left to right; at the first match whose continuation is
not empty, up to ``n`` tokens of that continuation are the proposals, cut before the
first end token (a proposal never runs past an end). No match: no proposal, and the
sequence makes one token this step as plain decoding does.

**Verifying** (:func:`accept`) is greedy: the pass that feeds the last token and the ``k``
proposals gives ``k + 1`` rows of logits; the proposals are accepted while each equals
the argmax of the row before it, and the argmax after the last accepted one is the
model's own next token. So a step makes 1 to ``k + 1`` tokens, each the one plain greedy
decoding makes (equal up to the batch's tolerance, as every step of the loop:
:mod:`~layerfit.schedule.decoding.batch_step`), and the positions of rejected proposals
are cropped from the sequence's cache.

Sampled sequences do not speculate: verifying a draw needs the draft's probabilities
(speculative sampling), which a lookup has none of; they make one token per step.

:class:`PromptLookup` is the server's setting: proposals per step for every model, and
per model by name (``--prompt-lookup 8``, ``--prompt-lookup lm=4``); a request may ask
for its own (``prompt_lookup``, 0 to :data:`MAX_PROMPT_LOOKUP`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from layerfit.errors import InputError
from layerfit.schedule.decoding.rules import PROMPT_LOOKUP_MAX

if TYPE_CHECKING:  # no PyTorch at import: the command line reads the settings without it
    import torch

MAX_NGRAM = 3
"""The longest n-gram a lookup matches (then shorter ones, down to 1)."""

MAX_PROMPT_LOOKUP = PROMPT_LOOKUP_MAX
"""The most tokens a sequence may propose per step, the command line's bound too: each is
one more position in the verifying pass (its compute and activations), and past a few
dozen a guess is rarely accepted whole."""


def propose(ids: Sequence[int], n: int, ends: frozenset[int] | set[int] = frozenset()) -> list[int]:
    """Up to ``n`` tokens that may follow ``ids``, read from ``ids`` themselves; none
    (``[]``) when its last n-gram occurs nowhere earlier with a continuation."""
    length = len(ids)
    if n <= 0 or length < 2:
        return []
    for size in range(min(MAX_NGRAM, length - 1), 0, -1):
        tail = list(ids[length - size:])
        for start in range(length - size):  # windows left to right, the last (the tail itself) excluded
            if list(ids[start:start + size]) == tail:
                chosen = list(ids[start + size:min(start + size + n, length)])
                for i, token in enumerate(chosen):  # a proposal never runs past an end token
                    if token in ends:
                        return chosen[:i]
                return chosen
    return []


def accept(proposals: Sequence[int], logits: torch.Tensor) -> list[int]:
    """The tokens a verifying pass makes: the proposals while each equals the argmax of
    the row before it, then the model's own next token (``logits``: ``[len(proposals) +
    1, vocab]``, the rows of the last token and of each proposal)."""
    best = logits.argmax(dim=-1).tolist()
    made: list[int] = []
    for i, token in enumerate(proposals):
        if best[i] != token:
            break
        made.append(token)
    made.append(best[len(made)])
    return made


def check_lookup(value: int, name: str = "prompt_lookup") -> int:
    """``value`` if it is a number of proposals a step may take (0: none, up to
    :data:`MAX_PROMPT_LOOKUP`), else :class:`~layerfit.errors.InputError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PROMPT_LOOKUP:
        raise InputError(f"{name} must be a whole number from 0 (off) to {MAX_PROMPT_LOOKUP}, not {value!r}")
    return value


@dataclass(frozen=True)
class PromptLookup:
    """The server's prompt lookup: proposals per step for every model (``default``; 0:
    off) and for models named in ``models``; a request's own ``prompt_lookup`` wins."""

    default: int = 0
    models: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        check_lookup(self.default)
        for name, value in self.models.items():
            check_lookup(value, f"the prompt lookup of {name!r}")
        object.__setattr__(self, "models", MappingProxyType(dict(self.models)))

    def of(self, name: str) -> int:
        """Model ``name``'s proposals per step."""
        return self.models.get(name, self.default)

    @classmethod
    def parse(cls, texts: Iterable[str], option: str = "--prompt-lookup") -> PromptLookup:
        """From the command line's values: ``N`` (every model) or ``MODEL=N`` (one model),
        the last of each kind winning; a value that is neither is refused naming ``option``."""
        default, models = 0, {}
        for text in texts:
            name, _, number = text.rpartition("=")
            try:
                value = int(number.strip())
            except ValueError:
                raise InputError(f"{option} takes N or MODEL=N (N from 0 to {MAX_PROMPT_LOOKUP}), not {text!r}") from None
            check_lookup(value, option)
            if name:
                models[name.strip()] = value
            else:
                default = value
        return cls(default, models)


__all__ = ["MAX_NGRAM", "MAX_PROMPT_LOOKUP", "PromptLookup", "accept", "check_lookup", "propose"]
