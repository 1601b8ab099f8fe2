"""``layerfit serve``: the Open Inference Protocol server over the runtime."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from layerfit.cli.app import app, console, renamed_option
from layerfit.engine.openmp import COMPUTE_THREADS_HELP, kernels_on

if TYPE_CHECKING:
    pass


# --- serve (Open Inference Protocol / KServe v2 server over the runtime) ----------------


@app.command("serve")
def serve_command(
    repository: str = typer.Option(..., "--repository", help="folder of prepared models, one sub-folder each"),
    budget: str | None = typer.Option(None, "--budget", help="memory budget of the runtime, e.g. 512MB (default 512MB)"),
    memory_budget: str | None = typer.Option(None, "--memory-budget", hidden=True),
    workers: int = typer.Option(2, "--workers", min=1, help="worker threads of the runtime"),
    policy: str = typer.Option(
        "masa-fair", "--policy", help="scheduling policy: masa-fair, masa-fcfs, masa, bulk, deepeye, fcfs, ..."
    ),
    units: str = typer.Option(
        "merge:auto", "--units",
        help="what one load/execute task covers: merge:auto (consecutive layers joined while the model's minimum "
        "budget stays the same: fewer reads, lower latency), layers (one each, as the thesis) or merge:SIZE",
    ),
    cache_weights: bool = typer.Option(
        True, "--cache-weights/--no-cache-weights",
        help="keep units loaded by earlier requests in the budget's spare memory and reuse them instead of "
        "reading them again (evicted whenever a task needs the memory)",
    ),
    return_freed_memory: str = typer.Option(
        "after-pass", "--return-freed-memory",
        help="when the scratch a forward pass frees leaves the process: after-pass (when each pass ends), "
        "eagerly (as soon as it is freed: a few MB less RSS, but models that free and allocate megabytes per "
        "layer compute up to twice as slowly) or never (glibc keeps freed blocks of up to 32 MiB)",
    ),
    warm_up: bool = typer.Option(
        False, "--warm-up",
        help="run one request per model on its example input before serving it: a model that fails it "
        "(e.g. a corrupted unit) stays UNAVAILABLE with the reason, and its weights start cached",
    ),
    threads: int | None = typer.Option(
        None, "--threads",
        help=COMPUTE_THREADS_HELP + ". 1 lets requests in flight each use a core instead of sharing them "
        "(measured: +15-40 % requests per second on 2 cores)",
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on"),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="port to listen on (0: a free one)"),
    queue_limit: int = typer.Option(64, "--queue-limit", min=1, help="most inference requests held at once; more get 429"),
    max_body: str = typer.Option("64MB", "--max-body", help="largest request body; larger ones get 413"),
    request_memory: str | None = typer.Option(
        None, "--request-memory",
        help="memory all requests' bodies and decoding may hold at once, outside --budget "
        "(default: twice --max-body); a request that cannot fit gets 413, one that must wait 429",
    ),
    body_timeout: float = typer.Option(
        30.0, "--body-timeout", help="seconds a request body may take to arrive (then 408)"
    ),
    min_body_rate: str = typer.Option(
        "16kB", "--min-body-rate", help="slowest a request body may arrive, per second after its first (then 408)"
    ),
    repository_api: bool = typer.Option(
        True, "--repository-api/--no-repository-api",
        help="serve the model repository extension (index, load, unload); off: those endpoints answer 404",
    ),
    verify: str = typer.Option(
        "first", "--verify",
        help="when a unit's SHA-256 is checked: first (its first read), always (every read from storage) or "
        "never; a unit that fails takes its model out of service (503) until it is loaded again",
    ),
    reverify_every: float = typer.Option(
        0.0, "--reverify-every", metavar="SECONDS",
        help="re-read and hash every ready model's weights this often, in the background (0: never): "
        "catches a file changed after its first check",
    ),
    timeout: float = typer.Option(60.0, "--timeout", help="seconds before a request is cancelled (503)"),
    shutdown_grace: float = typer.Option(
        30.0, "--shutdown-grace", help="seconds (0 or more) requests may finish after SIGTERM"
    ),
    log_level: str = typer.Option(
        "info", "--log-level", help="uvicorn log level: critical, error, warning, info, debug or trace"
    ),
) -> None:
    """Serve the repository's models over the Open Inference Protocol (KServe v2 REST)."""
    from layerfit.serve.server import ServeSettings, serve

    settings = ServeSettings(
        repository=repository, memory_budget=renamed_option(budget, "--budget", memory_budget, "--memory-budget", "512MB"), workers=workers, policy=policy, units=units,
        cache_weights=cache_weights, return_freed_memory=return_freed_memory, warm_up=warm_up, threads=threads,
        host=host,
        port=port, queue_limit=queue_limit, max_body=max_body, request_memory=request_memory,
        body_timeout=body_timeout, min_body_rate=min_body_rate, repository_api=repository_api, timeout=timeout,
        verify=verify, reverify_every=reverify_every,
        shutdown_grace=shutdown_grace, log_level=log_level, access_log=log_level.lower() in ("debug", "trace"),
    )

    def ready(url: str, built: Any) -> None:
        index = built.registry.index()
        loaded = sum(row["state"] == "READY" for row in index)
        threads = built.runtime.stats()["compute_threads"]
        console.print(f"layerfit serving {loaded} of {len(index)} models at {url}/v2, {kernels_on(threads)} "
                      "(SIGTERM drains and stops)",
                      highlight=False, soft_wrap=True)
        for name, message in built.load_errors.items():
            console.print(f"[yellow]model {escape(name)} not loaded:[/] {escape(message)}",
                          highlight=False, soft_wrap=True)

    serve(settings, on_ready=ready)
