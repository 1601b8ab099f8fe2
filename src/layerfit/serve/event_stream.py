"""Server-sent events: a streamed response of ``data: <json>`` events.

A client that goes away mid-stream is no server error: the send that finds it gone ends
the response quietly, and the events' generator is closed at once (``aclose``), so the
code that makes them — a completion in the decode loop — runs its ``finally`` and takes
its sequence out of the batch then, not when the garbage collector comes by.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

DONE = b"data: [DONE]\n\n"  # the OpenAI stream's last event


def event(data: Any) -> bytes:
    """One event carrying ``data`` as JSON."""
    return b"data: " + orjson.dumps(data) + b"\n\n"


class EventStream(StreamingResponse):
    """``text/event-stream`` from an async iterator of encoded events; ``close`` runs
    once the response ends however it ends (even before the first event was asked for)."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes], close: Callable[[], None] | None = None) -> None:
        super().__init__(events, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._events = events
        self._close = close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except (ClientDisconnect, OSError):
            pass  # the client left: nothing to answer, nothing to log
        finally:
            aclose = getattr(self._events, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
            if self._close is not None:
                self._close()


__all__ = ["DONE", "EventStream", "event"]
