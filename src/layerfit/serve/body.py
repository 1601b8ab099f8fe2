"""Reading request bodies with deadlines, and counting the memory requests hold.

Request bodies and their decoding live outside the runtime's weight budget, so the
server bounds them separately:

* :class:`RequestMemory` is a pool (``--request-memory``) that every request reserves
  from before it holds bytes: the body as it arrives, then what decoding will make (a
  JSON number becomes a Python float and a list slot before it is a tensor element). A
  request larger than the whole pool is answered 413; one that would overfill it while
  others hold the rest, 429. ``/metrics`` reports the bytes reserved.
* :func:`read_body` reads a body within a deadline (``--body-timeout``) and above a
  minimum rate (``--min-body-rate``, after the first second), and stops at once when
  the server drains: a client that trickles bytes cannot hold a request slot, memory or
  the shutdown. A client that goes away mid-body ends its request quietly.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from layerfit.serve.errors import (
    PayloadTooLargeError,
    ServeError,
    ServerBusyError,
    ShuttingDownError,
)
from layerfit.sizes import format_bytes

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]


class RequestTimeoutError(ServeError):
    """A request body that did not arrive within the deadline or arrived too slowly."""

    status_code = 408


class ClientGoneError(Exception):
    """The client closed the connection before its body was in: nobody to answer."""


@dataclass(frozen=True)
class BodyLimits:
    """How much, how long and how slowly a request body may come."""

    max_bytes: int  # --max-body
    timeout: float  # seconds for the whole body
    min_rate: int  # bytes per second, measured from one second after the first byte was awaited

    def check(self, received: int, elapsed: float) -> None:
        if elapsed > 1.0 and received < self.min_rate * (elapsed - 1.0):
            raise RequestTimeoutError(
                f"the request body arrived at {received / elapsed:,.0f} bytes/s, below the server's "
                f"--min-body-rate of {self.min_rate:,.0f} bytes/s"
            )


class RequestMemory:
    """A pool of bytes that requests reserve before holding them (thread-safe)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.in_use = 0
        self.peak = 0
        self.refused = 0
        self._lock = threading.Lock()

    def reserve(self, nbytes: int, what: str, hint: str = "send binary tensor data, or less") -> None:
        """Take ``nbytes`` for ``what`` or raise 413 (never fits, saying ``hint``) / 429 (not now)."""
        if nbytes <= 0:
            return
        with self._lock:
            if nbytes > self.capacity:
                self.refused += 1
                raise PayloadTooLargeError(
                    f"{what} needs {format_bytes(nbytes)}, more than the server's request memory of "
                    f"{format_bytes(self.capacity)} (--request-memory); {hint}"
                )
            if self.in_use + nbytes > self.capacity:
                self.refused += 1
                raise ServerBusyError(
                    f"{what} needs {format_bytes(nbytes)} of request memory and other requests hold "
                    f"{format_bytes(self.in_use)} of {format_bytes(self.capacity)}; retry shortly"
                )
            self.in_use += nbytes
            self.peak = max(self.peak, self.in_use)

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.in_use -= max(nbytes, 0)

    @contextmanager
    def account(self) -> Iterator[Reservation]:
        """A reservation that grows as the request needs more and is returned at the end."""
        reservation = Reservation(self)
        try:
            yield reservation
        finally:
            self.release(reservation.nbytes)


class Reservation:
    """The bytes one request holds from a :class:`RequestMemory`."""

    def __init__(self, pool: RequestMemory) -> None:
        self.pool = pool
        self.nbytes = 0

    def grow(self, nbytes: int, what: str, hint: str = "send binary tensor data, or less") -> None:
        self.pool.reserve(nbytes, what, hint)
        self.nbytes += nbytes

    def shrink(self, nbytes: int) -> None:
        """Return ``nbytes`` (at most what it holds) the request no longer holds: a body
        dropped once parsed, the work of tokenizing once the ids are made."""
        nbytes = min(max(nbytes, 0), self.nbytes)
        self.pool.release(nbytes)
        self.nbytes -= nbytes


async def read_body(
    receive: Receive,
    limits: BodyLimits,
    reservation: Reservation,
    stopping: asyncio.Event,
    declared: int | None = None,
) -> bytes | bytearray:
    """The whole request body, reserved in ``reservation`` before it is held.

    With ``declared`` (``Content-Length``) the body is reserved up front, so one that
    could never fit is refused before a byte is read, and read into one buffer of that
    size (no copy). A chunked body is reserved twice as it arrives (its chunks, then
    the joined body). Raises :class:`RequestTimeoutError` past the deadline or below the
    rate, :class:`ShuttingDownError` when ``stopping`` is set, :class:`ClientGoneError`
    if the client disconnects.
    """
    if declared is not None and declared > limits.max_bytes:
        raise too_large(limits.max_bytes)
    if declared is not None:
        reservation.grow(declared, "this request's body")
    buffer = bytearray(declared) if declared is not None else None
    chunks: list[bytes] = []
    received = 0
    start = time.monotonic()
    stop = asyncio.ensure_future(stopping.wait())
    try:
        while True:
            remaining = limits.timeout - (time.monotonic() - start)
            if remaining <= 0:
                raise RequestTimeoutError(
                    f"the request body did not arrive within the server's --body-timeout of {limits.timeout:g} s"
                )
            message_task = asyncio.ensure_future(receive())
            done, _ = await asyncio.wait(
                {message_task, stop}, timeout=min(remaining, 1.0), return_when=asyncio.FIRST_COMPLETED
            )
            if message_task not in done:  # no bytes for a while: still in time, fast enough?
                message_task.cancel()
                if stop in done:
                    raise ShuttingDownError("the server is shutting down; the request body was not read")
                limits.check(received, time.monotonic() - start)
                continue
            message = message_task.result()
            if message["type"] == "http.disconnect":
                raise ClientGoneError()
            chunk = message.get("body", b"")
            if chunk:
                if received + len(chunk) > limits.max_bytes:
                    raise too_large(limits.max_bytes)
                if buffer is not None:
                    buffer[received : received + len(chunk)] = chunk  # HTTP/1.1 stops at Content-Length
                else:
                    reservation.grow(2 * len(chunk), "this request's body")
                    chunks.append(chunk)
                received += len(chunk)
            if not message.get("more_body", False):
                return buffer if buffer is not None else b"".join(chunks)
            limits.check(received, time.monotonic() - start)
    finally:
        stop.cancel()


def too_large(limit: int) -> PayloadTooLargeError:
    """The 413 of a body past ``--max-body`` (``limit`` bytes): the data plane's reader and
    the body limit middleware (:mod:`.middleware`) both answer it."""
    return PayloadTooLargeError(
        f"request body exceeds the server's limit of {format_bytes(limit)} ({limit} bytes); "
        "send a smaller tensor or start the server with a larger --max-body"
    )
