"""OpenAI-compatible routes: ``GET /v1/models``, ``POST /v1/completions`` and
``POST /v1/chat/completions``, so the ``openai`` client and the tools built on it work
unchanged against the server.

Both completions answer one choice (``n=1``) with ``finish_reason`` (``stop``: an end
token or a stop string; ``length``: ``max_tokens``) and ``usage``; with ``stream=True``
they answer server-sent events in OpenAI's chunk format, one chunk per token, a last
chunk with the finish reason (and, with ``stream_options.include_usage``, one with the
usage), then ``data: [DONE]``. Sampled at temperature 1 unless told otherwise (the API's
default); ``seed`` makes it reproducible. The chat route puts the messages through the
tokenizer's chat template. Errors are OpenAI's shape,
``{"error": {"message", "type", "param", "code"}}`` (see :mod:`layerfit.serve.app`); a
model that is not in the repository is 404 ``model_not_found`` (``openai.NotFoundError``).
Bodies are read, parsed and tokenized within the server's bounds
(:mod:`layerfit.serve.generate_body`).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import Request
from starlette.responses import JSONResponse

from layerfit.errors import LayerfitError
from layerfit.serve.body import Reservation
from layerfit.serve.dataplane import DataPlane
from layerfit.serve.event_stream import DONE, EventStream, event
from layerfit.serve.generate_body import chat_prompt, ids_prompt, read_request, text_prompt
from layerfit.serve.generate_types import DEFAULT_MAX_TOKENS, ChatRequest, CompletionRequest
from layerfit.serve.generation_service import (
    Completion,
    Delta,
    GenerationService,
    TextRequest,
    stops_of,
)

OWNER = "layerfit"


def add_openai_routes(app: Any, dataplane: DataPlane, service: GenerationService) -> None:
    """The three OpenAI routes."""

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        created = int(time.time())
        data = [{"id": n, "object": "model", "created": created, "owned_by": OWNER} for n in service.generating_models()]
        return JSONResponse({"object": "list", "data": data})

    async def start(
        body: CompletionRequest | ChatRequest, limit: int | None, slot: contextlib.ExitStack, reservation: Reservation
    ) -> tuple[Completion, contextlib.ExitStack]:
        """The completion of ``body``, admitted into ``slot`` (which holds its request
        memory, and is closed here if starting fails)."""
        try:
            model = await service.model(body.model)
            max_tokens = limit or DEFAULT_MAX_TOKENS
            sampling = body.sampling(default_temperature=1.0)
            if isinstance(body, ChatRequest):
                messages = [{"role": m.role, "content": m.text()} for m in body.messages]
                prompt = await chat_prompt(service, model, reservation, messages, max_tokens)
            elif isinstance(body.prompt, str) or (body.prompt and isinstance(body.prompt[0], str)):
                text = body.prompt if isinstance(body.prompt, str) else body.prompt[0]
                prompt = await text_prompt(service, model, reservation, str(text), max_tokens)
            else:
                prompt = ids_prompt(service, model, body.prompt, max_tokens)  # token ids
            request = TextRequest(body.model, prompt, max_tokens, sampling, stops_of(body.stop), body.prompt_lookup,
                                  body.draft)
            return service.start_admitted(model, request, dataplane.admit, slot)
        except BaseException:
            slot.close()
            raise

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body, slot, reservation = await read_request(dataplane, request, CompletionRequest)
        completion, slot = await start(body, body.max_tokens, slot, reservation)
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": body.model}

        def choice(text: str, finish: str | None) -> dict[str, Any]:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

        if body.stream:
            return _stream(completion, slot, head, choice, body, first=None)
        with slot:
            text = await completion.collect()
        return JSONResponse({**head, "choices": [choice(text, completion.finish)], "usage": completion.usage})

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        body, slot, reservation = await read_request(dataplane, request, ChatRequest)
        completion, slot = await start(body, body.limit(), slot, reservation)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": body.model}
        if body.stream:

            def chunk(text: str, finish: str | None) -> dict[str, Any]:
                content = {} if finish is not None and not text else {"content": text}
                return {"index": 0, "delta": content, "logprobs": None, "finish_reason": finish}

            first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
            return _stream(completion, slot, {**head, "object": "chat.completion.chunk"}, chunk, body, first=first)
        with slot:
            text = await completion.collect()
        message = {"role": "assistant", "content": text}
        return JSONResponse({
            **head, "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": completion.finish}],
            "usage": completion.usage,
        })


def _stream(
    completion: Completion, slot: contextlib.ExitStack, head: dict[str, Any],
    choice: Callable[[str, str | None], dict[str, Any]],
    body: CompletionRequest | ChatRequest, first: dict[str, Any] | None,
) -> EventStream:
    """The completion as OpenAI chunks: ``first`` (the chat's role), one per token, the
    finish reason, the usage when asked, ``[DONE]``; an error after the start as a last
    ``{"error": ...}`` event."""
    include_usage = body.stream_options is not None and body.stream_options.include_usage

    async def events() -> AsyncIterator[bytes]:
        try:
            if first is not None:
                yield event({**head, "choices": [first]})
            async for delta in completion:
                if delta.finish is not None and delta.text:
                    yield event({**head, "choices": [choice(delta.text, None)]})
                    delta = Delta("", token=False, finish=delta.finish)
                if delta.token or delta.text or delta.finish is not None:
                    yield event({**head, "choices": [choice(delta.text, delta.finish)]})
            if include_usage:
                yield event({**head, "choices": [], "usage": completion.usage})
            yield DONE
        except LayerfitError as exc:
            yield event({"error": {"message": str(exc), "type": "server_error", "param": None, "code": None}})

    return EventStream(events(), close=lambda: (completion.cancel(), slot.close()))


__all__ = ["add_openai_routes"]
