"""Start and stop the inference server: settings, uvicorn, graceful shutdown.

:func:`build` wires the layers — runtime → registry → data plane → FastAPI app — and
:class:`Server` runs them on uvicorn. On SIGTERM (or :meth:`ServerThread.stop`) the
server drains before uvicorn closes any connection: new inference is answered 503, the
admitted requests get ``shutdown_grace`` seconds to finish, then the runtime's pending
work is cancelled and answered 503 as well; only then are connections closed and the
runtime stopped. No admitted request is left without a response.

:func:`serve` is what ``layerfit serve`` runs; :class:`ServerThread` runs the same server
on a background thread (for embedding and for tests) on a given or free loopback port.
"""

from __future__ import annotations

import asyncio
import errno
import math
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn
from uvicorn.config import LOG_LEVELS

from layerfit.errors import LayerfitError
from layerfit.memory_limit import parse_memory_limit
from layerfit.schedule.decoding.draft import DRAFT_TOKENS
from layerfit.schedule.decoding.lookup import MAX_PROMPT_LOOKUP, PromptLookup, check_lookup
from layerfit.schedule.runtime.compute import check_compute_threads, set_compute_threads
from layerfit.schedule.runtime.config import RuntimeConfig, server_config, size_setting
from layerfit.serve.body import BodyLimits, RequestMemory
from layerfit.serve.dataplane import DataPlane
from layerfit.serve.generation_service import GenerationService
from layerfit.serve.integrity import Reverifier
from layerfit.serve.metrics import ServerMetrics
from layerfit.serve.registry import ModelRegistry
from layerfit.sizes import format_bytes, parse_bytes

if TYPE_CHECKING:
    from layerfit.schedule.runtime.executor import Runtime


def flag(name: str) -> str:
    """How ``layerfit serve`` spells setting ``name`` (a field of :class:`ServeSettings` or
    of its runtime's config): the flag each message of theirs names."""
    return "--budget" if name == "memory_budget" else "--" + name.replace("_", "-")


SIZES = ("max_body", "request_memory", "min_body_rate")
""":class:`ServeSettings`' byte quantities, read from text once, when the settings are made."""


@dataclass(init=False)
class ServeSettings:
    """Everything ``layerfit serve`` takes; see the command's help for each option.

    ``runtime`` is the runtime's :class:`~layerfit.schedule.runtime.config.RuntimeConfig`
    (repository, budget, workers, policy, units, weight cache, queue limit, verify, …),
    the rest the server's own. Give it as ``runtime=``, or give its fields as keywords
    beside the server's (``ServeSettings(repository=..., memory_budget="4MB", port=0)``):
    those build it with a server's defaults,
    :data:`~layerfit.schedule.runtime.config.SERVER_OVERRIDES` over the config's.

    ``max_body``, ``request_memory`` and ``min_body_rate`` (bytes per second) are bytes,
    given as bytes or as sizes (``"64MB"``): making the settings reads them, once, and a
    size that is no size is refused then, naming its flag; :meth:`validate` checks the
    rest.
    """

    runtime: RuntimeConfig
    warm_up: bool = False
    threads: int | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    max_body: int = parse_bytes("64MB")
    request_memory: int | None = None  # None: twice max_body (request_memory_bytes)
    body_timeout: float = 30.0
    min_body_rate: int = parse_bytes("16kB")  # bytes per second
    repository_api: bool = True
    timeout: float = 60.0
    shutdown_grace: float = 30.0
    load_models: bool = True
    log_level: str = "warning"
    access_log: bool = False
    reverify_every: float = 0.0  # seconds between re-hashing every READY model's weights (0: never)
    # share of the memory budget a language model's decode engine may keep weights in while
    # it generates (0: stream every unit each step)
    generation_weights: float = 0.5
    # bytes the whole process may use (None: no limit): the runtime's budget is what the
    # process's footprint and the request memory leave (schedule.runtime.memory_fit)
    memory_limit: int | None = None
    # tokens a greedy sequence proposes per step from its own n-grams, for every model and
    # per model (a request's prompt_lookup wins); given as a PromptLookup, a number, or the
    # command line's texts (N, MODEL=N)
    prompt_lookup: PromptLookup = PromptLookup()
    # a model's draft model (another model of the repository, same vocabulary), by the
    # model's name: resident, it proposes draft_tokens tokens per step for greedy requests;
    # given as a mapping, (model, draft) pairs, or the command line's texts (MODEL=DRAFT)
    draft: tuple[tuple[str, str], ...] = ()
    draft_tokens: int = DRAFT_TOKENS

    def __init__(
        self, repository: str | Path | None = None, *, runtime: RuntimeConfig | None = None, **options: Any
    ) -> None:
        own = {f.name for f in fields(ServeSettings)} - {"runtime"}
        shared = {f.name for f in fields(RuntimeConfig)}
        unknown = sorted(set(options) - own - shared)
        if unknown:
            raise TypeError(f"ServeSettings got unexpected keyword arguments: {', '.join(unknown)}")
        given = {name: value for name, value in options.items() if name in shared}
        if options.get("memory_limit") is not None:
            options["memory_limit"] = parse_memory_limit(options["memory_limit"])
            if runtime is None:  # no budget given: the limit's own (budget_given)
                given.setdefault("memory_budget", options["memory_limit"])
        if runtime is None:
            if repository is None and "repository" not in given:
                raise TypeError("ServeSettings needs a repository, or runtime=RuntimeConfig(...)")
            runtime = server_config(given.pop("repository", repository), **given)
        elif repository is not None or given:
            raise TypeError("give the runtime's settings as runtime=RuntimeConfig(...) or as keywords, not both")
        self.runtime = runtime
        for name in own & set(options):  # the others keep the class's defaults
            value = options[name]
            if name in SIZES and value is not None:  # the one place their text is read
                value = size_setting(value, flag(name))
            if name == "prompt_lookup":
                value = _prompt_lookup(value)
            if name == "draft":
                value = _drafts(value)
            setattr(self, name, value)

    @property
    def budget_given(self) -> bool:
        """Whether the runtime's budget was given beside a memory limit (it is then held to
        what the limit leaves); a budget of the limit itself stands for none given: the
        budget is what the limit leaves."""
        return self.memory_limit is None or self.runtime.memory_budget != self.memory_limit

    @property
    def request_memory_bytes(self) -> int:
        """What all requests' bodies and their decoding may hold at once: ``request_memory``,
        else twice ``max_body``."""
        return 2 * self.max_body if self.request_memory is None else self.request_memory

    def validate(self) -> None:
        """Refuse settings that cannot work, with the option to change, before anything loads:
        the runtime's (:meth:`RuntimeConfig.validate`, naming flags), then the server's own."""
        runtime = self.runtime
        runtime.validate(flag)
        if runtime.queue_limit is None:  # a server always has one: the data plane's limit too
            raise LayerfitError(f"--queue-limit must be at least 1, not {runtime.queue_limit}")
        if not (self.timeout > 0 and math.isfinite(self.timeout)):
            raise LayerfitError(f"--timeout must be a positive, finite number of seconds, not {self.timeout}")
        if not (self.shutdown_grace >= 0 and math.isfinite(self.shutdown_grace)):
            raise LayerfitError(
                f"--shutdown-grace must be a finite number of seconds, 0 or more (0: cancel "
                f"unfinished requests at once), not {self.shutdown_grace}"
            )
        if str(self.log_level).lower() not in LOG_LEVELS:
            raise LayerfitError(
                f"--log-level must be one of {', '.join(LOG_LEVELS)}, not {self.log_level!r}"
            )
        if not 0 <= self.port <= 65535:
            raise LayerfitError(f"--port must be from 0 (a free port) to 65535, not {self.port}")
        if not 0 <= self.generation_weights < 1:
            raise LayerfitError(
                f"--generation-weights must be a share of the budget from 0 up to (not including) 1, "
                f"not {self.generation_weights}"
            )
        if self.max_body < 1:
            raise LayerfitError("--max-body must be at least one byte")
        if self.request_memory_bytes < self.max_body:
            raise LayerfitError(
                f"--request-memory ({format_bytes(self.request_memory_bytes)}) must be at least --max-body "
                f"({format_bytes(self.max_body)}): a body of the largest size allowed must fit"
            )
        if not (self.body_timeout > 0 and math.isfinite(self.body_timeout)):
            raise LayerfitError(f"--body-timeout must be a positive, finite number of seconds, not {self.body_timeout}")
        if not (self.reverify_every >= 0 and math.isfinite(self.reverify_every)):
            raise LayerfitError(
                f"--reverify-every must be a finite number of seconds, 0 or more (0: never), not {self.reverify_every}"
            )
        check_compute_threads(self.threads, "--threads")
        if not Path(runtime.repository).is_dir():
            raise LayerfitError(
                f"model repository {runtime.repository} is not a directory: give a folder of "
                "prepared models (one sub-folder each, made by `layerfit prepare`)"
            )
        for name in self.prompt_lookup.models:
            if not (Path(runtime.repository) / name).is_dir():
                raise LayerfitError(f"--prompt-lookup {name}=…: the repository has no model {name!r}")
        for model, draft in self.draft:
            for name in (model, draft):
                if not (Path(runtime.repository) / name).is_dir():
                    raise LayerfitError(f"--draft {model}={draft}: the repository has no model {name!r}")
            if model == draft:
                raise LayerfitError(f"--draft {model}={draft}: a model's draft is another, smaller model")
        if isinstance(self.draft_tokens, bool) or not isinstance(self.draft_tokens, int) or not (
                1 <= self.draft_tokens <= MAX_PROMPT_LOOKUP):
            raise LayerfitError(f"--draft-tokens must be from 1 to {MAX_PROMPT_LOOKUP}, not {self.draft_tokens!r}")


def _prompt_lookup(value: object) -> PromptLookup:
    """A ``prompt_lookup`` setting as a :class:`PromptLookup`: one already, a number (every
    model), or the command line's texts (``N``, ``MODEL=N``); refused naming the flag."""
    if isinstance(value, PromptLookup):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return PromptLookup(check_lookup(value, "--prompt-lookup"))
    if isinstance(value, str):
        value = [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return PromptLookup.parse(value, "--prompt-lookup")
    raise LayerfitError(f"--prompt-lookup takes N or MODEL=N, not {value!r}")


def _drafts(value: object) -> tuple[tuple[str, str], ...]:
    """A ``draft`` setting as (model, draft) pairs, one per model: from a mapping, pairs,
    or the command line's texts (``MODEL=DRAFT``); refused naming the flag."""
    if isinstance(value, Mapping):
        items: list[object] = list(value.items())
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        items = [value]
    drafts: dict[str, str] = {}
    for item in items:
        if isinstance(item, tuple) and len(item) == 2 and all(isinstance(x, str) for x in item):
            item = "=".join(item)
        model, _, draft = item.partition("=") if isinstance(item, str) else ("", "", "")
        if not model.strip() or not draft.strip():
            raise LayerfitError(f"--draft takes MODEL=DRAFT (two models of the repository), not {item!r}")
        drafts[model.strip()] = draft.strip()
    return tuple(drafts.items())


@dataclass
class Built:
    """The wired layers of one server (``runtime``: the one :func:`build` made)."""

    runtime: Runtime
    registry: ModelRegistry
    dataplane: DataPlane
    metrics: ServerMetrics
    app: Any
    load_errors: dict[str, str]
    reverifier: Reverifier | None = None


def build(settings: ServeSettings) -> Built:
    """Create the runtime over the repository, load its models and wire the app.

    A model that fails to load, or needs more than the memory budget, is reported
    (``load_errors``, and UNAVAILABLE in the repository index) while the others serve;
    a budget under which no model can run is refused (:meth:`ModelRegistry.check_budget`).
    """
    from layerfit.schedule.runtime.executor import Runtime
    from layerfit.schedule.runtime.memory_fit import fit_runtime
    from layerfit.serve.app import create_app

    settings.validate()
    from layerfit.store.trust import trust_factories

    config = settings.runtime
    trust = config.trust_factory
    trust_factories([trust] if isinstance(trust, str) else trust)  # before any folder is read; never from a request
    set_compute_threads(settings.threads, "--threads")  # before the runtime's threads run a kernel
    limited = settings.memory_limit is not None
    # the registry loads the models within the budget; under a memory limit, first within the
    # limit, each warmed up, then the process is measured and the budget set to what it leaves
    runtime = Runtime(replace(config, load=False, **({"memory_budget": settings.memory_limit} if limited else {})))
    try:
        registry = ModelRegistry(runtime, warm_up=settings.warm_up or limited, warm_up_timeout=settings.timeout)
        load_errors = registry.load_all() if settings.load_models else {}
        if limited:
            fit_runtime(runtime, settings.memory_limit, settings.request_memory_bytes,
                        config.memory_budget if settings.budget_given else None)
            load_errors.update(registry.apply_budget(runtime.ledger.budget))
        registry.check_budget()
        metrics = ServerMetrics()
        dataplane = DataPlane(
            runtime, registry, timeout=settings.timeout,
            max_inflight=config.queue_limit, metrics=metrics,
            body=BodyLimits(settings.max_body, settings.body_timeout, settings.min_body_rate),
            request_memory=RequestMemory(settings.request_memory_bytes),
        )
        metrics.attach(runtime, lambda: dataplane.inflight, dataplane.requests)
        # the runtime owns the decode loops (their engines, KV caches and closing); the
        # routes only speak HTTP to it
        runtime.configure_decoding(max_waiting=config.queue_limit, kept_share=settings.generation_weights,
                                   prompt_lookup=settings.prompt_lookup, drafts=dict(settings.draft),
                                   draft_tokens=settings.draft_tokens)
        generation = GenerationService(runtime, registry, timeout=settings.timeout)
        app = create_app(dataplane, metrics, max_body=settings.max_body, repository_api=settings.repository_api,
                         generation=generation)
    except BaseException:
        runtime.shutdown(wait=True, cancel_pending=True)
        raise
    reverifier = Reverifier(runtime, settings.reverify_every) if settings.reverify_every > 0 else None
    return Built(runtime, registry, dataplane, metrics, app, load_errors, reverifier)


class Server(uvicorn.Server):
    """uvicorn's server with a drain before it closes connections."""

    def __init__(self, config: uvicorn.Config, dataplane: DataPlane, grace: float,
                 reverifier: Reverifier | None = None) -> None:
        super().__init__(config)
        self.dataplane = dataplane
        self.grace = grace
        self.reverifier = reverifier
        self.started_event = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.reverifier is not None and self.started:
            self.reverifier.start()
        self.started_event.set()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.reverifier is not None:
            self.reverifier.stop()  # a pass under way stops at its next model
        try:
            await self.dataplane.drain(self.grace)
        finally:
            await super().shutdown(sockets=sockets)


def make_server(settings: ServeSettings, built: Built) -> Server:
    config = uvicorn.Config(
        built.app, host=settings.host, port=settings.port, log_level=settings.log_level.lower(),
        access_log=settings.access_log, lifespan="off",
        # uvicorn's own graceful timeout only backs up the drain, which comes first and
        # answers every admitted request within the grace period.
        timeout_graceful_shutdown=settings.shutdown_grace + 5.0,
    )
    return Server(config, built.dataplane, settings.shutdown_grace, built.reverifier)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket (port 0: a free one), so the caller knows the port.

    A failure names the option to change: ``--port`` when the port is taken or
    privileged, ``--host`` when the address does not resolve or is not this machine's.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
            hint = "give an address of this machine as --host, e.g. 127.0.0.1, or 0.0.0.0 for all"
        elif exc.errno in (errno.EADDRINUSE, errno.EACCES):
            hint = "choose another --port, or 0 for a free one"
        else:
            hint = "check --host and --port"
        raise LayerfitError(f"cannot listen on {host}:{port}: {exc.strerror or exc} ({hint})") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def serve(settings: ServeSettings, *, on_ready: Any = None) -> None:
    """Run the server in the foreground until SIGTERM or SIGINT, then drain and stop.

    ``on_ready(url, built)`` is called once the socket listens.
    """
    built = build(settings)
    try:
        sock = bind(settings.host, settings.port)
    except BaseException:
        built.runtime.shutdown(wait=True, cancel_pending=True)
        raise
    host, port = sock.getsockname()[:2]
    server = make_server(settings, built)
    if on_ready is not None:

        def announce() -> None:
            server.started_event.wait()
            if server.started:
                on_ready(_url(host, port), built)

        threading.Thread(target=announce, name="layerfit-serve-ready", daemon=True).start()
    try:
        server.run(sockets=[sock])
    finally:
        built.runtime.shutdown(wait=True, cancel_pending=True)


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class ServerThread:
    """The server on a background thread; ``port=0`` picks a free port.

    Use as a context manager: entering starts the server and waits until it listens;
    leaving drains and stops it like SIGTERM does.
    """

    def __init__(self, settings: ServeSettings, start_timeout: float = 60.0) -> None:
        self.settings = settings
        self.start_timeout = start_timeout
        self.built: Built | None = None
        self.server: Server | None = None
        self.url = ""
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self) -> ServerThread:
        self.built = build(self.settings)
        try:
            sock = bind(self.settings.host, self.settings.port)
        except BaseException:
            self.built.runtime.shutdown(wait=True, cancel_pending=True)
            raise
        host, port = sock.getsockname()[:2]
        self.url = _url(host, port)
        self.server = make_server(self.settings, self.built)

        def run() -> None:
            try:
                asyncio.run(self.server.serve(sockets=[sock]))
            except BaseException as exc:  # reported by start() or stop()
                self._error = exc
            finally:
                self.server.started_event.set()

        self._thread = threading.Thread(target=run, name="layerfit-serve", daemon=True)
        self._thread.start()
        if not self.server.started_event.wait(self.start_timeout) or self._error is not None:
            self.stop()
            raise LayerfitError(f"the server did not start: {self._error}")
        return self

    def stop(self, timeout: float = 120.0) -> None:
        """Drain and stop, as on SIGTERM; waits at most ``timeout`` seconds."""
        if self.server is not None:
            self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        if self.built is not None:
            self.built.runtime.shutdown(wait=True, cancel_pending=True)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
