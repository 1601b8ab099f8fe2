"""The charts and the short summaries that open the headline bench pages and the Results page.

Each headline bench (``vs_mmap``, ``vs_accelerate``, ...) has an :class:`Opening`: the
charts drawn from its committed JSON and at most three lines saying what they show and
the one number that matters, every number computed from the JSON (``tools/docs_pages.py``
adds the line naming the machine, the date and the commit it was measured at). The
charts follow ``tools/chart_style.py``: one colour per system, axes labelled with units.
A person reads the picture first; the method and the full tables follow on the page.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

import chart_style as style

MB = 1e6


@dataclass(frozen=True)
class Chart:
    """One picture of a bench page: ``draw`` makes the figure from the JSON's data."""

    name: str  # the PNG's name is ``<result stem>_<name>.png``
    caption: str
    draw: Callable[[dict], object]


@dataclass(frozen=True)
class Opening:
    """What a headline bench page opens with: its charts and its summary lines."""

    charts: tuple[Chart, ...]
    summary: Callable[[dict], list[str]]


def _range(values: list[float], unit: str = "×") -> str:
    """``a–b×`` over the values (one value: ``a×``)."""
    low, high = min(values), max(values)
    return f"{low:.2f}{unit}" if round(low, 2) == round(high, 2) else f"{low:.2f}–{high:.2f}{unit}"


def _line(ax, xs, ys, label: str, **kwargs) -> None:
    points = sorted((x, y) for x, y in zip(xs, ys, strict=True) if y is not None)
    if points:
        ax.plot([x for x, _ in points], [y for _, y in points], label=label, color=style.colour(label),
                marker=kwargs.pop("marker", "o"), **kwargs)


def _bars(ax, groups: list[str], series: dict[str, list[float | None]], ylabel: str, xlabel: str) -> None:
    """Grouped bars: one group per entry of ``groups``, one bar per series in each."""
    width = 0.8 / max(len(series), 1)
    for k, (label, values) in enumerate(series.items()):
        xs = [g + (k - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [v if v is not None else 0 for v in values], width, label=label, color=style.colour(label))
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", visible=False)


def _log_y(ax) -> None:
    """A log y axis with plain numbers at 1, 2 and 5 of each decade."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _finish(fig, axes) -> object:
    """One legend: in the panel for a single panel, below them all for several."""
    if len(axes) == 1:
        axes[0].legend(loc="best")
        fig.tight_layout()
        return fig
    handles: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    fig.tight_layout()
    fig.legend(list(handles.values()), list(handles), loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=min(len(handles), 4), frameon=False)
    return fig


# --------------------------------------------------------------------------- against the peers


_VS_MMAP = {"mmap": "PyTorch mmap", "layerfit": "layerfit", "llamacpp": "llama.cpp"}


def draw_vs_mmap(data: dict) -> object:
    models = data["models"]
    fig, axes = style.figure(len(models), height=3.3)
    for ax, (name, model) in zip(axes, models.items(), strict=True):
        for config, label in _VS_MMAP.items():
            best: dict[float, float] = {}
            for row in model["rows"]:
                if row["config"] == config and row.get("step_s") is not None:
                    x = row["limit_bytes"] / MB
                    best[x] = min(best.get(x, float("inf")), row["step_s"] * 1e3)
            _line(ax, list(best), list(best.values()), label)
        sweep = [s for s in model.get("vs_sweep", []) if s.get("best_step_s") is not None]
        _line(ax, [s["limit_bytes"] / MB for s in sweep], [s["best_step_s"] * 1e3 for s in sweep],
              "layerfit, best hand-chosen budget", linestyle="--", marker=".")
        _log_y(ax)
        ax.set_title(f"{name} ({model['weights_bytes'] / MB:,.0f} MB of weights)")
        ax.set_xlabel("memory limit (MB)")
    axes[0].set_ylabel("time per step (ms, log scale)")
    return _finish(fig, axes)


def summary_vs_mmap(data: dict) -> list[str]:
    short = [s["vs_layerfit"] for m in data["models"].values() for s in m.get("short_limits", [])]
    sweep = [s["ratio"] for m in data["models"].values() for s in m.get("vs_sweep", [])
             if s.get("ratio") is not None and s.get("best_chosen_by")]
    lines = ["Time per step (log scale) at each memory limit, one fresh process in its own cgroup per point: "
             "PyTorch's mmap loading, layerfit choosing its own budget inside the limit, llama.cpp on an f32 GGUF "
             "of the same weights, and layerfit at the best budget a person found by hand."]
    if short:
        lines.append(f"Where the model does not fit the limit, mmap's step takes **{_range(short)}** layerfit's "
                     f"(median {statistics.median(short):.2f}×, {len(short)} limits over "
                     f"{len(data['models'])} models).")
    if sweep:
        lines.append(f"layerfit's own budget against the best hand-chosen one: median {statistics.median(sweep):.2f}× "
                     f"its step time ({_range(sweep)}).")
    return lines


def draw_vs_accelerate(data: dict) -> object:
    fig, (ax,) = style.figure(1, height=3.2, width=style.PAGE_WIDTH * 0.75)
    for pipeline in ("async", "auto"):
        rows = [r for r in data["layerfit_sweep"] if r["pipeline_requested"] == pipeline]
        _line(ax, [r["weights_peak_bytes"] / MB for r in rows], [r["latency_s"] * 1e3 for r in rows],
              f"layerfit {pipeline}")
    ax.axhline(data["accelerate"]["latency_s"] * 1e3, color=style.colour("Accelerate"), linestyle="--",
               label="Accelerate")
    ax.set_xlabel("weights held in memory by layerfit (MB)")
    ax.set_ylabel("latency per inference (ms)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{data['model']}, input {'×'.join(str(n) for n in data['input_shape'])}")
    return _finish(fig, [ax])


def summary_vs_accelerate(data: dict) -> list[str]:
    speedups = [p[k] for p in data["by_pipeline"].values() for k in ("speedup_smallest", "speedup_largest")]
    same = all(p.get("same_output") for p in data["by_pipeline"].values())
    return ["Latency of one inference against the weights layerfit held, beside Accelerate's disk offload of "
            "the same model (dashed): layerfit's async and auto pipelines over a sweep of budgets.",
            f"layerfit is **{_range(speedups)}** faster than Accelerate at the smallest and the largest budget "
            f"that fits, {'with the same output' if same else 'though the outputs differ (see the tables)'}."]


def _llamacpp_q_series(model: dict) -> dict[str, dict[float, float]]:
    names = {"llamacpp": "llama.cpp", "packed": "layerfit packed (int4)", "dequantize": "layerfit dequantized",
             "fp32": "layerfit float32"}
    series: dict[str, dict[float, float]] = {}
    for row in model["rows"]:
        if row["config"] in names and row.get("limit_bytes") and row.get("step_s"):
            series.setdefault(names[row["config"]], {})[row["limit_bytes"] / MB] = 1 / row["step_s"]
    return series


def draw_vs_llamacpp_quantized(data: dict) -> object:
    models = data["models"]
    fig, axes = style.figure(len(models), height=3.3)
    for ax, (name, model) in zip(axes, models.items(), strict=True):
        for label, points in _llamacpp_q_series(model).items():
            lone = len(points) == 1
            _line(ax, list(points), list(points.values()), label, marker="D" if lone else "o",
                  markersize=7 if lone else 6)
        ax.set_title(f"{name} ({model['quant']} file, {model['gguf_bytes'] / MB:,.0f} MB)")
        ax.set_xlabel("memory limit (MB)")
        ax.set_ylim(bottom=0)
    axes[0].set_ylabel("tokens per second")
    return _finish(fig, axes)


def summary_vs_llamacpp_quantized(data: dict) -> list[str]:
    ratios = [p["packed_over_llamacpp"] for m in data["models"].values() for p in m.get("per_limit", [])]
    packed = [m["packed_over_fp32_at_40"]["ratio"] for m in data["models"].values() if m.get("packed_over_fp32_at_40")]
    lines = ["Tokens per second at each memory limit on the same quantized GGUF file: llama.cpp, layerfit's packed "
             "int4 kernels, and (single points) its dequantized and float32 routes."]
    if ratios:
        lines.append(f"layerfit packed reaches **{_range(ratios)}** llama.cpp's tokens/s across the limits.")
    if packed:
        lines.append(f"Packed against layerfit's float32 at 40% of the float32 weights: {_range(packed)} the tokens/s.")
    return lines


# --------------------------------------------------------------------------- the papers' tables


_PIPELINES = ("preload", "sequential", "sync", "async", "async-md")


def draw_demand_layering(data: dict) -> object:
    rows = data["rows"]
    fig, (ax,) = style.figure(1, height=3.3)
    groups = [f"{r['model']}\n{r['resolution']} px" for r in rows]
    series = {p: [r["interleaved"][p]["median_s"] / r["interleaved"]["physical_limit_s"]
                  if p in r["interleaved"] else None for r in rows] for p in _PIPELINES}
    _bars(ax, groups, series, "latency ÷ physical limit (1 = the bound)", "model, input resolution")
    ax.axhline(1, color=style.colour("bound"), linewidth=1, label="bound")
    ax.set_ylim(bottom=0.8)
    return _finish(fig, [ax])


def summary_demand_layering(data: dict) -> list[str]:
    over = {p: [r["interleaved"][p]["median_s"] / r["interleaved"]["physical_limit_s"] for r in data["rows"]
                if p in r["interleaved"]] for p in ("async-md", "sequential")}
    return ["Demand Layering's Table II on this machine: each pipeline's median latency over the physical limit "
            "(the larger of the summed kernel time and the summed read time), per model.",
            f"async-md is **{_range(over['async-md'])}** the bound (median {statistics.median(over['async-md']):.2f}×); "
            f"the sequential baseline {_range(over['sequential'])}."]


def draw_memory_planner(data: dict) -> object:
    nets = data["networks"]
    paper = data["paper"]["offsets"]
    names = data["paper"]["networks"]
    heuristics = [k for k in paper if k not in ("lower bound", "naive")]
    fig, (ax,) = style.figure(1, height=3.3)
    groups = list(nets)
    series = {
        "layerfit best": [nets[n]["offsets"]["strategies"]["best"]["total"] / 2**20 for n in groups],
        "lower bound": [nets[n]["offsets"]["lower_bound"] / 2**20 for n in groups],
        "paper's best, on its own graphs": [min(paper[h][names.index(n)] for h in heuristics) if n in names else None for n in groups],
    }
    _bars(ax, [n.replace("_", " ") for n in groups], series, "activation arena (MiB)", "network")
    return _finish(fig, [ax])


def summary_memory_planner(data: dict) -> list[str]:
    nets = data["networks"].values()
    over = [n["offsets"]["strategies"]["best"]["total"] / n["offsets"]["lower_bound"] for n in nets]
    naive = [n["offsets"]["naive"] / n["offsets"]["strategies"]["best"]["total"] for n in nets]
    return ["Pisarchyk & Lee's Table 2 (offset calculation) on the zoo's graphs: layerfit's best plan beside the "
            "lower bound on our graphs and the best plan the paper reports for its own (TFLite) graphs.",
            f"layerfit's best arena is **{_range(over)}** the lower bound over {len(over)} networks, "
            f"{_range(naive)} smaller than no sharing at all."]


# --------------------------------------------------------------------------- decoding


def draw_moe_decoding(data: dict) -> object:
    models = data["models"]
    fig, axes = style.figure(len(models), height=3.3)
    for ax, (name, model) in zip(axes, models.items(), strict=True):
        series: dict[str, tuple[list[float], list[float]]] = {}
        for config, run in model["results"].items():
            label = config.split(" at ")[0]
            xs, ys = series.setdefault(label, ([], []))
            xs.append(run["weights_peak_bytes"] / MB)
            ys.append(run["token_s"] * 1e3)
        for label, (xs, ys) in series.items():
            _line(ax, xs, ys, label, marker="*" if len(xs) == 1 else "o", markersize=11 if len(xs) == 1 else 6)
        ax.set_title(f"{name} ({model['weights_bytes'] / MB:,.0f} MB of weights)")
        ax.set_xlabel("weights held in memory (MB)")
        ax.set_ylim(bottom=0)
    axes[0].set_ylabel("time per token (ms)")
    return _finish(fig, axes)


def summary_moe_decoding(data: dict) -> list[str]:
    gains = []
    for model in data["models"].values():
        for config, run in model["results"].items():
            if config.startswith("whole at "):
                routed = model["results"].get("routed at " + config.removeprefix("whole at "))
                if routed:
                    gains.append(run["token_s"] / routed["token_s"])
    return ["Time per generated token of two mixture-of-experts decoders against the weights held: reading only "
            "the experts a token is routed to (with and without the expert cache and the read-ahead) against "
            "reading every expert (whole), and everything preloaded (star).",
            f"Routing the reads makes a token **{_range(gains)}** faster than reading whole layers at the same budgets."]


_MODES = ("plain", "lookup", "draft", "batch 8")


def draw_speculative_trained(data: dict) -> object:
    table = data["table"]
    fig, (ax,) = style.figure(1, height=3.2)
    groups = list(table)
    series = {m: [table[b][m]["tokens_per_s"] if m in table[b] else None for b in groups] for m in _MODES}
    _bars(ax, [g if g == "preload" else f"budget {g}" for g in groups], series, "tokens per second",
          f"weights held (share of the {data['weights_bytes'] / MB:.0f} MB model; preload: all of it)")
    return _finish(fig, [ax])


def summary_speculative_trained(data: dict) -> list[str]:
    target = data["target_2x"]
    tightest = list(target)[-1]
    return ["Tokens per second of a decoder trained to copy, at each share of its weights held: plain greedy, "
            "prompt lookup, a trained draft model, and a batch of 8 streams sharing each weight stream.",
            f"At {tightest} of the weights, lookup gives **{target[tightest]['lookup']['vs_plain']:.2f}×** plain's "
            f"tokens/s and the draft {target[tightest]['draft']['vs_plain']:.2f}× "
            f"({_range([v['vs_plain'] for t in target.values() for v in t.values()])} over all budgets and both)."]


# --------------------------------------------------------------------------- serving


def draw_serve_load(data: dict) -> object:
    by_model = data["by_model"]
    fig, (ax,) = style.figure(1, height=3.0, width=style.PAGE_WIDTH * 0.75)
    groups = list(by_model)
    _bars(ax, groups, {"p50": [by_model[m]["p50_ms"] for m in groups],
                       "p95": [by_model[m]["p95_ms"] for m in groups]}, "request latency (ms)", "model")
    return _finish(fig, [ax])


def summary_serve_load(data: dict) -> list[str]:
    config = data["config"]
    return [f"Request latency per model while {config['clients']} clients load `layerfit serve` for "
            f"{data['load_seconds']:.0f} s, all models under one {config['memory_budget']} budget "
            f"({config['workers']} workers, policy {config['policy']}).",
            f"**{data['throughput_rps']:.1f} requests/s**, p95 {data['latency']['p95_ms']:.0f} ms, "
            f"{data['unanswered']} unanswered; the budget's ledger peaked at "
            f"{data['ledger']['peak_bytes'] / MB:.1f} MB of {data['ledger']['budget_bytes'] / MB:.1f} MB."]


def draw_serve_generate(data: dict) -> object:
    fig, (ax,) = style.figure(1, height=3.2, width=style.PAGE_WIDTH * 0.75)
    for name, model in data["models"].items():
        phases = model["phases"]
        _line(ax, [p["clients"] for p in phases], [p["tokens_per_s"] for p in phases], name)
    ax.set_xlabel("concurrent streaming clients")
    ax.set_ylabel("tokens per second, all clients")
    ax.set_ylim(bottom=0)
    return _finish(fig, [ax])


def summary_serve_generate(data: dict) -> list[str]:
    gains = {}
    for name, model in data["models"].items():
        phases = model["phases"]
        gains[name] = (phases[-1]["clients"], phases[-1]["tokens_per_s"] / phases[0]["tokens_per_s"])
    said = ", ".join(f"{name} {gain:.1f}× at {clients} clients" for name, (clients, gain) in gains.items())
    return [f"Aggregate tokens per second as more clients stream `/v1/completions` from one server under a "
            f"{data['budget']} budget, per model.",
            f"Over one client's tokens/s: **{said}**."]


# --------------------------------------------------------------------------- scheduling


_POLICIES = ("masa-fair", "masa", "bulk", "deepeye")


def draw_masa(data: dict) -> object:
    real = data["real"]
    fig, (ax,) = style.figure(1, height=3.4)
    groups, series = [], {p: [] for p in _POLICIES}
    for workload, budgets in real.items():
        tightest = budgets[min(budgets, key=float)]
        baseline = min(tightest[p]["response_time_s"]["mean"] for p in ("bulk", "deepeye"))
        groups.append(workload.replace("random-arrivals", "random\narrivals").replace(" rho=", "\nρ = "))
        for p in _POLICIES:
            series[p].append(tightest[p]["response_time_s"]["mean"] / baseline if p in tightest else None)
    _bars(ax, groups, series, "mean response ÷ better baseline's", "workload (real executor, tightest budget)")
    ax.axhline(1, color=style.colour("bound"), linewidth=1)
    ax.tick_params(axis="x", labelsize=8)
    return _finish(fig, [ax])


def summary_masa(data: dict) -> list[str]:
    ratios = [h["masa-fair_over_best_baseline"] for h in data["headroom"]
              if h["executor"].startswith("real") and h.get("masa-fair_over_best_baseline") is not None]
    return ["MASA on the real executor at each workload's tightest budget: mean response time of masa-fair and "
            "plain masa over the better of the Bulk and DeepEye baselines (below 1 is faster).",
            f"masa-fair takes **{_range(ratios)}** the better baseline's mean response time "
            f"(median {statistics.median(ratios):.2f}×, {len(ratios)} workloads)."]


OPENINGS: dict[str, Opening] = {
    "vs_mmap": Opening((Chart("steps", "Time per step against the memory limit, by model.", draw_vs_mmap),),
                       summary_vs_mmap),
    "vs_accelerate": Opening((Chart("latency", "Latency against the weights held, beside Accelerate.",
                                    draw_vs_accelerate),), summary_vs_accelerate),
    "vs_llamacpp_quantized": Opening((Chart("tokens", "Tokens per second against the memory limit, by model.",
                                            draw_vs_llamacpp_quantized),), summary_vs_llamacpp_quantized),
    "demand_layering": Opening((Chart("bound", "Each pipeline's latency over the physical limit, by model.",
                                      draw_demand_layering),), summary_demand_layering),
    "memory_planner": Opening((Chart("offsets", "Activation arena by network: ours, the bound, the paper's.",
                                     draw_memory_planner),), summary_memory_planner),
    "moe_decoding": Opening((Chart("tokens", "Time per token against the weights held, by MoE model.",
                                   draw_moe_decoding),), summary_moe_decoding),
    "speculative_trained": Opening((Chart("modes", "Tokens per second by decoding mode and budget.",
                                          draw_speculative_trained),), summary_speculative_trained),
    "serve_load": Opening((Chart("latency", "Request latency per model under load.", draw_serve_load),),
                          summary_serve_load),
    "serve_generate": Opening((Chart("clients", "Aggregate tokens per second against concurrent clients.",
                                     draw_serve_generate),), summary_serve_generate),
    "masa": Opening((Chart("response", "Mean response time over the better baseline's, by workload.", draw_masa),),
                    summary_masa),
}


# The Results page: per area, the bench whose chart stands for it, then the others to read.
AREAS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("Against the peers", "vs_mmap", ("vs_accelerate", "vs_llamacpp_quantized")),
    ("The papers' tables reproduced", "demand_layering", ()),
    ("Decoding", "speculative_trained", ("moe_decoding",)),
    ("Serving", "serve_generate", ("serve_load",)),
    ("Memory planning", "memory_planner", ()),
    ("Scheduling", "masa", ()),
)
