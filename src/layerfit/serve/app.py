"""The HTTP layer: Open Inference Protocol (KServe v2) REST routes on FastAPI.

Routes are thin — they take bytes, headers and path parameters to the
:class:`~layerfit.serve.dataplane.DataPlane` and return what it gives back. Every error,
whether raised by the data plane, the runtime underneath, the router (unknown path,
wrong method) or the body limit, leaves as ``{"error": "<message>"}`` with the status
from :func:`~layerfit.serve.errors.status_of`.

Endpoints::

    GET  /v2/health/live                    GET  /v2/health/ready
    GET  /v2                                (server metadata and extensions)
    GET  /v2/models/{name}[/versions/{v}]   (model metadata)
    GET  /v2/models/{name}[/versions/{v}]/ready
    POST /v2/models/{name}[/versions/{v}]/infer   (JSON or binary tensor data)
    POST /v2/repository/index
    POST /v2/repository/models/{name}/load  POST /v2/repository/models/{name}/unload
    GET  /metrics                           (Prometheus text format)
    GET  /v2/openapi.json                   (this API as an OpenAPI 3.1 document)
    POST /v2/models/{name}[/versions/{v}]/generate[_stream]   (Triton's generate extension)
    GET  /v1/models    POST /v1/completions    POST /v1/chat/completions   (OpenAI's)

Under ``/v1/`` errors take OpenAI's shape, ``{"error": {"message": ..., ...}}``.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response

from layerfit.errors import LayerfitError
from layerfit.serve.body import ClientGoneError
from layerfit.serve.codec import HEADER_LENGTH, parse_body
from layerfit.serve.dataplane import DataPlane
from layerfit.serve.errors import BadRequestError, error_body, openai_code, status_of
from layerfit.serve.generate_body import json_values, parsed_bytes
from layerfit.serve.generate_routes import add_generate_routes
from layerfit.serve.generation_service import GenerationService
from layerfit.serve.metrics import ServerMetrics
from layerfit.serve.middleware import BodyLimitMiddleware, MetricsMiddleware
from layerfit.serve.openai_routes import add_openai_routes
from layerfit.serve.openapi import openapi_document
from layerfit.serve.types import RepositoryIndexRequest, RepositoryLoadRequest

log = logging.getLogger("layerfit.serve")

REPOSITORY_BODY_VALUES = 64  # the most JSON values a repository route's body may hold
CLIENT_CLOSED = 499  # nginx's "client closed request": counted in metrics, never a 5xx


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def answer_error(request: Request, status: int, message: str, code: str | None = None) -> JSONResponse:
    """The error in the shape of the API asked (OpenAI's under ``/v1/``: :func:`error_body`)."""
    return JSONResponse(error_body(request.url.path, status, message, code), status_code=status)


async def _body_model(dataplane: DataPlane, request: Request, model: type[BaseModel]) -> Any:
    """An optional JSON body validated into ``model`` (an empty body means defaults), read
    like every body: within the deadline, the rate and request memory; these routes take
    an object of a field or two, so a body of more values is refused unparsed (400)."""
    with dataplane.requests.account() as reservation:
        try:
            body = await dataplane.read_body(request.receive, request.headers.get("content-length"), reservation)
        except ClientGoneError:
            raise ClientDisconnect() from None
        values = json_values(body)
        if values > REPOSITORY_BODY_VALUES:
            raise BadRequestError(
                f"the request body holds about {values:,} JSON values; this route takes an object of a field or two "
                "(it is refused before parsing)"
            )
        reservation.grow(parsed_bytes(body), "parsing this request", "send a smaller request body")
        return parse_body(body, model, empty={})


def create_app(
    dataplane: DataPlane, metrics: ServerMetrics, *, max_body: int, repository_api: bool = True,
    generation: GenerationService | None = None,
) -> Any:
    """The ASGI application: routes, error handlers, body limit and metrics middleware;
    with ``generation``, Triton's generate extension and the OpenAI routes too.

    Each route is a closure over the data plane and the settings, so the factory is as
    long as the API it declares, one short handler per endpoint; the error handlers, which
    close over nothing, are :func:`_error_handlers`."""
    app = FastAPI(title="layerfit", docs_url=None, redoc_url=None, openapi_url=None)

    _error_handlers(app)

    # --- health and metadata ------------------------------------------------------

    @app.get("/v2/health/live")
    async def live() -> JSONResponse:
        return JSONResponse({"live": dataplane.live()})

    @app.get("/v2/health/ready")
    async def ready() -> JSONResponse:
        if not dataplane.ready():
            return error_response(503, "the server is shutting down")
        return JSONResponse({"ready": True})

    @app.get("/v2")
    async def server_metadata() -> JSONResponse:
        return JSONResponse(dataplane.server_metadata())

    document = openapi_document(dataplane.version, repository_api, generation=generation is not None)

    @app.get("/v2/openapi.json")
    async def openapi() -> JSONResponse:
        return JSONResponse(document)

    @app.get("/v2/models/{name}")
    @app.get("/v2/models/{name}/versions/{version}")
    async def model_metadata(name: str, version: str | None = None) -> JSONResponse:
        return JSONResponse(dataplane.model_metadata(name, version))

    @app.get("/v2/models/{name}/ready")
    @app.get("/v2/models/{name}/versions/{version}/ready")
    async def model_ready(name: str, version: str | None = None) -> JSONResponse:
        if not dataplane.model_ready(name, version):
            return error_response(503, f"model {name!r} is not ready (see POST /v2/repository/index)")
        return JSONResponse({"name": name, "ready": True})

    # --- inference --------------------------------------------------------------------

    @app.post("/v2/models/{name}/infer")
    @app.post("/v2/models/{name}/versions/{version}/infer")
    async def infer(name: str, request: Request, version: str | None = None) -> Response:
        dataplane.check_inference(name, version)  # 4xx/503 before reading the body
        # The body is read before admission (a slow client holds no queue slot), within a
        # deadline and a minimum rate, and into request memory reserved for it first.
        with dataplane.requests.account() as reservation:
            try:
                body = await dataplane.read_body(request.receive, request.headers.get("content-length"), reservation)
            except ClientGoneError:
                return Response(status_code=CLIENT_CLOSED)  # nobody reads it; counted, not logged
            with dataplane.admit():
                content, headers = await dataplane.infer(
                    name, version, body, request.headers.get(HEADER_LENGTH), reservation
                )
        return Response(content=content, headers=headers)

    # --- model repository extension -------------------------------------------------

    if repository_api:
        _repository_routes(app, dataplane)

    # --- generation: Triton's generate extension, the OpenAI routes -------------------

    if generation is not None:
        add_generate_routes(app, dataplane, generation)
        add_openai_routes(app, dataplane, generation)

    # --- metrics ------------------------------------------------------------------------

    @app.get("/metrics")
    async def prometheus() -> Response:
        content, media_type = metrics.render()
        return Response(content=content, media_type=media_type)

    app.add_middleware(BodyLimitMiddleware, max_bytes=max_body)
    app.add_middleware(MetricsMiddleware, observe=metrics.observe_request)
    return app


def _error_handlers(app: Any) -> None:
    """Every failure answered as JSON (``answer_error``: the Open Inference Protocol's
    ``{"error": …}``, OpenAI's error object on ``/v1/``): layerfit's errors with the status
    of their class, FastAPI's and Starlette's (unknown endpoint, invalid body) with theirs,
    anything unexpected a logged 500, a client that left mid-body a bare 499."""

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(_: Request, exc: ClientDisconnect) -> Response:
        return Response(status_code=CLIENT_CLOSED)  # the client left mid-body: not a server error

    @app.exception_handler(LayerfitError)
    async def _layerfit_error(request: Request, exc: LayerfitError) -> JSONResponse:
        return answer_error(request, status_of(exc), str(exc), openai_code(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404:
            message = f"no such endpoint: {message.lower()} (see GET /v2 and the Open Inference Protocol)"
        return answer_error(request, exc.status_code, message)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return answer_error(request, 400, f"invalid request: {exc.errors()}")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return answer_error(request, 500, f"internal server error: {type(exc).__name__}: {exc}")


def _repository_routes(app: Any, dataplane: DataPlane) -> None:
    """The model repository extension: index, load, unload (``--no-repository-api`` leaves
    them out, and they answer 404 like any unknown path)."""

    @app.post("/v2/repository/index")
    async def repository_index(request: Request) -> JSONResponse:
        query = await _body_model(dataplane, request, RepositoryIndexRequest)
        return JSONResponse(dataplane.index(query.ready))

    @app.post("/v2/repository/models/{name}/load")
    async def repository_load(name: str, request: Request) -> JSONResponse:
        await _body_model(dataplane, request, RepositoryLoadRequest)
        await dataplane.load(name)
        return JSONResponse({})

    @app.post("/v2/repository/models/{name}/unload")
    async def repository_unload(name: str, request: Request) -> JSONResponse:
        await _body_model(dataplane, request, RepositoryLoadRequest)
        await dataplane.unload(name)
        return JSONResponse({})
