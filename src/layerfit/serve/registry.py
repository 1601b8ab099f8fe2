"""The model repository as the server sees it: names, versions, signatures, readiness.

The :class:`~layerfit.Runtime` owns the models; this registry is the server's view of
it (MLServer's "model registry" layer). It is where a name from a URL is checked before
anything touches the disk: a name must look like a folder name (no separators, no
``..``) *and* be a model the runtime found in the repository, so no request can name a
path outside it. It also refuses to load a model whose weights are not a safetensors
file — weights are never unpickled.

Each model has one version, ``"1"``. Its one input is called ``input`` — or, for a
model prepared from keyword arguments (Whisper's ``input_features`` and
``decoder_input_ids``), there is an input for each, by its name; its outputs ``output``
(one) or ``output_0``, ``output_1``, … (several), with the shapes captured when the
model was prepared.

A model is READY only if it can run within the server's memory budget (its resident
part beside its largest unit; with less, its jobs would run only by going over the
budget): a model that needs more stays UNAVAILABLE with its minimum budget as the reason —
a configuration problem of the server, answered 503, never blamed on the request.

With ``warm_up``, loading a model also runs one request on its example input (the input
it was prepared with) before it counts as READY: a model that cannot answer it — a unit
whose checksum fails on first read, a forward pass that raises, a run past the timeout —
stays UNAVAILABLE with the reason instead of failing its first client, and with the
runtime's weight cache the units it read stay cached for the first requests.

A model whose folder holds tokenizer files that cannot be used (not JSON, nested past
any real tokenizer, a tokenizer mapped to the folder's own code) is not loaded: it stays
UNAVAILABLE with the reason (:mod:`layerfit.serve.tokenizer_files`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from layerfit.errors import (
    JobTimeoutError,
    LayerfitError,
    ModelNotReadyError,
    ModelOverBudgetError,
    QueueFullError,
)
from layerfit.schedule.runtime.repository import check_name
from layerfit.serve.codec import TensorSpec
from layerfit.serve.datatypes import datatype_of
from layerfit.serve.errors import BadRequestError, ModelNotFoundError
from layerfit.serve.tokenizer_files import tokenizer_problem
from layerfit.sizes import format_bytes
from layerfit.store import read_manifest

if TYPE_CHECKING:
    from layerfit.schedule.runtime.repository import ModelInfo
    from layerfit.store.manifest import Manifest

VERSION = "1"
PLATFORM = "layerfit"
INPUT_NAME = "input"


@dataclass(frozen=True)
class Signature:
    """The inputs and outputs of a model, as the protocol's metadata describes them."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    keywords: bool = False  # the model is called with its inputs as keyword arguments

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.outputs]


def output_names(count: int) -> list[str]:
    """``["output"]`` for one output, ``["output_0", "output_1", ...]`` for several."""
    return ["output"] if count == 1 else [f"output_{i}" for i in range(count)]


def signature_of(manifest: Any) -> Signature:
    """Input and output specs from a prepared model's manifest.

    The manifest records output shapes but not output dtypes; each output's datatype is
    the dtype of the last captured activation of that shape (the tensor the model
    returned), falling back to the input dtype, or FP32 for integer inputs. Outputs carry
    the model's own names where the capture kept them (a Hugging Face model's ``logits``,
    ``last_hidden_state``); a text model's varying axes (batch, sequence) are ``-1``.
    """
    varying = manifest.variable_shapes
    if manifest.input_keywords:  # prepared from keyword arguments: an input for each, by its name
        inputs = tuple(
            TensorSpec(n, datatype_of(dtype), _shape(shape, varying.axes_of(n) if varying else {}))
            for n, shape, dtype in manifest.input_keywords
        )
    else:
        axes = varying.axes_of("") if varying else {}
        inputs = (TensorSpec(INPUT_NAME, datatype_of(manifest.input_dtype), _shape(manifest.input_shape, axes)),)
    graph = manifest.graph
    fallback = manifest.input_dtype if inputs[0].datatype.startswith(("FP", "BF")) else "float32"
    shapes = [tuple(s) for s in graph.output_shapes]
    names = graph.output_names if len(graph.output_names) == len(shapes) else output_names(len(shapes))
    outputs = []
    for index, (name, shape) in enumerate(zip(names, shapes, strict=True)):
        dtype = next((t.dtype for t in reversed(graph.tensors) if tuple(t.shape) == shape), fallback)
        axes = {axis: s for i, axis, s in varying.outputs if i == index} if varying else {}
        outputs.append(TensorSpec(name, datatype_of(dtype), _shape(shape, axes)))
    return Signature(inputs, tuple(outputs), keywords=bool(manifest.input_keywords))


def _shape(shape: tuple[int, ...], varying: dict[int, str]) -> tuple[int, ...]:
    """``shape`` with ``-1`` at each varying axis, as the protocol's metadata writes it."""
    return tuple(-1 if axis in varying else size for axis, size in enumerate(shape))


class ModelRuntime(Protocol):
    """What the registry asks of the runtime (:class:`~layerfit.Runtime` is one): its
    repository's models and their index, its budget and what each model needs of it,
    loading, unloading and taking out of service, and a warm-up request."""

    repository: Path

    @property
    def models(self) -> Mapping[str, ModelInfo]: ...

    def index(self) -> list[dict[str, str]]: ...

    def stats(self) -> dict[str, Any]: ...

    def load_model(self, name: str, *, within_budget: bool = False) -> ModelInfo: ...

    def unload_model(self, name: str) -> None: ...

    def mark_unavailable(self, name: str, reason: str) -> None: ...

    def required_budget(self, name: str) -> int: ...

    def example_input(self, name: str, seed: int | None = None) -> Any: ...

    def infer(self, model: str, x: Any, *, timeout: float | None = None) -> Future: ...


class ModelRegistry:
    """Names, versions, metadata and readiness of the runtime's models."""

    def __init__(self, runtime: ModelRuntime, *, warm_up: bool = False, warm_up_timeout: float = 60.0) -> None:
        self.runtime = runtime
        self.warm_up = warm_up
        self.warm_up_timeout = warm_up_timeout
        self.load_errors: dict[str, str] = {}
        self.over_budget: dict[str, int] = {}  # loadable models the budget cannot run: bytes they need
        self.budget: int = runtime.stats()["budget_bytes"]
        self._signatures: dict[str, tuple[Any, Signature]] = {}

    def names(self) -> list[str]:
        return sorted(self.runtime.models)

    def info(self, name: str, version: str | None = None) -> ModelInfo:
        """The runtime's ModelInfo of ``name``: 400 for a bad name, 404 if not in the repository."""
        check_name(name, BadRequestError)
        info = self.runtime.models.get(name)
        if info is None:
            self.runtime.index()  # rescans the repository: folders added since start count
            info = self.runtime.models.get(name)
        if info is None:
            known = ", ".join(self.names()) or "none"
            raise ModelNotFoundError(
                f"model {name!r} is not in the repository (models: {known}); "
                "POST /v2/repository/index lists them"
            )
        if version not in (None, "", VERSION):
            raise ModelNotFoundError(f"model {name!r} has no version {version!r} (its only version is {VERSION})")
        return info

    def manifest(self, name: str) -> Manifest:
        """The manifest of ``name``: the runtime's once loaded, else read from its folder.

        Reading a manifest is JSON only (no weights), so metadata of a model that is not
        loaded is still available; a folder whose manifest is unreadable is a 503 with
        the store's message.
        """
        info = self.info(name)
        if info.manifest is not None:
            return info.manifest
        try:
            return read_manifest(info.directory)
        except LayerfitError as exc:
            raise ModelNotReadyError(f"model {name!r} is unavailable: {exc}") from None

    def signature(self, name: str) -> Signature:
        """Input and output specs of ``name`` (503 if its manifest cannot be read)."""
        manifest = self.manifest(name)
        cached = self._signatures.get(name)
        if cached is None or cached[0] is not manifest:
            cached = (manifest, signature_of(manifest))
            if self.info(name).manifest is manifest:  # cache only the runtime's manifest
                self._signatures[name] = cached
        return cached[1]

    def metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        """``$metadata_model_response`` of ``name``."""
        self.info(name, version)
        sig = self.signature(name)
        return {
            "name": name,
            "versions": [VERSION],
            "platform": PLATFORM,
            "inputs": [s.to_dict() for s in sig.inputs],
            "outputs": [s.to_dict() for s in sig.outputs],
        }

    def is_ready(self, name: str, version: str | None = None) -> bool:
        return bool(self.info(name, version).loaded)

    def require_ready(self, name: str, version: str | None = None) -> Signature:
        """The signature of a loaded model; 503 with what to do if it is not loaded."""
        if not self.is_ready(name, version):
            if name in self.over_budget:
                raise ModelNotReadyError(f"model {name!r} is unavailable on this server: {self.load_errors[name]}")
            raise ModelNotReadyError(
                f"model {name!r} is not loaded ({self._reason(name)}): "
                f"POST /v2/repository/models/{name}/load loads it"
            )
        return self.signature(name)

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        """``$repository_index_response``: every model with its state and reason."""
        rows = []
        for row in self.runtime.index():
            if ready_only and row.get("state") != "READY":
                continue
            reason = row.get("reason") or ""
            if row.get("state") != "READY" and row["name"] in self.load_errors:
                reason = self.load_errors[row["name"]]
            rows.append({"name": row["name"], "version": VERSION, "state": row["state"], "reason": reason})
        return rows

    def check_loadable(self, name: str) -> None:
        """Refuse a model whose weights file is not safetensors (weights are never unpickled)
        or whose tokenizer files cannot be used."""
        info = self.info(name)
        try:
            manifest = read_manifest(info.directory)
        except LayerfitError:
            return  # the runtime's load reports the unreadable manifest itself
        if not str(manifest.weights_file).endswith(".safetensors"):
            raise BadRequestError(
                f"model {name!r} names weights file {manifest.weights_file!r}: layerfit only "
                "reads safetensors weights (prepare the model again with `layerfit prepare`)"
            )
        problem = tokenizer_problem(info.directory)
        if problem is not None:
            raise BadRequestError(f"model {name!r} has a tokenizer that cannot be used: {problem}")

    def load(self, name: str) -> None:
        """Check and (re)load ``name`` in the runtime; a failure is remembered for the index.

        A failure of the folder's content is a 400 naming the model: the folder exists
        (else 404) and the other models keep serving. A model that needs a larger
        memory budget than the server's stays UNAVAILABLE (never READY) and is refused with 503:
        the server's configuration, not the request, is what cannot serve it.
        """
        self.info(name)
        self.over_budget.pop(name, None)
        try:
            self.check_loadable(name)
            self.runtime.load_model(name, within_budget=True)  # never READY if it cannot run
            if self.warm_up:
                self._warm_up(name)
        except ModelOverBudgetError as exc:
            needed = self.over_budget[name] = exc.min_budget
            self.load_errors[name] = (
                f"the model needs a memory budget of at least {format_bytes(needed)} ({needed} bytes), "
                f"more than the server's --budget of {format_bytes(self.budget)}"
            )
            raise ModelNotReadyError(f"cannot load model {name!r}: {self.load_errors[name]}") from None
        except ModelNotReadyError as exc:  # not the model's fault (e.g. a busy server): 503, try again
            self.load_errors[name] = str(exc)
            raise ModelNotReadyError(f"cannot load model {name!r}: {exc}") from exc
        except LayerfitError as exc:
            self.load_errors[name] = str(exc)
            if isinstance(exc, BadRequestError):
                raise
            raise BadRequestError(f"cannot load model {name!r}: {exc}") from exc
        self.load_errors.pop(name, None)

    def _warm_up(self, name: str) -> None:
        """One request on the model's example input; on failure the model is unloaded
        (UNAVAILABLE) and a :class:`LayerfitError` says why."""
        try:
            x = self.runtime.example_input(name)
            self.runtime.infer(name, x, timeout=self.warm_up_timeout).result()
        except Exception as exc:  # whatever the model raised: it must not be READY
            with contextlib.suppress(LayerfitError):
                self.runtime.unload_model(name)
            message = f"its warm-up request failed: {type(exc).__name__}: {exc}"
            if isinstance(exc, QueueFullError | JobTimeoutError):  # the server was busy: not the model's fault
                raise ModelNotReadyError(f"{message} (load it again)") from exc
            raise LayerfitError(message) from exc

    def check_budget(self) -> None:
        """Refuse a budget under which no model can run: such a server could only answer 503.

        The message gives the smallest budget that serves one model and the one that
        serves every model that loads.
        """
        if not self.over_budget or any(self.is_ready(name) for name in self.names()):
            return
        need = self.over_budget
        least, most = min(need, key=need.__getitem__), max(need, key=need.__getitem__)
        raise LayerfitError(
            f"--budget {format_bytes(self.budget)} is too small for every model of "
            f"{self.runtime.repository}: give at least {format_bytes(need[least])} ({need[least]} bytes) "
            f"to serve {least}, or {format_bytes(need[most])} ({need[most]} bytes) to serve all "
            f"{len(need)} that load"
        )

    def apply_budget(self, budget: int) -> dict[str, str]:
        """The runtime's budget is now ``budget`` (a memory limit's, measured after loading):
        a READY model that needs more is taken out of service as if it had loaded over
        budget; returns those models' reasons by name."""
        self.budget = budget
        refused = {}
        for name in self.names():
            needed = self.runtime.required_budget(name) if self.is_ready(name) else 0
            if needed > budget:
                self.over_budget[name] = needed
                refused[name] = self.load_errors[name] = (
                    f"the model needs a memory budget of at least {format_bytes(needed)} ({needed} bytes), "
                    f"more than the {format_bytes(budget)} the server's --memory-limit leaves"
                )
                self.runtime.mark_unavailable(name, refused[name])
        return refused

    def load_all(self) -> dict[str, str]:
        """Load every model of the repository; returns the failures by name."""
        failures = {}
        for name in self.names():
            try:
                self.load(name)
            except LayerfitError as exc:
                failures[name] = str(exc)
        return failures

    def unload(self, name: str) -> None:
        self.info(name)
        self.runtime.unload_model(name)

    def _reason(self, name: str) -> str:
        if name in self.load_errors:
            return self.load_errors[name]
        info = self.info(name)
        return str(getattr(info, "reason", "") or "not loaded")
