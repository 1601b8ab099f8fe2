"""The server's OpenAPI 3 document, served at ``GET /v2/openapi.json``.

Written from the typed messages (:mod:`layerfit.serve.types`,
:mod:`layerfit.serve.generate_types`), so the schema a client or a fuzzer reads is the
one the server validates against. The routes take raw bodies (binary tensor data follows
the JSON part; every body is read within the server's bounds before it is parsed), so
FastAPI cannot derive this itself. Every error is ``{"error": "<message>"}`` (the
``default`` response), under ``/v1/`` OpenAI's ``{"error": {"message", "type", "param",
"code"}}``. A server that generates text (every ``layerfit serve``) also describes
Triton's generate extension and the OpenAI routes. Each operation has a ``summary``: the
HTTP reference page's tables are rendered from this document (``tools/docs_pages.py``).
"""

from __future__ import annotations

import re
from typing import Any

from layerfit.serve.generate_types import ChatRequest, CompletionRequest, TritonGenerate
from layerfit.serve.types import (
    InferenceRequest,
    ModelMetadata,
    RepositoryIndexRequest,
    RepositoryLoadRequest,
    RepositoryModel,
    ServerMetadata,
)

_ERROR = {
    "description": "an error: what was wrong and what to do",
    "content": {"application/json": {"schema": {
        "type": "object", "required": ["error"], "properties": {"error": {"type": "string"}},
    }}},
}
_OPENAI_ERROR = {
    "description": "an error in OpenAI's shape: what was wrong and what to do",
    "content": {"application/json": {"schema": {
        "type": "object", "required": ["error"], "properties": {"error": {
            "type": "object", "required": ["message", "type"],
            "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                           "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}},
        }},
    }}},
}
# server-sent events: before OpenAPI 3.2 a stream's ``schema`` describes each event
_EVENTS = {"text/event-stream": {"schema": {
    "type": "object", "required": ["data"],
    "properties": {"data": {"type": "string", "contentMediaType": "application/json"}, "event": {"type": "string"}},
}}}
_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
_VERSION = {"name": "version", "in": "path", "required": True, "schema": {"type": "string"}}


def _schema(model: Any) -> dict[str, Any]:
    return model.model_json_schema(ref_template="#/components/schemas/{model}")


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def openapi_document(version: str, repository_api: bool = True, generation: bool = False) -> dict[str, Any]:
    """The OpenAPI 3.1 document of a server (its repository endpoints and its generation
    routes only if served)."""
    schemas: dict[str, Any] = {}
    for model in (InferenceRequest, ServerMetadata, ModelMetadata, RepositoryIndexRequest, RepositoryModel,
                  RepositoryLoadRequest, TritonGenerate, CompletionRequest, ChatRequest):
        schema = _schema(model)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    output = {"type": "object", "required": ["name", "datatype", "shape"], "properties": {
        "name": {"type": "string"}, "datatype": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer"}}, "data": {"type": "array"},
        "parameters": {"type": "object"},
    }}
    schemas["InferenceResponse"] = {"type": "object", "required": ["model_name", "outputs"], "properties": {
        "model_name": {"type": "string"}, "model_version": {"type": "string"}, "id": {"type": "string"},
        "parameters": {"type": "object"}, "outputs": {"type": "array", "items": output},
    }}
    health = {"get": {"responses": {"200": _json({"type": "object"}), "default": _ERROR}}}
    infer = {"post": {
        "summary": "JSON tensors or binary tensor data in, the model's outputs out",
        "parameters": [_NAME],
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("InferenceRequest")}}},
        "responses": {"200": _json(_ref("InferenceResponse")), "default": _ERROR},
    }}
    versioned_infer = {"post": {**infer["post"], "parameters": [_NAME, _VERSION]}}
    metadata = {"get": {"summary": "the model's inputs and outputs, with datatype and shape", "parameters": [_NAME],
                        "responses": {"200": _json(_ref("ModelMetadata")), "default": _ERROR}}}
    ready = {"get": {"summary": "200 when the model is loaded, 503 otherwise", "parameters": [_NAME],
                     "responses": {"200": _json({"type": "object"}), "default": _ERROR}}}
    paths: dict[str, Any] = {
        "/v2/health/live": {"get": {**health["get"], "summary": "liveness"}},
        "/v2/health/ready": {"get": {**health["get"], "summary": "readiness (503 while shutting down)"}},
        "/v2": {"get": {"summary": "server metadata; extensions `binary_tensor_data`, `model_repository`",
                        "responses": {"200": _json(_ref("ServerMetadata")), "default": _ERROR}}},
        "/v2/models/{name}": metadata,
        "/v2/models/{name}/versions/{version}": {"get": {**metadata["get"], "parameters": [_NAME, _VERSION]}},
        "/v2/models/{name}/ready": ready,
        "/v2/models/{name}/versions/{version}/ready": {"get": {**ready["get"], "parameters": [_NAME, _VERSION]}},
        "/v2/models/{name}/infer": infer,
        "/v2/models/{name}/versions/{version}/infer": versioned_infer,
        "/metrics": {"get": {"summary": "Prometheus: requests, durations, memory ledger, tasks by type, queue; "
                                        "the process's RSS beside the ledger",
                             "responses": {
            "200": {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}},
            "default": _ERROR,
        }}},
    }
    if repository_api:
        body = {"required": False, "content": {"application/json": {"schema": _ref("RepositoryLoadRequest")}}}
        paths["/v2/repository/index"] = {"post": {
            "summary": "every model with its state (READY/UNAVAILABLE) and reason",
            "requestBody": {"required": False, "content": {"application/json": {"schema": _ref("RepositoryIndexRequest")}}},
            "responses": {"200": _json({"type": "array", "items": _ref("RepositoryModel")}), "default": _ERROR},
        }}
        for action in ("load", "unload"):
            paths[f"/v2/repository/models/{{name}}/{action}"] = {"post": {
                "summary": "(re)load the model" if action == "load" else "unload the model",
                "parameters": [_NAME], "requestBody": body,
                "responses": {"200": _json({"type": "object"}), "default": _ERROR},
            }}
    if generation:
        paths.update(_generation_paths(schemas))
    return {
        "openapi": "3.1.0",
        "info": {"title": "layerfit (Open Inference Protocol, KServe v2 REST)", "version": version},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def _generation_paths(schemas: dict[str, Any]) -> dict[str, Any]:
    """Triton's generate extension and the OpenAI routes (bodies as the server validates
    them; a streamed answer is server-sent events)."""
    schemas["GenerateResponse"] = {"type": "object", "required": ["model_name", "model_version", "text_output"],
                                   "properties": {k: {"type": "string"} for k in ("model_name", "model_version",
                                                                                  "text_output")}}
    usage = {"type": "object", "properties": {k: {"type": "integer"} for k in ("prompt_tokens", "completion_tokens",
                                                                               "total_tokens")}}
    for name, kind in (("Completion", "text_completion"), ("ChatCompletion", "chat.completion")):
        schemas[name] = {"type": "object", "required": ["id", "object", "created", "model", "choices"], "properties": {
            "id": {"type": "string"}, "object": {"const": kind}, "created": {"type": "integer"},
            "model": {"type": "string"}, "choices": {"type": "array", "items": {"type": "object"}}, "usage": usage,
        }}
    schemas["ModelList"] = {"type": "object", "required": ["object", "data"], "properties": {
        "object": {"const": "list"}, "data": {"type": "array", "items": {
            "type": "object", "required": ["id", "object", "created", "owned_by"],
            "properties": {"id": {"type": "string"}, "object": {"const": "model"}, "created": {"type": "integer"},
                           "owned_by": {"type": "string"}},
        }},
    }}

    def post(summary: str, body: str, answer: dict[str, Any], error: dict[str, Any],
             parameters: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        operation: dict[str, Any] = {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(body)}}},
            "responses": {"200": {"description": "OK", "content": answer}, "default": error},
        }
        if parameters:
            operation["parameters"] = parameters
        return {"post": operation}

    def json_or_events(schema: str) -> dict[str, Any]:
        return {"application/json": {"schema": _ref(schema)}, **_EVENTS}

    paths: dict[str, Any] = {}
    for versioned, parameters in (("", [_NAME]), ("/versions/{version}", [_NAME, _VERSION])):
        base = f"/v2/models/{{name}}{versioned}"
        paths[f"{base}/generate"] = post(
            "Triton's generate extension: `text_input` and parameters in, `text_output` out", "TritonGenerate",
            {"application/json": {"schema": _ref("GenerateResponse")}}, _ERROR, parameters)
        paths[f"{base}/generate_stream"] = post(
            "the same as server-sent events, one per token", "TritonGenerate", _EVENTS, _ERROR, parameters)
    paths["/v1/completions"] = post("OpenAI completions, streamed (`\"stream\": true`) or not", "CompletionRequest",
                                    json_or_events("Completion"), _OPENAI_ERROR)
    paths["/v1/chat/completions"] = post("OpenAI chat completions, through the tokenizer's chat template",
                                         "ChatRequest", json_or_events("ChatCompletion"), _OPENAI_ERROR)
    paths["/v1/models"] = {"get": {"summary": "the models that generate (READY ones)",
                                   "responses": {"200": _json(_ref("ModelList")), "default": _OPENAI_ERROR}}}
    return paths


# --- the HTTP reference page's tables, rendered from the document -------------------------

GENERATION_TABLE = "generation"
INFERENCE_TABLE = "inference"
_BLOCK = re.compile(r"(<!-- openapi: (\w+) -->\n)(.*?)(<!-- /openapi -->)", re.DOTALL)


def endpoint_table(document: dict[str, Any], table: str) -> str:
    """The Markdown table of ``table``'s endpoints (``inference``: the Open Inference
    Protocol's and the repository's; ``generation``: the generate extension's and
    OpenAI's), one row per operation with its summary; a path also served under
    ``/versions/{version}`` is written once, the version in brackets."""
    paths = document["paths"]
    rows = ["| endpoint | |", "|---|---|"]
    for path, item in paths.items():
        if "/versions/{version}" in path:
            continue
        generating = path.startswith("/v1/") or path.endswith(("/generate", "/generate_stream"))
        if generating != (table == GENERATION_TABLE):
            continue
        versioned = path.replace("/models/{name}", "/models/{name}/versions/{version}", 1)
        shown = path.replace("/models/{name}", "/models/{name}[/versions/{version}]", 1) if (
            versioned != path and versioned in paths) else path
        for method, operation in item.items():
            rows.append(f"| `{method.upper()} {shown}` | {operation.get('summary', '')} |")
    return "\n".join(rows) + "\n"


def render_tables(page: str, document: dict[str, Any]) -> str:
    """``page`` with each block between ``<!-- openapi: TABLE -->`` and ``<!-- /openapi -->``
    rendered from ``document`` (the HTTP reference page: ``tools/docs_pages.py``)."""
    return _BLOCK.sub(lambda m: m.group(1) + endpoint_table(document, m.group(2)) + m.group(4), page)
