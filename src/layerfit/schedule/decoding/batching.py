"""Continuous batching: the sequences of one language model decode together, each step
one engine pass (one streamed read of each unit) for all of them.

A :class:`DecodeLoop` owns one engine of the model and one thread. Requests are
:meth:`~DecodeLoop.submit`-ted as :class:`Sequence`\\ s and wait, in arrival order, until
their memory fits; at each step boundary the loop admits the waiting ones that fit
(they feed their prompt in this step's pass: their prefill), runs one
:class:`~layerfit.schedule.decoding.batch_step.BatchStep` for every sequence in flight, gives
each its next token (its own :mod:`~layerfit.schedule.decoding.sampling` settings and random
generator), and lets the finished, the cancelled and the disconnected leave: their
cache is dropped and its bytes returned at once.

Memory is the runtime's :class:`~layerfit.schedule.ledger.MemoryLedger`'s: while any
sequence is in flight the loop *holds* its engine's weight buffers and the KV cache of
its sequences, each counted at the most it may grow to (prompt plus ``max_tokens``
positions; :func:`~layerfit.schedule.decoding.batch_step.step_kv_bytes`), so admitting a
sequence never takes the ledger past the budget. A sequence that could not fit even
alone is refused at once (:class:`~layerfit.errors.GenerationTooLargeError`, saying
the bytes); one that fits alone waits for the memory others hold, and the queue of
waiting sequences is bounded (:class:`~layerfit.errors.QueueFullError`). The loop
waits on the ledger's condition, so memory returned by any task wakes it; nothing polls.

**Several tokens per pass.** A greedy sequence given a ``lookup`` proposes up to that many
tokens from its own n-grams each step (:mod:`~layerfit.schedule.decoding.lookup`): it feeds
its last token and the proposals in the same pass as every other sequence (the step pads
rows of different widths), keeps the proposals the model's argmax agrees with and the
model's next token, and its cache drops the rest. The tokens are plain greedy decoding's;
a step makes 1 to ``lookup + 1`` of them for that sequence, never past ``max_tokens`` or
an end token. A sampled sequence makes one per step.

A loop given a ``drafter`` (:mod:`~layerfit.schedule.decoding.draft`) lets the sequences
that ask for it take their proposals from a small resident draft model instead, its
passes batched across them before each step's pass.

**Kept weights.** Given ``kept_budget``, the loop's engine runs ``auto`` at that weight
budget while sequences are in flight — it keeps as many units in memory as the budget
holds and streams only the rest, so each step reads fewer bytes — and holds those bytes
in the ledger. If the kept weights and the waiting sequence's cache do not fit beside
what the ledger already holds, the loop runs lean instead (only the stream's buffers);
when no sequence is left it drops the kept units (``async`` at the engine's own size),
so an idle model holds no more than its stream's buffers while other work uses the
budget. The engine is reconfigured on the loop's thread between steps, never under the
ledger's lock.

**Retiring.** The runtime owns the loops (:mod:`layerfit.schedule.runtime.decoders`): when
a model is unloaded or replaced its loop is :meth:`~DecodeLoop.retire`-d — it takes no new
sequence, decodes the ones it has to their end, then returns its memory and closes its
engine on its own thread; :meth:`~DecodeLoop.close` ends every sequence at once.

**One sequence's failure is its own.** A sequence whose prompt holds an id outside the
vocabulary is refused at :meth:`~DecodeLoop.submit`, before it can join a batch. If a
batched pass still fails, each of its sequences is run alone for that step: the ones
that fail alone end with their error, the others go on with their own logits (the
model's for them alone, as in any step), and choosing a token that fails ends only
that sequence.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from layerfit.backports import StrEnum
from layerfit.errors import (
    GenerationTooLargeError,
    ModelNotReadyError,
    QueueFullError,
    ScheduleError,
)
from layerfit.schedule.decoding.batch_step import (
    BatchStep,
    Layers,
    Row,
    StepEngine,
    cache_dtype,
    crop,
    kv_bytes_per_token,
    step_kv_bytes,
)
from layerfit.schedule.decoding.draft import Drafter, DraftState
from layerfit.schedule.decoding.lookup import accept, propose
from layerfit.schedule.decoding.rules import check_prompt_ids, vocab_of
from layerfit.schedule.decoding.sampling import Sampling, choose
from layerfit.schedule.ledger import MemoryLedger
from layerfit.sizes import format_bytes

log = logging.getLogger("layerfit.generation")


class Finish(StrEnum):
    """Why a sequence ended, as the OpenAI API names it (``cancelled``: its client left)."""

    STOP = "stop"  # an end token (or, above, a stop string)
    LENGTH = "length"  # max_tokens
    CANCELLED = "cancelled"


OnToken = Callable[[int | None, "Finish | None", "BaseException | None"], None]
"""Called on the loop's thread with each new token, then once with ``None`` and why the
sequence ended (or the error that ended it)."""


@dataclass
class Sequence:
    """One request in the loop: its prompt, how many tokens it may make, how it chooses
    them, which tokens end it, and where its tokens go."""

    prompt: list[int]
    max_tokens: int
    sampling: Sampling
    end_tokens: frozenset[int]
    on_token: OnToken
    id: int = 0
    tokens: list[int] = field(default_factory=list)
    cache: Layers | None = field(default=None, repr=False)
    cancelled: bool = False
    generator: torch.Generator | None = field(default=None, repr=False)
    lookup: int = 0  # prompt lookup: the most tokens it proposes per step (greedy only; 0: off)
    draft: bool = False  # the loop's draft model proposes its tokens (greedy only; not with lookup)
    drafted: DraftState = field(default_factory=DraftState, repr=False)

    @property
    def positions(self) -> int:
        """The most positions its cache may hold: the prompt and every new token."""
        return len(self.prompt) + self.max_tokens

    def cancel(self) -> None:
        """Leave at the next step boundary (thread-safe: a flag the loop reads)."""
        self.cancelled = True


class WeightBuffers(Protocol):
    """An engine's memory as the loop counts it: the bytes of its weight buffers."""

    @property
    def weight_bytes(self) -> int: ...


class DecodeEngine(StepEngine, Protocol):
    """What the loop needs of an engine (a streaming :class:`~layerfit.Engine`): a step's
    call and skeleton, its weight buffers' bytes, a new budget and pipeline between
    steps, and closing."""

    @property
    def memory(self) -> WeightBuffers: ...

    @property
    def bytes_read(self) -> int:
        """Bytes the engine read from storage since it was loaded."""
        ...

    def reconfigure(self, *, budget: int | None = None, pipeline: str | None = None) -> float: ...

    def close(self) -> None: ...


class DecodeLoop:
    """The decode loop of one model: ``engine`` (a streaming :class:`~layerfit.Engine`
    of a causal language model), its memory held in ``ledger``, at most ``max_waiting``
    sequences waiting for memory."""

    def __init__(
        self, name: str, engine: DecodeEngine, ledger: MemoryLedger, *, max_waiting: int,
        kept_budget: int | None = None, drafter: Drafter | None = None,
    ) -> None:
        self.name = name
        self.engine = engine
        self.step = BatchStep(engine)
        self.ledger = ledger
        self.max_waiting = max_waiting
        self.per_token = kv_bytes_per_token(engine.model.config, cache_dtype(engine.model))
        self.vocab = vocab_of(engine.model)  # token ids a prompt may hold: 0 to vocab - 1
        self.lean_bytes = self.kept_bytes = int(engine.memory.weight_bytes)
        self.kept_budget = kept_budget if kept_budget is not None and kept_budget > self.lean_bytes else None
        if self.kept_budget is not None:  # measure the kept configuration's buffers, then idle lean
            engine.reconfigure(budget=self.kept_budget, pipeline="auto")
            self.kept_bytes = int(engine.memory.weight_bytes)
            engine.reconfigure(budget=None, pipeline="async")
            self.lean_bytes = int(engine.memory.weight_bytes)
        self.weight_bytes = self.lean_bytes  # what the sequences in flight run with
        self._configured = self.lean_bytes  # what the engine is configured for now
        self.kept_steps = 0  # steps run with the kept weights
        self._key = ("generation", name, id(self))
        self._draft_key = ("draft", name, id(self))
        if drafter is not None and not ledger.hold(self._draft_key, drafter.weight_bytes):
            log.warning("model %r: its draft %r (%s) does not fit the budget now; it decodes without it", name,
                        drafter.name, format_bytes(drafter.weight_bytes))
            drafter.close()
            drafter = None
        self.drafter = drafter  # resident, its weights held under their own key for the loop's life
        self._condition = ledger.condition  # the runtime's lock: memory freed anywhere wakes the loop
        self._waiting: deque[Sequence] = deque()
        self._active: list[Sequence] = []
        self._ids = itertools.count(1)
        self._closing = False  # close(): every sequence ends now
        self._retiring = False  # retire(): no new sequence; the loop ends after the last
        self._engine_closed = False
        self.steps = 0  # engine passes
        self.sequence_steps = 0  # tokens made, summed over the sequences of each pass
        self.proposed = 0  # tokens prompt lookup proposed
        self.accepted = 0  # of them, the ones a pass verified (tokens made beyond one per sequence a pass)
        self.most_in_flight = 0
        self.cancelled = 0  # sequences that left before they ended (client gone, stop string)
        self._thread = threading.Thread(target=self._run, name=f"layerfit-decode-{name}", daemon=True)
        self._thread.start()

    # --- admission ---------------------------------------------------------------------

    def need(self, sequences: list[Sequence], weight_bytes: int | None = None) -> int:
        """The bytes the loop holds while ``sequences`` are in flight (with the weight
        buffers of ``weight_bytes``; default: the configuration running now)."""
        if not sequences:
            return 0
        weights = self.weight_bytes if weight_bytes is None else weight_bytes
        drafts = self.drafter.kv_bytes([s.positions for s in sequences if s.draft]) if self.drafter else 0
        return weights + step_kv_bytes([s.positions for s in sequences], self.per_token) + drafts

    def submit(self, sequence: Sequence) -> Sequence:
        """Queue ``sequence`` for the next step; refuse a prompt that is empty or holds an
        id outside the vocabulary (it would fail the pass of every sequence beside it), one
        that can never fit the budget (413) or that finds the waiting queue full (429)."""
        self.check_prompt(sequence.prompt)
        alone = self.need([sequence], self.lean_bytes)
        if alone > self.ledger.budget:
            raise GenerationTooLargeError(
                f"the prompt's {len(sequence.prompt)} tokens and max_tokens {sequence.max_tokens} need "
                f"{format_bytes(alone - self.lean_bytes)} of KV cache beside the model's "
                f"{format_bytes(self.lean_bytes)} of weight buffers, more than the memory budget of "
                f"{format_bytes(self.ledger.budget)}: shorten the prompt or ask for fewer tokens"
            )
        with self._condition:
            if self._closing:
                raise ScheduleError(f"the decode loop of {self.name!r} is shut down")
            if self._retiring:
                raise ModelNotReadyError(f"model {self.name!r} was unloaded or replaced: send the request again")
            if len(self._waiting) >= self.max_waiting:
                raise QueueFullError(
                    f"{len(self._waiting)} generation requests of {self.name!r} already wait for memory "
                    f"(the queue limit): retry later"
                )
            sequence.id = next(self._ids)
            sequence.generator = sequence.sampling.generator()
            self._waiting.append(sequence)
            self._condition.notify_all()
        return sequence

    def check_prompt(self, prompt: list[int] | tuple[int, ...]) -> None:
        """Refuse (:class:`~layerfit.errors.InputError`) an empty prompt or one holding an id
        outside ``0 .. vocab - 1`` (:func:`~layerfit.schedule.decoding.rules.check_prompt_ids`)."""
        check_prompt_ids(prompt, self.vocab, f"the vocabulary of {self.name!r}")

    def cancel(self, sequence: Sequence) -> None:
        """Take ``sequence`` out: a waiting one at once, one in flight at the step's end."""
        with self._condition:
            sequence.cancel()
            self._condition.notify_all()

    STATS = ("steps", "sequence_steps", "in_flight", "waiting", "most_in_flight", "cancelled", "held_bytes",
             "kept_steps", "kept_weight_bytes", "lean_weight_bytes", "read_bytes", "proposed", "accepted",
             "draft_passes")
    """The keys of :meth:`stats`."""

    def stats(self) -> dict[str, int]:
        with self._condition:
            values = (self.steps, self.sequence_steps, len(self._active), len(self._waiting), self.most_in_flight,
                      self.cancelled, self.ledger.held(self._key), self.kept_steps, self.kept_bytes, self.lean_bytes,
                      self.engine.bytes_read, self.proposed, self.accepted,
                      self.drafter.passes if self.drafter is not None else 0)
            return dict(zip(self.STATS, values, strict=True))

    # --- the loop --------------------------------------------------------------------------

    def _admit_locked(self) -> list[Sequence]:
        """Drop cancelled sequences, admit waiting ones in order while they fit; the
        sequences of the next step (lock held)."""
        ended = [s for s in self._waiting if s.cancelled] + [s for s in self._active if s.cancelled]
        self._waiting = deque(s for s in self._waiting if not s.cancelled)
        self._active = [s for s in self._active if not s.cancelled]
        if not self._active and self._waiting:  # idle until now: kept weights if they fit, else lean
            first = [self._waiting[0]]
            kept = self.kept_bytes > self.lean_bytes and self.ledger.hold(self._key, self.need(first, self.kept_bytes))
            self.weight_bytes = self.kept_bytes if kept else self.lean_bytes
        while self._waiting and self.ledger.hold(self._key, self.need([*self._active, self._waiting[0]])):
            self._active.append(self._waiting.popleft())
        if not self._active:
            self.weight_bytes = self.lean_bytes
            if self._configured > self.lean_bytes:  # kept units still in memory: held until dropped
                self.ledger.hold(self._key, self._configured)
            else:
                self.ledger.release(self._key)
        else:
            self.ledger.hold(self._key, self.need(self._active))  # shrinking always succeeds
        self.cancelled += len(ended)
        for sequence in ended:
            sequence.cache = None
            _tell(sequence, None, Finish.CANCELLED, None)
        return list(self._active)

    def _run(self) -> None:
        while True:
            with self._condition:
                batch = self._admit_locked()
                idle = not batch and not self._closing
            if idle:
                self._configure(self.lean_bytes)  # drop the kept units before waiting
                with self._condition:
                    if not self._active:
                        self.ledger.release(self._key)  # and only then their bytes
            with self._condition:
                batch = self._admit_locked()
                while not batch and not self._closing and not (self._retiring and not self._waiting):
                    self._condition.wait()
                    batch = self._admit_locked()
                if not batch:  # closed, or retired with nothing left to decode
                    break
                self.most_in_flight = max(self.most_in_flight, len(batch))
                weights = self.weight_bytes
            try:
                self._configure(weights)
            except BaseException as exc:  # the engine cannot run: every sequence ends with the error
                self._fail(batch, exc)
                continue
            try:
                self._step(batch)
            except BaseException as exc:
                if len(batch) == 1:
                    self._fail(batch, exc)
                    continue
                # whose fault? each sequence runs this step alone; only those that fail alone end
                log.debug("decode step of %s failed for %d sequences: %s; running each alone", self.name,
                          len(batch), exc)
                for sequence in batch:
                    try:
                        self._step([sequence])
                    except BaseException as alone:
                        self._fail([sequence], alone)
            self.kept_steps += weights == self.kept_bytes > self.lean_bytes
        if not self._closing:  # retired: the last sequence has ended, so the loop closes itself
            self._shut()

    def _fail(self, batch: list[Sequence], exc: BaseException) -> None:
        """End ``batch``'s sequences with ``exc``, returning their memory."""
        log.debug("decode step of %s failed: %s", self.name, exc)
        with self._condition:
            for sequence in batch:
                sequence.cancelled = True
                sequence.cache = None
            self._active = [s for s in self._active if s not in batch]
            self._admit_locked()  # returns the failed sequences' bytes
        for sequence in batch:
            _tell(sequence, None, None, exc)

    def _configure(self, weight_bytes: int) -> None:
        """Run the engine with the kept weights or lean (between steps, on the loop's thread;
        the ledger already holds ``weight_bytes`` when they grow)."""
        if weight_bytes == self._configured or self.kept_budget is None:
            return
        if weight_bytes == self.kept_bytes:
            self.engine.reconfigure(budget=self.kept_budget, pipeline="auto")
        else:
            self.engine.reconfigure(budget=None, pipeline="async")
        self._configured = weight_bytes

    def _step(self, batch: list[Sequence]) -> None:
        """One pass for ``batch``; each sequence gets its tokens (one, or with prompt lookup
        its accepted proposals and the model's next) or leaves."""
        try:
            proposed = self._propose(batch)
            rows = [Row(s.cache, _cached(s), (list(s.prompt) if s.cache is None else [s.tokens[-1]]) + p, len(p))
                    for s, p in zip(batch, proposed, strict=True)]
            if any(proposed):  # each row's logits of its last token and its proposals
                logits, caches = self.step.verify_run(rows)
            else:  # a plain step: the last position's logits of each row
                last, caches = self.step.run(rows)
                logits = [row[None] for row in last]
        except BaseException:  # no token made: the drafts forget what they proposed (run again alone)
            for sequence in batch:
                if sequence.draft:
                    Drafter.settle(sequence.drafted, len(sequence.prompt) + len(sequence.tokens))
            raise
        done: list[Sequence] = []
        failed: list[tuple[Sequence, Exception]] = []
        made = accepted = 0
        for sequence, row, row_logits, cache in zip(batch, rows, logits, caches, strict=True):
            sequence.cache = cache
            if sequence.cancelled:
                continue
            proposals = row.feed[len(row.feed) - row.proposals:] if row.proposals else []
            try:
                tokens = accept(proposals, row_logits) if proposals else [
                    choose(row_logits[-1], sequence.sampling, sequence.generator)]
            except Exception as exc:  # this sequence's choice (its logits, its settings): it alone ends
                failed.append((sequence, exc))
                continue
            if proposals:  # the cache holds every position fed; the rejected proposals' are dropped
                sequence.cache = crop(cache, row.length + len(row.feed) - len(proposals) + len(tokens) - 1)
                if sequence.draft:  # the draft keeps what it shares: the ids before and the accepted
                    Drafter.settle(sequence.drafted, len(sequence.prompt) + len(sequence.tokens) + len(tokens) - 1)
            finish, given = self._give(sequence, tokens)
            made += given
            accepted += min(given, len(tokens) - 1)  # all but the model's own last token were proposals
            if finish is not None:
                done.append(sequence)
        with self._condition:
            self.steps += 1
            self.sequence_steps += made
            self.proposed += sum(len(p) for p in proposed)
            self.accepted += accepted
            ended = done + [sequence for sequence, _ in failed]
            for sequence in ended:
                sequence.cache = None
            self._active = [s for s in self._active if s not in ended]
        for sequence, exc in failed:
            _tell(sequence, None, None, exc)

    def _propose(self, batch: list[Sequence]) -> list[list[int]]:
        """The tokens each sequence proposes this step (greedy ones only): the draft's, for
        those that draft, prompt lookup's for those that look up; never more than it may
        still make less one (the model's own next token)."""
        rooms = [0 if not s.sampling.greedy else min(
            self.drafter.tokens if s.draft and self.drafter else s.lookup, s.max_tokens - len(s.tokens) - 1)
            for s in batch]
        proposed = [propose([*s.prompt, *s.tokens], room, s.end_tokens) if room > 0 and not s.draft else []
                    for s, room in zip(batch, rooms, strict=True)]
        drafting = [i for i, s in enumerate(batch) if s.draft and rooms[i] > 0]
        if drafting and self.drafter is not None:
            drafts = self.drafter.propose([[*batch[i].prompt, *batch[i].tokens] for i in drafting],
                                          [batch[i].drafted for i in drafting], [rooms[i] for i in drafting],
                                          [batch[i].end_tokens for i in drafting])
            for i, tokens in zip(drafting, drafts, strict=True):
                proposed[i] = tokens
        return proposed

    @staticmethod
    def _give(sequence: Sequence, tokens: list[int]) -> tuple[Finish | None, int]:
        """Hand ``tokens`` to the sequence in order, up to an end token or ``max_tokens``:
        why it ended (None: it goes on) and how many of them it took."""
        finish = None
        given = 0
        for token in tokens:
            sequence.tokens.append(token)
            given += 1
            finish = Finish.STOP if token in sequence.end_tokens else (
                Finish.LENGTH if len(sequence.tokens) >= sequence.max_tokens else None
            )
            if finish is Finish.STOP:
                _tell(sequence, None, finish, None)  # the end token is not part of the text
                break
            _tell(sequence, token, None, None)
            if finish is not None:
                _tell(sequence, None, finish, None)
                break
        return finish, given

    def retire(self) -> None:
        """Take no new sequence; the ones submitted decode to their end, then the loop
        returns its memory and closes its engine (its model was unloaded or replaced)."""
        with self._condition:
            self._retiring = True
            self._condition.notify_all()

    @property
    def retired(self) -> bool:
        """Whether :meth:`retire` or :meth:`close` was called."""
        return self._retiring or self._closing

    def close(self) -> None:
        """Cancel every sequence, end the thread and close the engine."""
        with self._condition:
            self._closing = True
            for sequence in [*self._waiting, *self._active]:
                sequence.cancel()
            self._condition.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()
        self._shut()

    def _shut(self) -> None:
        """Return the memory the loop holds and close the engine (once)."""
        with self._condition:
            self._admit_locked()
            self.ledger.release(self._key)
            if self._engine_closed:
                return
            self._engine_closed = True
        self.engine.close()
        if self.drafter is not None:
            self.drafter.close()
            with self._condition:
                self.ledger.release(self._draft_key)


def _cached(sequence: Sequence) -> int:
    """Positions in the sequence's cache: nothing before its prefill; after it, the
    prompt and every token but the last (fed this step)."""
    return 0 if sequence.cache is None else len(sequence.prompt) + len(sequence.tokens) - 1


def _tell(sequence: Sequence, token: int | None, finish: Finish | None, error: BaseException | None) -> None:
    """Hand a token or the end to the sequence's owner; its failure ends nothing else."""
    with contextlib.suppress(Exception):
        sequence.on_token(token, finish, error)


__all__ = ["DecodeEngine", "DecodeLoop", "Finish", "Sequence", "WeightBuffers"]
