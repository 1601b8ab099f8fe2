"""Error types raised for bad input.

Every error a user can cause derives from :class:`LayerfitError`; its message says what
was wrong and what to do. The CLI prints the message alone and exits non-zero.
"""

from __future__ import annotations


class LayerfitError(Exception):
    """Base class of every error caused by the user's input or environment."""


class UnknownModelError(LayerfitError):
    """A model name that is neither in the zoo nor an importable factory."""


class FactoryImportError(LayerfitError):
    """A `package.module:factory` path that cannot be imported or called."""


class CheckpointError(LayerfitError):
    """A checkpoint whose tensors do not match the model (missing, extra, wrong shape)."""


class ManifestError(LayerfitError):
    """A prepared-model manifest that is missing, malformed or of another format version."""


class CorruptStoreError(LayerfitError):
    """A prepared model whose weight bytes are truncated, altered or changed on disk."""


class OutputExistsError(LayerfitError):
    """An output path that already exists (pass --force to replace it)."""


class OutputPathError(LayerfitError):
    """An output path that cannot be written: a directory, a missing or read-only
    folder, or an extension the writer does not produce."""


class BudgetError(LayerfitError):
    """A memory budget that cannot be parsed or is below what the model needs."""


class CaptureError(LayerfitError):
    """A model that cannot be captured (no trace, no hooks, unsupported input)."""


class InputError(LayerfitError):
    """An input tensor or file that does not match what the model expects."""


class ReadError(LayerfitError):
    """Reading a unit's weights failed during inference."""


class PlanError(LayerfitError):
    """Tensor usage records, a memory plan or a planning strategy that is not valid."""


class ScheduleError(LayerfitError):
    """A scheduling request that cannot be served: bad profile, policy, scheme or job."""


class WorkloadError(ScheduleError):
    """A workload file that is malformed; the message names the line and the field."""


class JobRejectedError(ScheduleError):
    """A job whose largest task cannot fit in the memory budget even when run alone."""

    def __init__(self, message: str, min_budget: int) -> None:
        super().__init__(message)
        self.min_budget = min_budget


class ModelOverBudgetError(ScheduleError):
    """A model that cannot run within the runtime's budget (its resident part beside its
    largest unit needs more); ``min_budget`` is the least budget it runs within."""

    def __init__(self, message: str, min_budget: int) -> None:
        super().__init__(message)
        self.min_budget = min_budget


class QueueFullError(ScheduleError):
    """A request refused because the runtime already holds its limit of unfinished jobs;
    retry later or raise the queue limit."""


class GenerationTooLargeError(ScheduleError):
    """A generation request that can never run: its prompt and new tokens pass the
    model's positions, or its KV cache beside the model's weight buffers passes the
    memory budget (the message says which, and by how much)."""


class RequestTooLargeError(ScheduleError):
    """An inference request whose input is longer than the model's positions, or whose
    activations at its shape cannot fit the memory budget beside the model's weights."""


class ModelNotReadyError(ScheduleError):
    """A request for a model that exists in the repository but is not loaded (never
    loaded, unloaded, or failed to load: the message gives the reason)."""


class JobTimeoutError(ScheduleError, TimeoutError):
    """A job that did not finish within its timeout; it was cancelled and its memory freed."""


class TradeoffError(LayerfitError):
    """A memory-throughput trade-off input that is malformed (application file, layer list,
    partition, constraint) or a model that cannot be processed by parts as asked."""


class PartitionError(BudgetError):
    """A budget no SwapNet block partition can satisfy (two blocks in flight plus the
    reserve). ``layer`` names the layer that makes it impossible and ``minimum_budget``
    is the smallest budget that works."""

    def __init__(self, message: str, *, layer: str, minimum_budget: int) -> None:
        super().__init__(message)
        self.layer = layer
        self.minimum_budget = minimum_budget


class ProfileError(LayerfitError):
    """A device profile (SwapNet delay model) that cannot be read, written or fitted."""


class ProfileWarning(UserWarning):
    """A device profile that is missing, from another device or from another format
    version: it is not used and the delays are measured instead."""
