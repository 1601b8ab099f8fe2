"""``layerfit generate --prompt-lookup N`` and ``--draft DIR``: several tokens per pass of
the model, through transformers' own assisted generation.

A pass of the model streams its weights once; made to verify guessed tokens, it may
accept several of them, so the text needs fewer passes, fewer streams of the weights.
``--prompt-lookup N`` guesses the next N tokens from an earlier occurrence of the last
ones in the prompt and the text so far (transformers' ``prompt_lookup_num_tokens``);
``--draft DIR`` lets a small prepared model guess them (``assistant_model``). The draft is
held whole (pipeline ``preload``) and its bytes count in the budget: the model's
``--budget`` is what is left after the draft's weights, and a budget that cannot hold both
is one line. With ``--memory-limit`` the draft is loaded first, so the process the limit
measures already holds it, and its KV cache, which grows with the same positions as the
model's, is reserved beside the model's.

Greedy tokens are exactly plain decoding's (a pass keeps the guesses up to the first the
model would not have made, then the model's own token). Sampled tokens (``--do-sample``)
are drawn from the model's own distribution (transformers' speculative sampling), not
the same draws as a plain run's with the same ``--seed``. Refused, one line each: the two
together, beam search or several sequences (assisted generation verifies one sequence,
and transformers would ignore the guesses or fail late), a model whose state cannot go
back (it could not drop a refused guess), and a draft of another vocabulary.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from layerfit.errors import BudgetError, InputError
from layerfit.schedule.decoding.rules import Speculation, vocab_of
from layerfit.sizes import Budget, format_bytes

if TYPE_CHECKING:
    from layerfit.engine import Engine, EngineConfig


def draft_config(config: EngineConfig) -> EngineConfig:
    """How the draft is loaded: every weight held (``preload``), on the model's device,
    read as the model is; no limit or budget of its own (the model's counts it)."""
    from layerfit.engine import EngineConfig

    return EngineConfig(
        pipeline="preload", device=config.device, stages=config.stages, direct_io=config.direct_io,
        dequantize=config.dequantize, verify=config.verify,
    )


def with_draft(config: EngineConfig, total_bytes: int, draft: Engine, flag: str) -> EngineConfig:
    """``config`` (the model's, of ``total_bytes`` of weights) with the ``draft``'s bytes
    taken from its budget; a budget the draft alone fills is one line. No budget: the
    model's pipeline holds what it holds, the draft beside it."""
    if config.budget is None:
        return config
    asked = config.budget.bytes_for(total_bytes)
    held = draft.memory.weight_bytes
    if asked <= held:
        raise BudgetError(
            f"--budget {config.budget} ({format_bytes(asked)}) cannot hold both the draft ({format_bytes(held)}, "
            f"held whole: {flag}) and the model: give a larger --budget or a smaller draft"
        )
    return config.replace(budget=Budget(nbytes=asked - held))


def load_target(directory: str, config: EngineConfig, draft: Engine | None, flag: str) -> Engine:
    """The model's engine, its budget less the draft's bytes (:func:`with_draft`), a memory
    limit reserving the draft's KV cache for the model's ``kv_positions``; a budget the rest
    of which is too small for the model says so, naming the draft's share."""
    from layerfit.engine import load
    from layerfit.engine.fit_memory import kv_bytes_per_position
    from layerfit.store.manifest import read_manifest

    if draft is None:
        return load(directory, config)
    target = with_draft(config, read_manifest(Path(directory)).total_bytes, draft, flag)
    if config.memory_limit is not None:
        target = target.replace(kv_beside_bytes=config.kv_positions * kv_bytes_per_position(draft))
    try:
        return load(directory, target)
    except BudgetError as exc:
        if target.budget is None or config.budget is None:
            raise
        raise BudgetError(
            f"{exc} (--budget {config.budget} less the draft's {format_bytes(draft.memory.weight_bytes)} leaves "
            f"{format_bytes(target.budget.nbytes or 0)} for the model)"
        ) from None


def check(engine: Engine, draft: Engine | None, generation_config: Any, speculation: Speculation) -> None:
    """Refuse, one line each, what assisted generation cannot verify: beam search or
    several sequences (the folder's generation config may ask for them), a model whose
    state cannot go back to drop a refused guess, and a draft of another vocabulary."""
    if not speculation.active:
        return
    flag = "--prompt-lookup" if speculation.prompt_lookup is not None else "--draft"
    beams = getattr(generation_config, "num_beams", 1) or 1
    if beams > 1:
        raise InputError(
            f"{flag} verifies guesses of one sequence; the generation config asks for beam search "
            f"(num_beams {beams}), which would not use them: drop {flag}"
        )
    sequences = getattr(generation_config, "num_return_sequences", 1) or 1
    if sequences > 1:
        raise InputError(f"{flag} verifies guesses of one sequence; the generation config asks for {sequences} "
                         "(num_return_sequences)")
    model = engine.model
    if getattr(model, "_is_stateful", False):
        raise InputError(
            f"{type(model).__name__} keeps a state it cannot take back, so a guess it refuses cannot be "
            f"dropped: {flag} needs a model with a KV cache"
        )
    if draft is not None:
        ours, theirs = vocab_of(model), vocab_of(draft.model)
        if ours != theirs:
            raise InputError(
                f"--draft {draft.directory} has a vocabulary of {theirs} ids and the model {ours}: a draft must "
                "read and make the model's own tokens (the same tokenizer)"
            )


def config_settings(speculation: Speculation) -> dict[str, Any]:
    """The generation config's settings that guess tokens (a draft is an argument of
    ``generate`` instead: ``assistant_model=`` its engine)."""
    return {} if speculation.prompt_lookup is None else {"prompt_lookup_num_tokens": speculation.prompt_lookup}


__all__ = ["check", "config_settings", "draft_config", "load_target", "with_draft"]
