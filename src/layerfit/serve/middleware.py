"""ASGI middleware of the server: the request body limit and request metrics.

Both are plain ASGI wrappers (not Starlette's ``BaseHTTPMiddleware``), so they neither
buffer bodies nor interfere with cancellation.

The body limit is enforced twice: a declared ``Content-Length`` above the limit is
answered 413 before a byte of the body is read, and a body without one (chunked) is
counted as it arrives and refused as soon as it passes the limit, so no request can make
the server hold more than ``max_body`` bytes for it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.responses import JSONResponse

from layerfit.serve.body import too_large
from layerfit.serve.errors import error_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyLimitMiddleware:
    """Answer 413 to any request whose body is larger than ``max_bytes``."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        # Oversized bodies up to this size are drained before the 413; larger ones are
        # refused at once and the connection closed (never read into memory either way).
        self.drain_bytes = min(4 * max_bytes, 16 * 1024 * 1024)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            if int(declared) <= self.drain_bytes:
                # Read and drop a moderately oversized body first: answering while the
                # client is still sending makes it see a reset instead of the 413.
                await _drain(receive)
            body = error_body(scope.get("path", ""), 413, str(too_large(self.max_bytes)))
            response = JSONResponse(body, status_code=413, headers={"connection": "close"})
            await response(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise too_large(self.max_bytes)
            return message

        await self.app(scope, limited_receive, send)


class MetricsMiddleware:
    """Count every answered request and time it, labelled by route template and model."""

    def __init__(self, app: ASGIApp, observe: Callable[[Scope, int, float], None]) -> None:
        self.app = app
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            self.observe(scope, status, time.perf_counter() - start)


async def _drain(receive: Receive) -> None:
    """Consume the request body chunk by chunk, keeping none of it."""
    while True:
        message = await receive()
        if message["type"] != "http.request" or not message.get("more_body", False):
            return


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1").strip()
    return None
