"""Generate the documentation pages that must never be typed by hand.

* ``docs/benchmarks/<bench>.md``, one page per script in ``bench/``: the script's own
  description, the command that reproduces it, and every ``bench/results/*.json`` it
  wrote rendered as tables (and, for a few, plots), plus ``docs/benchmarks/index.md``;
* ``docs/reference/cli.md``: every command of ``layerfit`` with its usage and options, read
  from the click command that typer builds from the command definitions;
* the endpoint tables of ``docs/reference/http.md``, rendered in place from the server's
  OpenAPI document (``layerfit.serve.openapi``: the one the fuzzer reads); the page itself
  is committed, and a test fails when its tables and the document differ;
* ``docs/img/memory_latency.png``: the README's picture, latency against weight memory for
  ResNet-152 and GPT-2 small, from ``bench/results/auto_pipeline.json`` and
  ``decoding.json``.

``make docs`` runs it before ``mkdocs build``; the generated pages are ignored by git (the
picture is committed, since the README shows it outside the site). Run it by hand with
``python tools/docs_pages.py``.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
DOCS = ROOT / "docs"

# Result files whose name does not start with the script that wrote them.
SCRIPT_OF = {
    "serve_whisper": "serve_load",  # bench/serve_load.py --models whisper_base
    "refactor35_hook_overhead": "hook_overhead",
    "refactor35_": "ab_commits",  # bench/ab_commits.py runs another bench on two commits
    "spread_decoding": "ab_commits",  # decoding.py before and after the spread of streamed units
    "reader_batch_": "ab_commits",  # benches before and after the reader waited for its own read's room
    "read_ahead_default_": "ab_commits",  # decoding.py before and after the read-ahead was on by default
    "arch2_": "ab_commits",  # the three benches before and after the architecture redesign (#53)
    "vs_mmap_read_ahead": "vs_mmap",  # bench/vs_mmap.py with the read-ahead on, before it was the default
    "prepare_larger_than_memory": "prepare_memory",  # bench/prepare_memory.py --larger-than-memory
}
MAX_COLUMNS = 14
MAX_ROWS = 120
INLINE_LIST = 6
MAX_LEVEL = 4  # deeper than #### a value is one key/value table of its dotted leaves
MAX_LINES = 400  # per result file; the JSON holds the rest

# --------------------------------------------------------------------------- formatting


def _fmt(key: str, value: Any) -> str:
    """One cell: numbers to 4 significant digits, byte counts also in MB."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        text = f"{value:,}"
        if key.endswith("bytes") and abs(value) >= 100_000:
            text += f" ({value / 1e6:.1f} MB)"
        return text
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if key.endswith("bytes") and abs(value) >= 100_000:
            return f"{value / 1e6:.1f} MB"
        return f"{value:.4g}"
    if isinstance(value, list):
        return _fmt_list(key, value)
    text = str(value).replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= 120 else text[:117] + "…"


def _fmt_list(key: str, values: list) -> str:
    if not values:
        return "[]"
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        if len(values) <= INLINE_LIST:
            return ", ".join(_fmt(key, v) for v in values)
        return f"{len(values)} values, median {_fmt(key, statistics.median(values))}"
    if all(isinstance(v, str) for v in values) and len(values) <= INLINE_LIST * 2:
        return _fmt(key, ", ".join(values))
    return f"{len(values)} items"


def _scalar(value: Any) -> bool:
    return not isinstance(value, (dict, list)) or (
        isinstance(value, list) and not any(isinstance(v, (dict, list)) for v in value)
    )


def _flatten(record: dict, prefix: str = "") -> dict[str, Any]:
    """A record's leaves as dotted columns; lists of records count as one cell."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_flatten(value, name + "."))
        elif isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
            out[name] = f"{len(value)} items"
        else:
            out[name] = value
    return out


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows[:MAX_ROWS]]
    if len(rows) > MAX_ROWS:
        lines.append(f"\n*{len(rows) - MAX_ROWS} more rows in the JSON file.*")
    return lines + [""]


def _records_table(label: str, records: list[tuple[str, dict]]) -> list[str] | None:
    """Records as one table (a row each), or None when they have too many columns or
    are not alike (fewer than half their fields shared)."""
    keys = [set(record) for _, record in records]
    if len(set.intersection(*keys)) * 2 < len(set.union(*keys)):
        return None
    flat = [(name, _flatten(record)) for name, record in records]
    columns: list[str] = []
    for _, record in flat:
        columns += [c for c in record if c not in columns]
    # Long lists of samples are in the JSON; a table shows their summary only when short.
    if len(columns) > MAX_COLUMNS:
        if len(flat) > 8 or len(columns) > 60 or not label:
            return None
        # Few records of many fields: a column per record.
        header = [label] + [name for name, _ in flat]
        rows = [[f"`{c}`"] + [_fmt(c, rec.get(c)) for _, rec in flat] for c in columns]
        return _table(header, rows)
    header = ([label] if label else []) + columns
    rows = [([name] if label else []) + [_fmt(c, rec.get(c)) for c in columns] for name, rec in flat]
    return _table(header, rows)


def _title_of(record: dict, index: int) -> str:
    parts = [str(v) if isinstance(v, str) else f"{k} {v:g}" for k, v in record.items()
             if isinstance(v, (str, int, float)) and not isinstance(v, bool)
             and k in ("model", "name", "workload", "mode", "policy", "resolution", "budget", "scenario",
                       "trace", "variant", "config", "label", "arch", "pipeline", "fraction")]
    return ", ".join(parts[:3]) if parts else f"row {index + 1}"


def render(value: Any, level: int, label: str = "") -> list[str]:
    """A JSON value as Markdown: scalars as a key/value table, records as tables."""
    heading = "#" * min(level, 6)
    if isinstance(value, dict) and level > MAX_LEVEL:
        flat = _flatten(value)
        return _table(["key", "value"], [[f"`{k}`", _fmt(k, v)] for k, v in flat.items()])
    if isinstance(value, dict):
        scalars = {k: v for k, v in value.items() if _scalar(v)}
        nested = {k: v for k, v in value.items() if not _scalar(v)}
        lines: list[str] = []
        if scalars:
            lines += _table(["key", "value"], [[f"`{k}`", _fmt(k, v)] for k, v in scalars.items()])
        if nested and all(isinstance(v, dict) for v in nested.values()) and len(nested) > 1:
            table = _records_table(label or "name", list(nested.items()))
            if table is not None:
                lines += table
                # The records' lists of records are cells of "N items" above: shown here.
                for name, record in nested.items():
                    for key, sub in record.items():
                        if isinstance(sub, list) and sub and all(isinstance(v, dict) for v in sub):
                            lines += [f"{heading} {name}: {key}", ""] + render(sub, level + 1, key)
                return lines
        for key, sub in nested.items():
            lines += [f"{heading} {key}", ""] + render(sub, level + 1, key)
        return lines
    if isinstance(value, list):
        if all(isinstance(v, dict) for v in value):
            table = _records_table("", [("", v) for v in value])
            if table is None and len(value) <= 8:
                titled = [(_title_of(v, i), v) for i, v in enumerate(value)]
                table = _records_table(label or "field", titled)
            if table is not None:
                return table
            lines = []
            for i, record in enumerate(value[:MAX_ROWS]):
                lines += [f"{heading} {_title_of(record, i)}", ""] + render(record, level + 1)
            return lines
        return [_fmt_list(label, value), ""]
    return [_fmt(label, value), ""]


# --------------------------------------------------------------------------- plots


def _plot_setup():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "layerfit", "figure.dpi": 100})
    return plt


def _save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None}, bbox_inches="tight")


def _auto_pipeline_curve(model: dict) -> dict[str, tuple[list[float], list[float]]]:
    curves: dict[str, tuple[list[float], list[float]]] = {}
    for budget in model["budgets"]:
        for pipeline in ("async", "auto"):
            run = budget.get(pipeline)
            if run and "median_s" in run:
                xs, ys = curves.setdefault(pipeline, ([], []))
                xs.append(run["weights_peak_bytes"] / 1e6)
                ys.append(run["median_s"] * 1e3)
    preload = next((b["preload"] for b in model["budgets"] if "preload" in b), None)
    if preload:
        curves["preload"] = ([preload["weights_peak_bytes"] / 1e6], [preload["median_s"] * 1e3])
    return curves


def _draw_curves(ax, curves, title: str, ylabel: str) -> None:
    styles = {"preload": dict(marker="*", markersize=12, linestyle="none", color="tab:green"),
              "async": dict(marker="o", color="tab:blue"), "auto": dict(marker="s", color="tab:orange")}
    for name, (xs, ys) in curves.items():
        points = sorted(zip(xs, ys, strict=True))
        ax.plot([x for x, _ in points], [y for _, y in points], label=name,
                **styles.get(name, dict(marker="o")))
    ax.set_xlabel("weights held in memory (MB)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _plot_models(data: dict, path: Path, curves: Callable[[dict], dict], ylabel: str, width: float, height: float) -> None:
    """One panel per model of ``data["models"]``, each with the curves ``curves`` draws from it."""
    plt = _plot_setup()
    models = data["models"]
    fig, axes = plt.subplots(1, len(models), figsize=(width * len(models), height), squeeze=False)
    for ax, (name, model) in zip(axes[0], models.items(), strict=True):
        _draw_curves(ax, curves(model), name, ylabel)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def plot_auto_pipeline(data: dict, path: Path) -> str:
    _plot_models(data, path, _auto_pipeline_curve, "latency per inference (ms)", 3.2, 3.0)
    return "Latency against the weights each pipeline held, by model (medians of the rounds)."


def _decoding_points(model: dict) -> dict[str, tuple[list[float], list[float]]]:
    curves: dict[str, tuple[list[float], list[float]]] = {}
    for config, run in model["results"].items():
        name = config.split(" ")[0]
        xs, ys = curves.setdefault(name, ([], []))
        xs.append(run["weights_peak_bytes"] / 1e6)
        ys.append(run["token_s"] * 1e3)
    return curves


def plot_decoding(data: dict, path: Path) -> str:
    _plot_models(data, path, _decoding_points, "time per generated token (ms)", 4.2, 3.2)
    return "Time per generated token against the weights held, by pipeline and budget."


PLOTS: dict[str, Callable[[dict, Path], str]] = {
    "auto_pipeline": plot_auto_pipeline,
    "decoding": plot_decoding,
}


def readme_picture(path: Path) -> None:
    """The README's picture: two real architectures, latency against weight memory."""
    plt = _plot_setup()
    cnn = json.loads((RESULTS / "auto_pipeline.json").read_text())["models"]["resnet152@224"]
    lm = json.loads((RESULTS / "decoding.json").read_text())["models"]["gpt2"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4))
    _draw_curves(left, _auto_pipeline_curve(cnn), "ResNet-152, 224 px: one inference",
                 "latency (ms)")
    _draw_curves(right, _decoding_points(lm), "GPT-2 small: greedy decoding with a KV cache",
                 "time per token (ms)")
    fig.suptitle("Less memory for weights, more time (CPU, 2 cores; bench/results/auto_pipeline.json, "
                 "decoding.json)", fontsize=9)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


# --------------------------------------------------------------------------- bench pages


def script_of(stem: str, scripts: set[str]) -> str | None:
    for prefix, script in SCRIPT_OF.items():
        if stem.startswith(prefix):
            return script
    matches = [s for s in scripts if stem == s or stem.startswith(s + "_")]
    return max(matches, key=len) if matches else None


def _docstring(script: Path) -> str:
    """The script's docstring as Markdown: Sphinx roles dropped, ``::`` blocks as code."""
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    doc = re.sub(r":(?:func|mod|class|meth|attr|data|exc):`~?([^`]+)`", r"``\1``", doc)
    return re.sub(r"::\n", ":\n", doc).strip()


def _command(script: str, data: dict) -> str:
    args = data.get("args") if isinstance(data, dict) else None
    command = f".venv/bin/python bench/{script}.py"
    if isinstance(args, dict):
        for key, value in args.items():
            if value is None or value is False or key == "output":
                continue
            flag = "--" + key.replace("_", "-")
            command += f" {flag}" if value is True else f" {flag} {value}"
    return command


def bench_pages(out: Path, img: Path) -> dict[Path, bytes]:
    """Every generated bench page (and plot) by path: nothing is written here."""
    scripts = {p.stem for p in BENCH.glob("*.py") if p.stem != "common"}
    by_script: dict[str, list[Path]] = {}
    for result in sorted(RESULTS.glob("*.json")):
        script = script_of(result.stem, scripts)
        if script is None:
            raise SystemExit(f"{result}: no bench/*.py wrote it; add it to SCRIPT_OF")
        by_script.setdefault(script, []).append(result)
    files: dict[Path, bytes] = {}
    index = ["# Benchmarks", "",
             "Every page here is generated by `tools/docs_pages.py` from the JSON files the "
             "benches write to `bench/results/` (run `make docs` after a bench to refresh "
             "them); nothing is typed by hand. Each script runs every configuration in its own "
             "child process, and its page says which command reproduces it.", "",
             "| bench | what it measures | result files |", "|---|---|---|"]
    for script in sorted(by_script):
        doc = _docstring(BENCH / f"{script}.py")
        summary = doc.splitlines()[0] if doc else ""
        index.append(f"| [`{script}`]({script}.md) | {summary.replace('|', '/')} | "
                     f"{len(by_script[script])} |")
        lines = [f"# {script}", "", f"`bench/{script}.py`", "", doc, "",
                 "Reproduce (each result file below was written by this script; its own "
                 "arguments are shown where the file recorded them):", "", "```sh",
                 f".venv/bin/python bench/{script}.py --help", "```", ""]
        for result in by_script[script]:
            data = json.loads(result.read_text())
            lines += [f"## {result.stem}", "", f"From `bench/results/{result.name}` "
                      f"(its own summary: `bench/results/{result.stem}.md`)."]
            if isinstance(data, dict) and isinstance(data.get("args"), dict):
                lines += ["", "```sh", _command(script, data), "```"]
            lines.append("")
            plot = PLOTS.get(script)
            if plot is not None:
                png = img / f"{result.stem}.png"
                caption = plot(data, png)
                files[png] = png.read_bytes()
                lines += [f"![{caption}](img/{png.name})", "", caption, ""]
            rendered = render(data, 3)
            if len(rendered) > MAX_LINES:
                rendered = rendered[:MAX_LINES]
                while rendered and rendered[-1].startswith("|"):
                    rendered.pop()  # end on a whole table
                rendered += ["", f"*The rest is in `bench/results/{result.name}`.*", ""]
            lines += rendered
        files[out / f"{script}.md"] = "\n".join(lines).rstrip().encode() + b"\n"
    files[out / "index.md"] = ("\n".join(index) + "\n").encode()
    return files


# --------------------------------------------------------------------------- CLI reference


def cli_reference() -> str:
    import typer

    from layerfit.cli import app

    root = typer.main.get_command(app)
    lines = ["# Command line", "",
             "Generated by `tools/docs_pages.py` from the command definitions "
             "(`src/layerfit/cli/`), the same text `layerfit COMMAND --help` prints.", ""]

    # typer carries its own copy of click: its classes are read by what they do.
    def walk(command: Any, path: list[str]) -> None:
        ctx = command.context_class(command, info_name=" ".join(path))
        name = " ".join(path)
        lines.extend([f"{'#' * min(len(path) + 1, 4)} `{name}`", ""])
        help_text = (command.help or "").strip()
        if help_text:
            lines.extend([help_text.replace("\b\n", ""), ""])
        usage = " ".join([name, *command.collect_usage_pieces(ctx)])
        lines.extend(["```text", usage, "```", ""])
        rows = []
        for param in command.params:
            if getattr(param, "hidden", False):
                continue
            if param.param_type_name == "argument":
                names = f"`{(param.metavar or param.name).upper()}`"
            else:
                names = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
            help_ = (getattr(param, "help", None) or "").replace("\n", " ").replace("|", "\\|")
            default = param.default
            shown = "" if default in (None, (), False) or callable(default) else f"`{default}`"
            if getattr(param, "required", False):
                shown = "required"
            rows.append([names, help_, shown])
        if rows:
            lines.extend(_table(["argument or option", "meaning", "default"], rows))
        if hasattr(command, "list_commands"):
            for sub_name in command.list_commands(ctx):
                sub = command.get_command(ctx, sub_name)
                if sub is not None and not sub.hidden:
                    walk(sub, [*path, sub_name])

    walk(root, ["layerfit"])
    return "\n".join(lines).rstrip() + "\n"


# --------------------------------------------------------------------------- metrics, Gantt


def metrics_reference() -> str:
    """The server's Prometheus metrics, read from their definitions in serve/metrics.py."""
    source = (ROOT / "src" / "layerfit" / "serve" / "metrics.py").read_text()
    pattern = re.compile(r'(GaugeMetricFamily|CounterMetricFamily|Counter|Histogram)\(\s*'
                         r'(?:f?"([a-z_]+)"|[a-z_]+)?\s*,?\s*"([^"]+)"')
    kinds = {"GaugeMetricFamily": "gauge", "CounterMetricFamily": "counter", "Counter": "counter",
             "Histogram": "histogram"}
    rows = []
    for kind, name, help_ in pattern.findall(source):
        if not name:
            continue
        if kinds[kind] == "counter" and not name.endswith("_total"):
            name += "_total"  # prometheus_client exposes counters with the suffix
        rows.append([f"`{name}`", kinds[kind], help_.strip().replace("|", "\\|")])
    lines = ["# Metrics", "",
             "`GET /metrics` answers in the Prometheus text format. This list is generated by "
             "`tools/docs_pages.py` from the definitions in `src/layerfit/serve/metrics.py`; "
             "`process_*` metrics (the process's RSS, CPU time, open files) come from "
             "prometheus-client's process collector beside them.", ""]
    lines += _table(["metric", "type", "meaning (its labels, if any, named)"], rows)
    return "\n".join(lines).rstrip() + "\n"


def http_reference(page: Path) -> str:
    """The HTTP reference page with its endpoint tables rendered from the OpenAPI document
    of a server with every route (the repository API and generation)."""
    from layerfit import __version__
    from layerfit.serve.openapi import openapi_document, render_tables

    return render_tables(page.read_text(), openapi_document(__version__, repository_api=True, generation=True))


def gantt(path: Path) -> None:
    """A real read/kernel Gantt chart: mobilenet_v1_025 under async at a tight budget."""
    import subprocess
    import tempfile

    cli = [sys.executable, "-m", "layerfit.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        for args in (["prepare", "mobilenet_v1_025", "-o", f"{tmp}/m"],
                     ["run", f"{tmp}/m", "--pipeline", "async", "--budget", "1.2MB",
                      "--trace", f"{tmp}/t.json"],
                     ["plot-trace", f"{tmp}/t.json", "-o", str(path), "--force"]):
            subprocess.run(cli + args, check=True, capture_output=True)


# --------------------------------------------------------------------------- main


def generate() -> dict[Path, bytes]:
    files = bench_pages(DOCS / "benchmarks", DOCS / "benchmarks" / "img")
    files[DOCS / "reference" / "cli.md"] = cli_reference().encode()
    files[DOCS / "reference" / "metrics.md"] = metrics_reference().encode()
    files[DOCS / "reference" / "http.md"] = http_reference(DOCS / "reference" / "http.md").encode()
    chart = DOCS / "benchmarks" / "img" / "gantt.png"
    chart.parent.mkdir(parents=True, exist_ok=True)
    gantt(chart)
    files[chart] = chart.read_bytes()
    picture = DOCS / "img" / "memory_latency.png"
    readme_picture(picture)
    files[picture] = picture.read_bytes()
    return files


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    for path, data in generate().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
