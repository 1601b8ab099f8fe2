"""The server's OpenAPI 3 document, served at ``GET /v2/openapi.json``.

Written from the typed messages (:mod:`layerfit.serve.types`), so the schema a client
or a fuzzer reads is the one the server validates against. The routes take raw bodies
(binary tensor data follows the JSON part), so FastAPI cannot derive this itself.
Every error is ``{"error": "<message>"}`` (the ``default`` response).
"""

from __future__ import annotations

from typing import Any

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
_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
_VERSION = {"name": "version", "in": "path", "required": True, "schema": {"type": "string"}}


def _schema(model: Any) -> dict[str, Any]:
    return model.model_json_schema(ref_template="#/components/schemas/{model}")


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def openapi_document(version: str, repository_api: bool = True) -> dict[str, Any]:
    """The OpenAPI 3.1 document of a server (its repository endpoints only if served)."""
    schemas: dict[str, Any] = {}
    for model in (InferenceRequest, ServerMetadata, ModelMetadata, RepositoryIndexRequest, RepositoryModel,
                  RepositoryLoadRequest):
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
        "parameters": [_NAME],
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("InferenceRequest")}}},
        "responses": {"200": _json(_ref("InferenceResponse")), "default": _ERROR},
    }}
    versioned_infer = {"post": {**infer["post"], "parameters": [_NAME, _VERSION]}}
    metadata = {"get": {"parameters": [_NAME], "responses": {"200": _json(_ref("ModelMetadata")), "default": _ERROR}}}
    ready = {"get": {"parameters": [_NAME], "responses": {"200": _json({"type": "object"}), "default": _ERROR}}}
    paths: dict[str, Any] = {
        "/v2/health/live": health,
        "/v2/health/ready": health,
        "/v2": {"get": {"responses": {"200": _json(_ref("ServerMetadata")), "default": _ERROR}}},
        "/v2/models/{name}": metadata,
        "/v2/models/{name}/versions/{version}": {"get": {**metadata["get"], "parameters": [_NAME, _VERSION]}},
        "/v2/models/{name}/ready": ready,
        "/v2/models/{name}/versions/{version}/ready": {"get": {**ready["get"], "parameters": [_NAME, _VERSION]}},
        "/v2/models/{name}/infer": infer,
        "/v2/models/{name}/versions/{version}/infer": versioned_infer,
        "/metrics": {"get": {"responses": {
            "200": {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}},
            "default": _ERROR,
        }}},
    }
    if repository_api:
        body = {"required": False, "content": {"application/json": {"schema": _ref("RepositoryLoadRequest")}}}
        paths["/v2/repository/index"] = {"post": {
            "requestBody": {"required": False, "content": {"application/json": {"schema": _ref("RepositoryIndexRequest")}}},
            "responses": {"200": _json({"type": "array", "items": _ref("RepositoryModel")}), "default": _ERROR},
        }}
        for action in ("load", "unload"):
            paths[f"/v2/repository/models/{{name}}/{action}"] = {"post": {
                "parameters": [_NAME], "requestBody": body,
                "responses": {"200": _json({"type": "object"}), "default": _ERROR},
            }}
    return {
        "openapi": "3.1.0",
        "info": {"title": "layerfit (Open Inference Protocol, KServe v2 REST)", "version": version},
        "paths": paths,
        "components": {"schemas": schemas},
    }
