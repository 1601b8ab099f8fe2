"""The HTTP API fuzzed from its own OpenAPI document (schemathesis): whatever a client
sends, valid or not, the answer is never a server error and always what the document
says (status, content type, body schema). Bounded: a few dozen examples an operation.

The repository holds a language model (``lm``), so the generation and OpenAI routes are
fuzzed too; half of their examples name it, so the bodies reach the decode loop."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from generate_helpers import make_repository
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serve_helpers import settings as server_settings

from layerfit.serve.server import ServerThread

# a test tool of `make test` ([test] extra); the compatibility legs install fewer
schemathesis = pytest.importorskip("schemathesis")
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)


@pytest.fixture(scope="module")
def fuzzed_server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    """The shared repository and ``lm``, a tiny language model with a tokenizer."""
    root = tmp_path_factory.mktemp("fuzz")
    make_repository(root / "made")
    shutil.copytree(repository, root / "repo")
    shutil.copytree(root / "made" / "repo" / "lm", root / "repo" / "lm")
    with ServerThread(server_settings(root / "repo", max_body="64kB", request_memory="4MB", timeout=10.0)) as running:
        yield running


def aim_at_the_language_model(case) -> None:
    """Name ``lm`` in a generation request (the path's model, or the body's)."""
    if "generate" in case.path and case.path_parameters:
        case.path_parameters["name"] = "lm"
    if case.path.startswith("/v1/") and isinstance(case.body, dict):
        case.body["model"] = "lm"


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def operations(url: str) -> list:
    document = httpx.get(f"{url}/v2/openapi.json", timeout=10).json()
    return [result.ok() for result in schemathesis.openapi.from_dict(document).get_all_operations()]


def test_no_request_gets_a_server_error_or_an_undocumented_answer(fuzzed_server: ServerThread) -> None:
    # Hypothesis drives each operation's strategy directly: schemathesis's own pytest
    # plug-in does not run under this pytest release.
    tried = []
    for operation in operations(fuzzed_server.url):

        @given(case=operation.as_strategy(), lm=st.booleans())
        @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                  database=None)
        def check(case, lm: bool) -> None:
            if lm:
                aim_at_the_language_model(case)
            case.call_and_validate(base_url=fuzzed_server.url, checks=CHECKS, timeout=30)

        check()
        tried.append(operation.label)
    assert "POST /v2/models/{name}/infer" in tried and len(tried) >= 20
    for label in ("POST /v2/models/{name}/generate", "POST /v2/models/{name}/generate_stream",
                  "POST /v1/completions", "POST /v1/chat/completions", "GET /v1/models"):
        assert label in tried


def test_the_document_lists_what_the_server_serves(fuzzed_server: ServerThread) -> None:
    document = httpx.get(f"{fuzzed_server.url}/v2/openapi.json", timeout=10).json()
    assert document["openapi"].startswith("3.1")
    assert "/v2/models/{name}/infer" in document["paths"] and "/v2/repository/index" in document["paths"]
    assert "inputs" in document["components"]["schemas"]["InferenceRequest"]["properties"]
    for path in ("/v2/models/{name}/generate", "/v2/models/{name}/generate_stream", "/v1/completions",
                 "/v1/chat/completions", "/v1/models"):
        assert path in document["paths"], path
    assert "messages" in document["components"]["schemas"]["ChatRequest"]["properties"]
    served = {(method.lower(), route.path) for route in fuzzed_server.built.app.routes
              for method in getattr(route, "methods", ()) if route.path != "/v2/openapi.json" and method != "HEAD"}
    described = {(method, path) for path, item in document["paths"].items() for method in item}
    assert served == described


def test_the_http_reference_tables_are_rendered_from_the_document() -> None:
    """docs/reference/http.md's endpoint tables are the document's (``tools/docs_pages.py``
    renders them): a route added to the server and not to the document, or the other way
    round, fails here or in the fuzzer."""
    from layerfit import __version__
    from layerfit.serve.openapi import openapi_document, render_tables

    page = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "http.md").read_text()
    assert page.count("<!-- openapi: ") == 2
    assert render_tables(page, openapi_document(__version__, generation=True)) == page, "run tools/docs_pages.py"
