"""The data plane: what every endpoint does, independent of HTTP.

Seldon MLServer's middle layer: the HTTP layer (:mod:`layerfit.serve.app`) only moves
bytes and headers in and out; this class validates, decodes, submits to the
:class:`~layerfit.Runtime`, waits and encodes. It also owns the two pieces of state the
server needs for robustness:

* **admission** — at most ``max_inflight`` inference requests are held at once (the
  runtime's queue limit: unfinished jobs, queued or running); the next one is answered
  429 before its body is read, so memory stays bounded whatever the clients do;
* **draining** — after SIGTERM new inference is answered 503, and :meth:`drain` waits
  for the admitted requests; when the grace period runs out it cancels the runtime's
  pending work, whose requests are then answered 503 too. Every admitted request gets a
  response.

Waiting never blocks the event loop: the runtime's ``concurrent.futures.Future`` wakes
an asyncio future through ``call_soon_threadsafe``; decoding and encoding (numpy work
on possibly large tensors) run in the thread pool.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import time
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from starlette.concurrency import run_in_threadpool

from layerfit.errors import JobTimeoutError, LayerfitError
from layerfit.schedule.runtime.compute import flat_outputs, without_thread_team
from layerfit.serve.body import BodyLimits, RequestMemory, Reservation, read_body
from layerfit.serve.codec import decode_input, decoding_bytes, encode_response, parse_request
from layerfit.serve.errors import BadRequestError, ServerBusyError, ShuttingDownError
from layerfit.serve.registry import VERSION, ModelRegistry, Signature, output_names
from layerfit.serve.types import InferenceRequest

SERVER_NAME = "layerfit"
EXTENSIONS = ["binary_tensor_data", "model_repository"]


class InferenceRuntime(Protocol):
    """What the data plane asks of the runtime (:class:`~layerfit.Runtime` is one): run one
    model on one input, and stop."""

    def infer(self, model: str, x: Any, *, timeout: float | None = None) -> concurrent.futures.Future: ...

    def shutdown(self, wait: bool = True, cancel_pending: bool = False) -> None: ...


class DataPlane:
    """Health, metadata, inference and repository operations over one runtime."""

    def __init__(
        self,
        runtime: InferenceRuntime,
        registry: ModelRegistry,
        *,
        timeout: float,
        max_inflight: int,
        body: BodyLimits,
        request_memory: RequestMemory,
        metrics: Any = None,
    ) -> None:
        from layerfit import __version__

        self.runtime = runtime
        self.registry = registry
        self.timeout = timeout
        self.max_inflight = max_inflight
        self.metrics = metrics
        self.version = __version__
        self.draining = False
        self.inflight = 0
        self._idle: asyncio.Event | None = None
        self.body = body  # how much, how long and how slowly a request body may come
        self.requests = request_memory  # what request bodies and their decoding may hold
        self.stopping = asyncio.Event()  # set on SIGTERM: bodies still arriving are not read
        self.abandoned = asyncio.Event()  # set when the grace ends: waiting requests get 503

    # --- health and metadata ------------------------------------------------------

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        """Ready for inference: not draining (models may still be loading or unloaded)."""
        return not self.draining

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": self.version, "extensions": list(EXTENSIONS)}

    def model_metadata(self, name: str, version: str | None = None) -> dict[str, Any]:
        return self.registry.metadata(name, version)

    def model_ready(self, name: str, version: str | None = None) -> bool:
        return self.registry.is_ready(name, version) and not self.draining

    # --- admission and draining -----------------------------------------------------

    @contextlib.contextmanager
    def admit(self) -> Iterator[None]:
        """Hold one inference slot for the duration of the block, or refuse (429/503)."""
        if self.draining:
            raise ShuttingDownError("the server is shutting down and accepts no new inference")
        if self.inflight >= self.max_inflight:
            raise ServerBusyError(
                f"the queue is full: the server already holds {self.inflight} inference requests "
                "(its --queue-limit): retry later, or start the server with a larger --queue-limit"
            )
        self.inflight += 1
        if self._idle is not None:
            self._idle.clear()
        try:
            yield
        finally:
            self.inflight -= 1
            if self.inflight == 0 and self._idle is not None:
                self._idle.set()

    def begin_drain(self) -> None:
        """Stop admitting inference and reading bodies (called on SIGTERM)."""
        self.draining = True
        self.stopping.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no inference is in flight, at most ``timeout`` seconds; True if idle."""
        if self.inflight == 0:
            return True
        if self._idle is None:
            self._idle = asyncio.Event()
        # asyncio.TimeoutError: the builtin's alias from 3.11, a class of its own in 3.10
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
        return self.inflight == 0

    async def drain(self, grace: float) -> None:
        """Finish or fail every admitted request, then stop the runtime.

        Admitted requests get ``grace`` seconds to finish; then every unfinished job is
        cancelled and its request answered 503 (a task already running ends in the
        background and returns its memory); then the runtime's threads are joined.
        """
        self.begin_drain()
        if not await self.wait_idle(grace):
            # the grace is over: queued work is cancelled and every request still waiting
            # is answered 503 now (streams still decoding end with a 503 event: the runtime
            # closes its decode loops); a forward pass under way ends in the background
            await run_in_threadpool(self.runtime.shutdown, wait=False, cancel_pending=True)
            self.abandoned.set()
            await self.wait_idle(5.0)
        await run_in_threadpool(self.runtime.shutdown, wait=True)  # and closes its decode loops

    # --- inference -------------------------------------------------------------------

    def check_inference(self, name: str, version: str | None = None) -> Signature:
        """Everything that can be refused before the body is read: name, version, readiness."""
        if self.draining:
            raise ShuttingDownError("the server is shutting down and accepts no new inference")
        return self.registry.require_ready(name, version)

    async def read_body(self, receive: Any, declared: str | None, reservation: Reservation) -> bytes | bytearray:
        """The request body, within the deadline, rate and request memory (see :mod:`.body`)."""
        length = int(declared) if declared is not None and declared.isascii() and declared.isdigit() else None
        return await read_body(receive, self.body, reservation, self.stopping, length)

    async def infer(
        self, name: str, version: str | None, body: bytes | bytearray, header_length: str | None,
        reservation: Reservation | None = None,
    ) -> tuple[bytes | memoryview, dict[str, str]]:
        """Run one inference request; returns the response body and its headers.

        Decoding reserves what it will hold in ``reservation`` first (a JSON request
        carrying more values than the model's inputs take is refused unparsed).
        """
        signature = self.check_inference(name, version)
        if reservation is not None:
            reservation.grow(decoding_bytes(body, header_length, signature.inputs, name), "decoding this request")
        # decoding and encoding run tensor operations on the pool's long-lived threads: none
        # may keep an OpenMP team there, or every forward pass runs at half speed
        request, x = await run_in_threadpool(without_thread_team(self._decode), name, signature, body, header_length)
        timeout = self._timeout_of(request)
        submitted = time.perf_counter()
        future = self.runtime.infer(name, x, timeout=timeout)
        out = await self._wait(future, timeout)
        if self.metrics is not None:
            self.metrics.observe_inference(name, time.perf_counter() - submitted, future)
        outputs = flat_outputs(out)
        names = signature.output_names if len(outputs) == len(signature.outputs) else output_names(len(outputs))
        return await run_in_threadpool(without_thread_team(encode_response), request, name, VERSION, outputs, names)

    def _decode(
        self, name: str, signature: Signature, body: bytes, header_length: str | None
    ) -> tuple[InferenceRequest, torch.Tensor | dict[str, torch.Tensor]]:
        """The request and the model's input: a tensor, or (a model of several named inputs,
        prepared from keyword arguments) a dict of them by name, each sent exactly once."""
        request, chunks = parse_request(body, header_length)
        specs = {spec.name: spec for spec in signature.inputs}
        sent = [i.name for i in request.inputs]
        if sorted(sent) != sorted(specs):
            takes = ", ".join(f"{s.name!r} ({s.describe()})" for s in signature.inputs)
            raise BadRequestError(
                f"model {name!r} takes {'one input' if len(specs) == 1 else f'{len(specs)} inputs'}, "
                f"{takes}; the request has {', '.join(map(repr, sent)) or 'none'}"
            )
        tensors = {
            i.name: decode_input(i, chunk, specs[i.name], name) for i, chunk in zip(request.inputs, chunks, strict=True)
        }
        return request, tensors if signature.keywords else tensors[signature.inputs[0].name]

    def _timeout_of(self, request: InferenceRequest) -> float:
        """The server's timeout, shortened by the request's ``timeout`` parameter (µs)."""
        value = (request.parameters or {}).get("timeout")
        if value is None:
            return self.timeout
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 or math.isinf(value):
            raise BadRequestError(f"parameters.timeout must be a positive number of microseconds, not {value!r}")
        return min(self.timeout, value / 1e6)

    async def _wait(self, future: concurrent.futures.Future, timeout: float) -> Any:
        """The runtime's result, without blocking the loop; cancelled work becomes a 503.

        The runtime enforces ``timeout`` itself (cancelling queued work and freeing its
        memory); the wait here allows a little more, as a safety net only.
        """
        loop = asyncio.get_running_loop()
        woken = loop.create_future()

        def wake(_: concurrent.futures.Future) -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
                loop.call_soon_threadsafe(lambda: woken.done() or woken.set_result(None))

        future.add_done_callback(wake)
        abandoned = asyncio.ensure_future(self.abandoned.wait())
        try:
            done, _ = await asyncio.wait({woken, abandoned}, timeout=timeout + 5.0,
                                         return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            future.cancel()
            raise
        finally:
            abandoned.cancel()
        if not done:
            future.cancel()
            raise JobTimeoutError(f"inference did not finish within {timeout:g} s and was cancelled")
        if woken not in done:  # the shutdown grace ran out
            future.cancel()
            raise ShuttingDownError("the server shut down before this request finished; it was cancelled")
        if future.cancelled():
            if self.draining:
                raise ShuttingDownError("the server shut down before this request ran; it was cancelled")
            raise JobTimeoutError("the inference was cancelled before it ran")
        exc = future.exception()
        if exc is None:
            return future.result()
        if isinstance(exc, LayerfitError):
            raise exc
        if isinstance(exc, TimeoutError | concurrent.futures.TimeoutError):
            raise JobTimeoutError(f"inference did not finish within {timeout:g} s: {exc}") from exc
        raise exc

    # --- model repository ------------------------------------------------------------

    def index(self, ready_only: bool = False) -> list[dict[str, Any]]:
        return self.registry.index(ready_only)

    async def load(self, name: str) -> None:
        self.registry.info(name)
        await run_in_threadpool(self.registry.load, name)

    async def unload(self, name: str) -> None:
        self.registry.info(name)
        await run_in_threadpool(self.registry.unload, name)
