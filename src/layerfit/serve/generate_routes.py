"""Triton's generate extension: ``POST /v2/models/{name}[/versions/{v}]/generate`` and
``…/generate_stream``.

The body is ``{"text_input": "...", "max_tokens": 16, "temperature": 0.7, ...}`` (the
parameters at the top level as model inputs, or in ``"parameters"``); the answer is
``{"model_name", "model_version", "text_output"}``. ``generate_stream`` answers the same
object as server-sent events, one per token with the text that token adds (a last one
with text held back for a stop string, when there is some). Greedy unless a
``temperature`` is given.

Everything that can be refused is refused before the first byte of the answer, and what
can be refused before the body is read is: an unknown model (404), one that cannot
generate (400) or is not loaded (503), a server shutting down (503). The body is read and
parsed within the server's bounds (:mod:`layerfit.serve.generate_body`); then malformed
parameters (400 naming the field), a prompt past the model's positions or the budget
(413), a full queue (429). A failure after the stream began arrives as a last event
``{"error": "..."}``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from starlette.responses import JSONResponse

from layerfit.errors import LayerfitError
from layerfit.serve.dataplane import DataPlane
from layerfit.serve.errors import ShuttingDownError
from layerfit.serve.event_stream import EventStream, event
from layerfit.serve.generate_body import read_request, text_prompt
from layerfit.serve.generate_types import DEFAULT_MAX_TOKENS, TritonGenerate
from layerfit.serve.generation_service import Completion, GenerationService, TextRequest, stops_of
from layerfit.serve.registry import VERSION


def add_generate_routes(app: Any, dataplane: DataPlane, service: GenerationService) -> None:
    """The two routes of the generate extension, with and without a version."""

    async def start(name: str, version: str | None, request: Request) -> tuple[Completion, contextlib.ExitStack]:
        if version not in (None, "", VERSION):
            dataplane.registry.info(name, version)  # 404 naming the versions
        if dataplane.draining:
            raise ShuttingDownError("the server is shutting down and accepts no new generation")
        model = await service.model(name)  # 404 / 400 / 503 before the body is read
        body, slot, reservation = await read_request(dataplane, request, TritonGenerate)
        try:
            fields = body.merged()
            max_tokens = fields.max_tokens or DEFAULT_MAX_TOKENS
            sampling = fields.sampling(default_temperature=0.0)
            prompt = await text_prompt(service, model, reservation, body.text_input, max_tokens)
            text = TextRequest(name, prompt, max_tokens, sampling, stops_of(fields.stop), fields.prompt_lookup,
                               fields.draft)
            return service.start_admitted(model, text, dataplane.admit, slot)
        except BaseException:
            slot.close()
            raise

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
