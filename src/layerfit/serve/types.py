"""Typed messages of the Open Inference Protocol (KServe v2) REST API.

Request bodies are validated into these pydantic models before anything else looks at
them, so a malformed request fails in one place with a message that names the field.
Tensor ``data`` is left as ``Any`` on purpose: a large tensor is a long list, and the
codec (:mod:`layerfit.serve.codec`) checks it against the model's datatype and shape in
one numpy conversion instead of pydantic walking every element.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

Parameters = dict[str, Any]


class _Message(BaseModel):
    model_config = ConfigDict(extra="ignore")


class RequestInput(_Message):
    """``$request_input``: one input tensor, as JSON ``data`` or as binary data."""

    name: str
    shape: list[int]
    datatype: str
    parameters: Parameters | None = None
    data: Any = None

    def binary_size(self) -> int | None:
        """``binary_data_size`` when the tensor travels as binary data, else None."""
        size = (self.parameters or {}).get("binary_data_size")
        return None if size is None else size


class RequestOutput(_Message):
    """``$request_output``: an output the client wants, optionally as binary data."""

    name: str
    parameters: Parameters | None = None


class InferenceRequest(_Message):
    """``$inference_request``."""

    id: str | None = None
    parameters: Parameters | None = None
    inputs: list[RequestInput] = Field(min_length=1)
    outputs: list[RequestOutput] | None = None


class TensorMetadata(_Message):
    """``$metadata_tensor``: name, datatype and shape of a model input or output."""

    name: str
    datatype: str
    shape: list[int]


class ServerMetadata(_Message):
    """``$metadata_server_response``."""

    name: str
    version: str
    extensions: list[str]


class ModelMetadata(_Message):
    """``$metadata_model_response``."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class RepositoryIndexRequest(_Message):
    """``$repository_index_request``; the body may be empty."""

    ready: bool = False


class RepositoryModel(_Message):
    """One entry of ``$repository_index_response``."""

    name: str
    version: str | None = None
    state: str
    reason: str = ""


class RepositoryLoadRequest(_Message):
    """``$repository_load_request`` / ``$repository_unload_request``; may be empty."""

    parameters: Parameters | None = None
