"""``layerfit serve``: the Open Inference Protocol server over the runtime."""

from __future__ import annotations

from typing import Any

import typer
from rich.markup import escape

from layerfit.cli.app import app, console, renamed_option
from layerfit.cli.runtime_options import RUNTIME_OPTIONS, RuntimeOptions, runtime_options
from layerfit.engine.openmp import COMPUTE_THREADS_HELP, kernels_on
from layerfit.schedule.runtime.config import SERVER_OVERRIDES

_DEFAULT_BUDGET = SERVER_OVERRIDES["memory_budget"]


# --- serve (Open Inference Protocol / KServe v2 server over the runtime) ----------------


@app.command("serve")
@runtime_options(
    "workers", "policy", "units", "cache_weights", "return_freed_memory", "queue_limit", "verify", "dequantize",
    overrides=SERVER_OVERRIDES,  # a server's defaults: merge:auto, the weight cache, 64 queued, 512MB
)
def serve_command(
    repository: str = typer.Option(..., "--repository", help="folder of prepared models, one sub-folder each"),
    budget: str | None = typer.Option(
        None, "--budget", help=f"memory budget of the runtime, e.g. 512MB (default {_DEFAULT_BUDGET})"
    ),
    memory_budget: str | None = typer.Option(None, "--memory-budget", hidden=True),
    memory_limit: str | None = typer.Option(
        None, "--memory-limit",
        help="bound the whole server process, e.g. 1GB: its models are loaded and warmed up, the process "
        "measured, and --budget becomes what the footprint and --request-memory leave (given: at most that)",
    ),
    runtime: RuntimeOptions = RUNTIME_OPTIONS,  # --workers, --policy, --units, ... (runtime_options)
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
    reverify_every: float = typer.Option(
        0.0, "--reverify-every", metavar="SECONDS",
        help="re-read and hash every ready model's weights this often, in the background (0: never): "
        "catches a file changed after its first check",
    ),
    generation_weights: float = typer.Option(
        0.5, "--generation-weights", metavar="SHARE",
        help="share of --budget a language model may keep weights in while it generates (the rest streams "
        "each step; 0: stream them all); dropped when it has nothing to generate",
    ),
    prompt_lookup: list[str] | None = typer.Option(  # noqa: B008 (typer reads defaults)
        None, "--prompt-lookup", metavar="N|MODEL=N",
        help="greedy requests propose up to N tokens per step from their own prompt and output (prompt "
        "lookup), verified in the same pass: the same tokens in fewer passes; N for every model, MODEL=N for "
        "one (repeat it); a request's prompt_lookup field wins (0: off, the default)",
    ),
    draft: list[str] | None = typer.Option(  # noqa: B008 (typer reads defaults)
        None, "--draft", metavar="MODEL=DRAFT",
        help="DRAFT (a smaller model of the repository, same vocabulary) proposes MODEL's next tokens for "
        "greedy requests, verified in one pass: the same tokens in fewer passes; resident, its weights "
        "counted in the budget (repeat it for several models; a request's draft field turns it off)",
    ),
    draft_tokens: int = typer.Option(5, "--draft-tokens", help="tokens a draft proposes per step (1-64)"),
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

    # under --memory-limit without --budget, the budget is what the limit leaves (ServeSettings.budget_given)
    given_budget = renamed_option(budget, "--budget", memory_budget, "--memory-budget",
                                  _DEFAULT_BUDGET if memory_limit is None else memory_limit)
    settings = ServeSettings(
        runtime=runtime.config(repository, given_budget), memory_limit=memory_limit, warm_up=warm_up, threads=threads, host=host,
        port=port, max_body=max_body, request_memory=request_memory, body_timeout=body_timeout,
        min_body_rate=min_body_rate, repository_api=repository_api, timeout=timeout,
        reverify_every=reverify_every, generation_weights=generation_weights, shutdown_grace=shutdown_grace, log_level=log_level,
        prompt_lookup=prompt_lookup or [], draft=draft or [], draft_tokens=draft_tokens,
        access_log=log_level.lower() in ("debug", "trace"),
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
