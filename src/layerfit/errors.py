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


class BudgetError(LayerfitError):
    """A memory budget that cannot be parsed or is below what the model needs."""


class CaptureError(LayerfitError):
    """A model that cannot be captured (no trace, no hooks, unsupported input)."""


class InputError(LayerfitError):
    """An input tensor or file that does not match what the model expects."""


class ReadError(LayerfitError):
    """Reading a unit's weights failed during inference."""
