"""Prometheus metrics of the server and of the runtime underneath it.

Every server has its own :class:`prometheus_client.CollectorRegistry` (no global state:
two servers in one process do not share counters). Request metrics are observed by the
HTTP middleware; inference metrics by the data plane; the runtime's ledger, tasks and
queue are read from ``Runtime.stats()`` at scrape time, so they are never stale.

``layerfit_queue_seconds`` (submission to the job's first task) is observed from the
runtime's future, which carries ``queue_seconds`` once the job's first task started.

The process's own memory and CPU (``process_resident_memory_bytes`` and the rest of
Prometheus's standard process metrics, on Linux) sit beside the ledger: the ledger
counts what the scheduler hands out, RSS what the process holds, so the gap shows
memory that no budget counts.

Labels are bounded: ``endpoint`` is the route template (``/v2/models/{name}/infer``,
not the URL), and ``model`` is a model of the repository or ``""`` — a client cannot
create new time series by inventing model names.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ObservedRuntime(Protocol):
    """What the metrics read of the runtime (:class:`~layerfit.Runtime` is one): its models
    by name, and its stats at each scrape."""

    models: Mapping[str, Any]

    def stats(self) -> dict[str, Any]: ...


class RuntimeCollector(Collector):
    """Gauges read from ``Runtime.stats()`` and the data plane at each scrape."""

    def __init__(self, stats: Callable[[], dict[str, Any]], inflight: Callable[[], int], requests: Any = None) -> None:
        self.stats = stats
        self.inflight = inflight
        self.requests = requests

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "layerfit_inflight_requests", "Inference requests admitted and not yet answered",
            value=self.inflight(),
        )
        if self.requests is not None:
            memory = GaugeMetricFamily(
                "layerfit_request_bytes",
                "Request memory (bodies and their decoding, outside the budget): bytes held now "
                "(in_flight), the most held at once (peak) and the limit (--request-memory)",
                labels=["kind"],
            )
            for kind, value in (("in_flight", self.requests.in_use), ("peak", self.requests.peak),
                                ("limit", self.requests.capacity)):
                memory.add_metric([kind], float(value))
            yield memory
            yield CounterMetricFamily(
                "layerfit_request_memory_refusals", "Requests refused because request memory was full or too small",
                value=float(self.requests.refused),
            )
        try:
            stats = self.stats()
        except Exception:  # a scrape must not fail because the runtime is shutting down
            return
        yield from runtime_families(stats)


def runtime_families(stats: dict[str, Any]) -> Iterator[Metric]:
    """Metric families of one ``Runtime.stats()`` snapshot."""
    memory = GaugeMetricFamily(
        "layerfit_memory_bytes",
        "Memory ledger of the runtime: bytes reserved now (in_use), the budget, the peak "
        "reservation, bytes of unit buffers actually held, and of those the weight cache's",
        labels=["kind"],
    )
    for kind, key in (("in_use", "in_use_bytes"), ("budget", "budget_bytes"), ("peak", "peak_bytes"),
                      ("unit_buffers", "unit_buffer_bytes")):
        memory.add_metric([kind], float(stats.get(key) or 0))
    cache = stats.get("weight_cache")
    if cache is not None:
        memory.add_metric(["weight_cache"], float(cache["bytes"]))
    yield memory
    process = stats.get("process_memory")
    if process is not None:
        held = GaugeMetricFamily(
            "layerfit_process_bytes",
            "The server process's memory as the kernel counts it now: anonymous pages (anon), mapped file "
            "pages (file) and the resident set's peak (peak)",
            labels=["kind"],
        )
        for kind, key in (("anon", "anon_bytes"), ("file", "file_bytes"), ("peak", "peak_bytes")):
            held.add_metric([kind], float(process[key]))
        yield held
    limit = stats.get("memory_limit")
    if limit is not None:
        footprint = GaugeMetricFamily(
            "layerfit_memory_limit_bytes",
            "--memory-limit and how it was spent: the limit, the footprint measured beside the weights "
            "(anonymous, files, request memory, headroom) and the budget it left the runtime",
            labels=["kind"],
        )
        for kind, key in (("limit", "memory_limit_bytes"), ("footprint", "footprint_bytes"),
                          ("anon", "footprint_anon_bytes"), ("file", "footprint_file_bytes"),
                          ("requests", "request_memory_bytes"), ("headroom", "headroom_bytes"),
                          ("budget", "weight_budget_bytes")):
            footprint.add_metric([kind], float(limit[key]))
        yield footprint
    if cache is not None:
        loads = CounterMetricFamily(
            "layerfit_weight_cache_loads", "Unit loads served by the weight cache (hit) or read from storage (miss)",
            labels=["result"],
        )
        loads.add_metric(["hit"], float(cache["hits"]))
        loads.add_metric(["miss"], float(cache["misses"]))
        yield loads
        yield CounterMetricFamily(
            "layerfit_weight_cache_evictions", "Cached units freed because a task needed their memory",
            value=float(cache["evictions"]),
        )
    tasks = CounterMetricFamily("layerfit_tasks", "Runtime tasks started, by type", labels=["type"])
    for kind, count in sorted(stats.get("tasks_started", {}).items()):
        tasks.add_metric([str(kind)], float(count))
    yield tasks
    yield GaugeMetricFamily("layerfit_tasks_running", "Runtime tasks running now",
                            value=float(stats.get("tasks_running") or 0))
    yield GaugeMetricFamily("layerfit_queue_length", "Unfinished jobs in the runtime (queued or running)",
                            value=float(stats.get("queue_length") or 0))
    if stats.get("queue_limit") is not None:
        yield GaugeMetricFamily("layerfit_queue_limit", "Most unfinished jobs the runtime takes",
                                value=float(stats["queue_limit"]))
    jobs = CounterMetricFamily("layerfit_jobs", "Runtime jobs by outcome", labels=["outcome"])
    for outcome, count in sorted(stats.get("jobs", {}).items()):
        jobs.add_metric([str(outcome)], float(count))
    yield jobs
    if stats.get("compute_threads") is not None:
        yield GaugeMetricFamily("layerfit_compute_threads", "Threads each PyTorch kernel uses",
                                value=float(stats["compute_threads"]))
    yield CounterMetricFamily(
        "layerfit_progress_rule", "Tasks admitted alone beyond the budget by the progress rule",
        value=float(stats.get("progress_rule_fired") or 0),
    )
    yield from decoding_families(stats.get("decoding") or {})


def decoding_families(decoding: dict[str, dict[str, int]]) -> Iterator[Metric]:
    """Each open decode loop's passes, tokens (and of them those prompt lookup proposed and
    a pass accepted), storage bytes read, and bytes per token."""
    tokens = CounterMetricFamily(
        "layerfit_decode_tokens", "Tokens decoded, summed over the sequences of each pass (end tokens included)",
        labels=["model"],
    )
    passes = CounterMetricFamily(
        "layerfit_decode_passes", "Engine passes of the decode loop (one step of every sequence in flight)",
        labels=["model"],
    )
    proposed = CounterMetricFamily(
        "layerfit_decode_proposed_tokens", "Tokens prompt lookup or the draft model proposed for a pass to verify",
        labels=["model"],
    )
    draft_passes = CounterMetricFamily(
        "layerfit_decode_draft_passes", "Passes of the model's draft model (--draft), proposing tokens", labels=["model"]
    )
    accepted = CounterMetricFamily(
        "layerfit_decode_accepted_tokens",
        "Proposed tokens a pass accepted: tokens made beyond one per sequence a pass", labels=["model"],
    )
    read = CounterMetricFamily(
        "layerfit_decode_read_bytes", "Bytes the decode loop's engine read from storage", labels=["model"]
    )
    per_token = GaugeMetricFamily(
        "layerfit_read_bytes_per_token", "Storage bytes read per decoded token since the loop opened", labels=["model"]
    )
    for name, loop in sorted(decoding.items()):
        tokens.add_metric([name], float(loop.get("sequence_steps", 0)))
        passes.add_metric([name], float(loop.get("steps", 0)))
        proposed.add_metric([name], float(loop.get("proposed", 0)))
        accepted.add_metric([name], float(loop.get("accepted", 0)))
        draft_passes.add_metric([name], float(loop.get("draft_passes", 0)))
        read.add_metric([name], float(loop.get("read_bytes", 0)))
        if loop.get("sequence_steps"):
            per_token.add_metric([name], loop.get("read_bytes", 0) / loop["sequence_steps"])
    yield tokens
    yield passes
    yield proposed
    yield accepted
    yield draft_passes
    yield read
    yield per_token


class ServerMetrics:
    """The server's metrics registry: request, inference and runtime metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.models: Callable[[], Any] = dict
        self.requests = Counter(
            "layerfit_requests", "HTTP requests answered, by endpoint, model and status",
            ["endpoint", "model", "status"], registry=self.registry,
        )
        self.request_seconds = Histogram(
            "layerfit_request_duration_seconds", "Time to answer an HTTP request",
            ["endpoint", "model"], buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.inference_seconds = Histogram(
            "layerfit_inference_duration_seconds", "Time from submission to the runtime to the result",
            ["model"], buckets=_LATENCY_BUCKETS, registry=self.registry,
        )
        self.queue_seconds = Histogram(
            "layerfit_queue_seconds", "Time an inference waited in the runtime queue before it started",
            ["model"], buckets=_LATENCY_BUCKETS, registry=self.registry,
        )

    def attach(self, runtime: ObservedRuntime, inflight: Callable[[], int], requests: Any = None) -> None:
        """Read the runtime's models and stats, the data plane's in-flight count and its
        request memory (a :class:`~layerfit.serve.body.RequestMemory`)."""
        self.models = lambda: runtime.models
        self.registry.register(RuntimeCollector(runtime.stats, inflight, requests))

    def _model_label(self, name: str | None) -> str:
        if name is None:
            return ""
        return name if name in self.models() else "<unknown>"

    def observe_request(self, scope: MutableMapping[str, Any], status: int, seconds: float) -> None:
        route = scope.get("route")
        endpoint = getattr(route, "path", None) or "<unmatched>"
        model = self._model_label(scope.get("path_params", {}).get("name"))
        self.requests.labels(endpoint, model, str(status)).inc()
        self.request_seconds.labels(endpoint, model).observe(seconds)

    def observe_inference(self, model: str, seconds: float, future: Any) -> None:
        self.inference_seconds.labels(model).observe(seconds)
        queued = getattr(future, "queue_seconds", None)
        if queued is not None:
            self.queue_seconds.labels(model).observe(queued)

    def render(self) -> tuple[bytes, str]:
        """The Prometheus text exposition and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
