"""Generation requests read, parsed and tokenized within the server's bounds: the
discipline of the ``/infer`` route (:mod:`layerfit.serve.body`) for Triton's generate
extension and the OpenAI routes.

1. The body is read by the data plane's reader — within ``--max-body``,
   ``--body-timeout`` and ``--min-body-rate``, stopped by a shutdown — into request
   memory (``--request-memory``) reserved for it first.
2. What parsing will make of it is reserved next, counted from the raw bytes by a
   C-speed scan (:func:`parsed_bytes`): a body whose parsed values could not fit is
   refused unparsed (413, or 429 while others hold the memory).
3. A prompt of token ids longer than the model's positions is refused (413) before
   anything is made of it. A text cannot be judged by its length (a normalizer may drop
   characters, byte fallback makes several tokens of one), so it is tokenized within
   memory reserved for it (:func:`tokenizing_bytes`), then its tokens are counted.

The reservation is held until the response has been sent (it is in the request's slot),
less what the request no longer holds: the raw body once it is parsed, the work of
tokenizing once the ids are made (they stay counted, :data:`KEPT_BYTES_PER_TOKEN` each).
"""

from __future__ import annotations

import contextlib
from typing import Any, TypeVar

from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request

from layerfit.serve.body import ClientGoneError, Reservation
from layerfit.serve.codec import parse_body
from layerfit.serve.dataplane import DataPlane
from layerfit.serve.errors import BadRequestError, ShuttingDownError
from layerfit.serve.generation_service import GenerationService, LanguageModel

Body = TypeVar("Body", bound=BaseModel)

# What parsing a generation body holds, per what a scan of its bytes finds: each value (at
# most one per comma, bracket or brace) a Python int of up to 32 bytes and the slots of
# the lists and tuples it passes through (orjson's list, pydantic's copy, the prompt's
# tuple, the decode loop's list); each object a dict and a pydantic model; each byte up
# to 4 bytes of string (one character outside Latin-1 makes every character of its
# string 4 bytes), twice. Measured (CPython 3.11, orjson, pydantic 2.14): a million ids
# of 5 digits peak at 129 MB (this counts 176 MB), 1.5 M one-digit ids at 39 MB (216 MB),
# 200 000 chat messages at 165 MB (330 MB), 10 MB of text at 26 MB (80 MB).
PARSED_BYTES_PER_VALUE = 128
PARSED_BYTES_PER_OBJECT = 1024
PARSED_BYTES_PER_BYTE = 8

# What tokenizing one byte of text holds at its peak: measured 250 bytes for a byte-level
# BPE making a token of every byte (the Rust encoding, its offsets and alignments, the
# Python lists of ids and mask), 160 for a word-level one.
TOKENIZING_BYTES_PER_BYTE = 320
KEPT_BYTES_PER_TOKEN = 64  # a prompt's id as its request keeps it: an int, its tuple's and the loop's list slots
CHAT_BYTES_PER_MESSAGE = 64  # what a chat template adds around each message (its role, markers)
CHAT_TEMPLATE_BYTES = 1024  # and once (a default system prompt, the reply's header)

HINT = "send a shorter prompt, or start the server with a larger --request-memory"


def json_values(body: bytes | bytearray) -> int:
    """At most how many values ``body`` parses into (one per comma, bracket or brace, and one)."""
    return body.count(b",") + body.count(b"[") + body.count(b"{") + 1


def parsed_bytes(body: bytes | bytearray) -> int:
    """The most that parsing ``body`` into Python values and a validated request holds."""
    objects = body.count(b"{")
    values = json_values(body)
    return PARSED_BYTES_PER_VALUE * values + PARSED_BYTES_PER_OBJECT * objects + PARSED_BYTES_PER_BYTE * len(body)


def text_bytes(text: str) -> int:
    """The UTF-8 bytes of ``text`` (its length when ASCII, known without a scan; else
    encoded once, a copy no larger than what parsing its body reserved for it)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def tokenizing_bytes(nbytes: int) -> int:
    """What tokenizing a text of ``nbytes`` UTF-8 bytes holds at most."""
    return TOKENIZING_BYTES_PER_BYTE * nbytes


async def read_request(
    dataplane: DataPlane, request: Request, model: type[Body]
) -> tuple[Body, contextlib.ExitStack, Reservation]:
    """The body validated into ``model``, and the slot holding its request memory (the
    caller closes it when the response has been sent; closed here if reading fails).

    Refused before a byte is read when the server drains (503); a client that leaves
    mid-body ends quietly (499)."""
    if dataplane.draining:
        raise ShuttingDownError("the server is shutting down and accepts no new generation")
    slot = contextlib.ExitStack()
    try:
        reservation = slot.enter_context(dataplane.requests.account())
        try:
            raw = await dataplane.read_body(request.receive, request.headers.get("content-length"), reservation)
        except ClientGoneError:
            raise ClientDisconnect() from None
        read = reservation.nbytes
        reservation.grow(parsed_bytes(raw), "parsing this request", HINT)
        body = await run_in_threadpool(parse_body, raw, model)
        del raw
        reservation.shrink(read)  # the body is dropped; what it was parsed into stays counted
        return body, slot, reservation
    except BaseException:
        slot.close()
        raise


async def text_prompt(
    service: GenerationService, model: LanguageModel, reservation: Reservation, text: str, max_tokens: int
) -> tuple[int, ...]:
    """``text``'s token ids, tokenized within request memory reserved for it; 413 past
    the model's positions."""
    work = tokenizing_bytes(text_bytes(text))
    reservation.grow(work, "tokenizing this prompt", HINT)
    ids = await run_in_threadpool(service.encode, model, text)
    reservation.shrink(work - KEPT_BYTES_PER_TOKEN * len(ids))
    service.check_length(model, len(ids), max_tokens)
    return ids


async def chat_prompt(
    service: GenerationService, model: LanguageModel, reservation: Reservation, messages: list[dict[str, str]],
    max_tokens: int,
) -> tuple[int, ...]:
    """The chat's token ids through the model's template, within request memory reserved
    for the rendered text and its tokens; 413 past the model's positions."""
    rendered = CHAT_TEMPLATE_BYTES + sum(text_bytes(m["content"]) + CHAT_BYTES_PER_MESSAGE for m in messages)
    work = 4 * rendered + tokenizing_bytes(rendered)
    reservation.grow(work, "templating and tokenizing these messages", HINT)
    ids = await run_in_threadpool(service.chat, model, messages)
    reservation.shrink(work - KEPT_BYTES_PER_TOKEN * len(ids))
    service.check_length(model, len(ids), max_tokens)
    return ids


def ids_prompt(service: GenerationService, model: LanguageModel, ids: list[Any], max_tokens: int) -> tuple[int, ...]:
    """A prompt given as token ids: 413 past the model's positions before anything is
    made of it; ids outside the vocabulary are refused when it starts (400)."""
    if not ids:
        raise BadRequestError("prompt: give some text or token ids")
    service.check_length(model, len(ids), max_tokens)
    return tuple(ids)


__all__ = [
    "PARSED_BYTES_PER_VALUE",
    "TOKENIZING_BYTES_PER_BYTE",
    "chat_prompt",
    "ids_prompt",
    "json_values",
    "parsed_bytes",
    "read_request",
    "text_prompt",
    "tokenizing_bytes",
]
