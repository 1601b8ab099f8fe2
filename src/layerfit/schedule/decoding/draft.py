"""A draft model in the decode loop: a small model of the same vocabulary, resident,
proposes each greedy sequence's next tokens; one pass of the target verifies them.

Each step, before the target's pass, the :class:`Drafter` runs up to ``tokens`` passes of
the draft for every sequence that drafts, batched as the target's steps are
(:class:`~layerfit.schedule.decoding.batch_step.BatchStep`): the first feeds each sequence
the ids its draft cache has not seen (its prompt when it joined; after that the tokens
the last step made), each later one the token the draft proposed before, its argmax the
next proposal (a sequence stops proposing at an end token or when it may make no more).
The target then verifies them as it verifies a lookup's
(:func:`~layerfit.schedule.decoding.lookup.accept`): the tokens are the target's greedy
tokens whatever the draft proposes. :meth:`Drafter.settle` cuts the sequence's draft
cache back to the ids it shares with the sequence (its accepted proposals); the next
step feeds the rest.

Memory: the draft's weights stay resident (preloaded) for the loop's life, held in the
ledger under their own key; each drafting sequence's draft cache is counted beside its
target cache (:meth:`Drafter.kv_bytes`).
"""

from __future__ import annotations

from typing import Protocol

from layerfit.schedule.decoding.batch_step import (
    BatchStep,
    Row,
    StepEngine,
    cache_dtype,
    crop,
    kv_bytes_per_token,
    step_kv_bytes,
)
from layerfit.schedule.decoding.rules import vocab_of


class DraftEngine(StepEngine, Protocol):
    """What a drafter needs of its engine (a preloaded :class:`~layerfit.Engine`): a
    step's call and skeleton, and closing."""

    def close(self) -> None: ...

DRAFT_TOKENS = 5
"""Tokens a draft proposes per step unless told otherwise (each is one pass of the draft)."""


class Drafter:
    """The draft ``engine`` (called like its model, preloaded by the caller) proposing up
    to ``tokens`` tokens per step; ``weight_bytes`` it holds resident."""

    def __init__(self, name: str, engine: DraftEngine, weight_bytes: int, tokens: int = DRAFT_TOKENS) -> None:
        self.name = name
        self.engine = engine
        self.step = BatchStep(engine)
        self.tokens = tokens
        self.weight_bytes = weight_bytes
        model = engine.model
        self.per_token = kv_bytes_per_token(model.config, cache_dtype(model))
        self.vocab = vocab_of(model)
        self.passes = 0

    def kv_bytes(self, positions: list[int]) -> int:
        """The draft caches of sequences that may grow to ``positions``, and a draft step's
        padded caches in and out."""
        return step_kv_bytes(positions, self.per_token)

    def propose(self, ids: list[list[int]], states: list[DraftState], rooms: list[int],
                ends: list[frozenset[int]]) -> list[list[int]]:
        """Each sequence's proposals (at most ``rooms[i]``), its draft state advanced past
        every id it fed; ``ids[i]``: the sequence's prompt and tokens so far."""
        proposals: list[list[int]] = [[] for _ in ids]
        live = [i for i, room in enumerate(rooms) if room > 0]
        for i in live:  # the first pass feeds at least the sequence's last id (its logits propose)
            self.settle(states[i], len(ids[i]) - 1)
        first = True
        while live:
            rows = [Row(states[i].cache, states[i].length,
                        ids[i][states[i].length:] if first else [proposals[i][-1]]) for i in live]
            logits, caches = self.step.run(rows)
            self.passes += 1
            going = []
            for i, row, row_logits, cache in zip(live, rows, logits, caches, strict=True):
                states[i].cache, states[i].length = cache, states[i].length + len(row.feed)
                token = int(row_logits.argmax())
                proposals[i].append(token)
                if len(proposals[i]) < rooms[i] and token not in ends[i]:
                    going.append(i)
            live, first = going, False
        return proposals

    def close(self) -> None:
        """Close the draft's engine (its weights leave memory)."""
        self.engine.close()

    @staticmethod
    def settle(state: DraftState, shared: int) -> None:
        """Cut the draft cache to the ``shared`` first ids it has in common with the
        sequence now (its prompt, earlier tokens and accepted proposals)."""
        if state.cache is not None and state.length > shared:
            state.cache, state.length = crop(state.cache, shared), shared


class DraftState:
    """One sequence's draft cache and the ids it covers."""

    __slots__ = ("cache", "length")

    def __init__(self) -> None:
        self.cache = None
        self.length = 0


__all__ = ["DRAFT_TOKENS", "DraftEngine", "DraftState", "Drafter"]
