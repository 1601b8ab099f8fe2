"""Errors of the inference server, each carrying the HTTP status it is answered with.

As in Seldon MLServer, there is one error type: every failure the server reports is a
:class:`~layerfit.errors.LayerfitError` and becomes ``{"error": "<message>"}`` with the
status from :func:`status_of`. The errors below are the server's own; errors raised by
the layers underneath (the runtime, the store) are mapped by their class, so a corrupt
model folder is a 400, a full runtime queue a 429, a model that is not loaded, a job
that timed out or one the memory budget cannot run (the server's configuration, not
the request's fault) a 503, without the server re-wrapping them.
"""

from __future__ import annotations

from typing import Any

from layerfit.errors import (
    CorruptStoreError,
    GenerationTooLargeError,
    JobRejectedError,
    JobTimeoutError,
    LayerfitError,
    ModelNotReadyError,
    QueueFullError,
    RequestTooLargeError,
    UnknownModelError,
)


class ServeError(LayerfitError):
    """A request the server refuses; ``status_code`` is the HTTP status of the answer."""

    status_code = 400


class BadRequestError(ServeError):
    """A malformed request: bad JSON, wrong datatype or shape, inconsistent binary data."""

    status_code = 400


class ModelNotFoundError(ServeError):
    """A model name (or version) that is not in the repository."""

    status_code = 404


class PayloadTooLargeError(ServeError):
    """A request body larger than the server's ``--max-body`` limit."""

    status_code = 413


class ServerBusyError(ServeError):
    """Every admission slot is taken (the request queue is full): try again later."""

    status_code = 429


class ShuttingDownError(ServeError):
    """The server is draining after SIGTERM and accepts no new inference."""

    status_code = 503


# OpenAI's error ``type`` and ``code`` strings by status (what its clients and tools branch on)
OPENAI_ERRORS = {
    400: ("invalid_request_error", "invalid_request"),
    404: ("invalid_request_error", "model_not_found"),
    408: ("invalid_request_error", "request_timeout"),
    413: ("invalid_request_error", "request_too_large"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    503: ("server_error", "server_unavailable"),
}


CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # OpenAI's code for a prompt past the model's positions


def openai_code(exc: BaseException) -> str | None:
    """OpenAI's ``code`` for ``exc`` where its class decides it, not its status alone: a
    413 is ``context_length_exceeded`` only when the prompt is past the model's positions
    (a body past ``--max-body`` or ``--request-memory`` is ``request_too_large``)."""
    return CONTEXT_LENGTH_EXCEEDED if isinstance(exc, GenerationTooLargeError) else None


def error_body(path: str, status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """The error in the shape of the API asked: OpenAI's under ``/v1/`` (what its clients
    read: a ``type`` and a ``code`` string, ``code`` when given, else the status's), the
    Open Inference Protocol's elsewhere."""
    if not path.startswith("/v1/"):
        return {"error": message}
    kind, by_status = OPENAI_ERRORS.get(status, ("invalid_request_error" if status < 500 else "server_error", None))
    code = code or by_status
    param = message.split("invalid request: ", 1)[1].split(":", 1)[0] if "invalid request: " in message else None
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def status_of(exc: BaseException) -> int:
    """The HTTP status a failure is answered with (500 for anything unexpected)."""
    if isinstance(exc, ServeError):
        return exc.status_code
    if isinstance(exc, UnknownModelError):
        return 404
    if isinstance(exc, GenerationTooLargeError | RequestTooLargeError):
        return 413
    if isinstance(exc, QueueFullError):
        return 429
    if isinstance(exc, ModelNotReadyError | JobTimeoutError | JobRejectedError | CorruptStoreError):
        return 503  # the server's state (a corrupt model is taken out of service), not the request
    if isinstance(exc, LayerfitError):
        return 400
    return 500
