"""Triton's generate extension: ``POST /v2/models/{name}[/versions/{v}]/generate`` and
``…/generate_stream``.

The body is ``{"text_input": "...", "max_tokens": 16, "temperature": 0.7, ...}`` (the
parameters at the top level as model inputs, or in ``"parameters"``); the answer is
``{"model_name", "model_version", "text_output"}``. ``generate_stream`` answers the same
object as server-sent events, one per token with the text that token adds (a last one
with text held back for a stop string, when there is some). Greedy unless a
``temperature`` is given.

Everything that can be refused is refused before the first byte of the answer: unknown
model or one that cannot generate (400), malformed parameters (400 naming the field),
a prompt past the model's positions or the budget (413), a full queue (429), a server
shutting down (503). A failure after the stream began arrives as a last event
``{"error": "..."}``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from starlette.responses import JSONResponse

from layerfit.errors import LayerfitError
from layerfit.serve.codec import parse_body
from layerfit.serve.dataplane import DataPlane
from layerfit.serve.event_stream import EventStream, event
from layerfit.serve.generate_types import DEFAULT_MAX_TOKENS, TritonGenerate
from layerfit.serve.generation_service import Completion, GenerationService, TextRequest, stops_of
from layerfit.serve.registry import VERSION


def add_generate_routes(app: Any, dataplane: DataPlane, service: GenerationService) -> None:
    """The two routes of the generate extension, with and without a version."""

    async def start(name: str, version: str | None, request: Request) -> tuple[Completion, contextlib.ExitStack]:
        if version not in (None, "", VERSION):
            dataplane.registry.info(name, version)  # 404 naming the versions
        body = parse_body(await request.body(), TritonGenerate)
        model = await service.model(name)
        fields = body.merged()
        text = TextRequest(
            name, service.encode(model, body.text_input), fields.max_tokens or DEFAULT_MAX_TOKENS,
            fields.sampling(default_temperature=0.0), stops_of(fields.stop),
        )
        return service.start_admitted(model, text, dataplane.admit)

    @app.post("/v2/models/{name}/generate")
    @app.post("/v2/models/{name}/versions/{version}/generate")
    async def generate(name: str, request: Request, version: str | None = None) -> JSONResponse:
        completion, slot = await start(name, version, request)
        with slot:
            text = await completion.collect()
        return JSONResponse({"model_name": name, "model_version": VERSION, "text_output": text})

    @app.post("/v2/models/{name}/generate_stream")
    @app.post("/v2/models/{name}/versions/{version}/generate_stream")
    async def generate_stream(name: str, request: Request, version: str | None = None) -> EventStream:
        completion, slot = await start(name, version, request)

        async def events() -> AsyncIterator[bytes]:
            try:
                async for delta in completion:
                    if delta.token or delta.text:
                        yield event({"model_name": name, "model_version": VERSION, "text_output": delta.text})
            except LayerfitError as exc:
                yield event({"error": str(exc)})

        return EventStream(events(), close=lambda: (completion.cancel(), slot.close()))


__all__ = ["add_generate_routes"]
