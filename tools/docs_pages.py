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

The headline bench pages (``result_charts.OPENINGS``) open with their charts and a summary
of a few lines computed from the JSON, and ``docs/results.md``, the site's Results page,
gathers one chart per area (committed: it changes only when a headline JSON does). Every
result says the commit it measured; where a later commit changed the code it measured
(``result_freshness``), its page says so and this tool prints a warning (not an error:
the site still builds). No page shows a path of the machine that measured it.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tools beside this one, when imported

import chart_style as style  # noqa: E402
import result_charts  # noqa: E402
import result_freshness as freshness  # noqa: E402

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
    text = without_machine_paths(str(value)).replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= 120 else text[:117] + "…"


_MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|home|root|tmp|Users|mnt|var|private|opt)(?:/[\w.+@=-]+)+")
_REPOSITORY_PARTS = ("bench", "src", ".venv", "tests", "docs")


def without_machine_paths(text: str) -> str:
    """``text`` with each absolute path of the measuring machine made general: from the
    repository's own folder on where it names one (``bench/.cache/...``), else its last
    three parts after an ellipsis."""

    def general(match: re.Match) -> str:
        parts = match.group(0).split("/")[1:]
        for k, part in enumerate(parts):
            if part in _REPOSITORY_PARTS:
                return "/".join(parts[k:])
        return "…/" + "/".join(parts[-3:])

    return _MACHINE_PATH.sub(general, text)


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
    styles = {"preload": dict(marker="*", markersize=12, linestyle="none"), "auto": dict(marker="s")}
    for name, (xs, ys) in curves.items():
        points = sorted(zip(xs, ys, strict=True))
        ax.plot([x for x, _ in points], [y for _, y in points], label=name, color=style.colour(name),
                **styles.get(name, dict(marker="o")))
    ax.set_xlabel("weights held in memory (MB)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_ylim(bottom=0)
    ax.legend()


def _plot_models(data: dict, path: Path, curves: Callable[[dict], dict], ylabel: str, width: float, height: float) -> None:
    """One panel per model of ``data["models"]``, each with the curves ``curves`` draws from it."""
    models = data["models"]
    fig, axes = style.figure(len(models), height=height, width=min(width * len(models), 2 * style.PAGE_WIDTH))
    for ax, (name, model) in zip(axes, models.items(), strict=True):
        _draw_curves(ax, curves(model), name, ylabel)
    fig.tight_layout()
    style.save(fig, path)


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
    cnn = json.loads((RESULTS / "auto_pipeline.json").read_text())["models"]["resnet152@224"]
    lm = json.loads((RESULTS / "decoding.json").read_text())["models"]["gpt2"]
    fig, (left, right) = style.figure(2, height=3.4, width=9)
    _draw_curves(left, _auto_pipeline_curve(cnn), "ResNet-152, 224 px: one inference",
                 "latency (ms)")
    _draw_curves(right, _decoding_points(lm), "GPT-2 small: greedy decoding with a KV cache",
                 "time per token (ms)")
    fig.suptitle("Less memory for weights, more time (CPU, 2 cores; bench/results/auto_pipeline.json, "
                 "decoding.json)", fontsize=9)
    fig.tight_layout()
    style.save(fig, path)


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


def machine_words(data: Any) -> str:
    """The machine a result was measured on, in a few words, from its ``machine`` record."""
    machine = data.get("machine") if isinstance(data, dict) else None
    if not isinstance(machine, dict):
        return "a machine the JSON does not describe"
    words = [f"{machine.get('cores', '?')} cores ({machine.get('cpu', '?')})"]
    if machine.get("memory_bytes"):
        words.append(f"{machine['memory_bytes'] / 1e9:.0f} GB of memory")
    if machine.get("torch"):
        words.append(f"torch {machine['torch']}")
    return ", ".join(words)


def measured_line(data: Any, fresh: freshness.Freshness) -> str:
    """Where and when: the machine, the commit measured and the date it was recorded."""
    return f"Measured on {machine_words(data)}, {freshness.commit_words(fresh)}."


def _stale_note(fresh: freshness.Freshness) -> list[str]:
    note = freshness.warning(fresh)
    return [] if note is None else ['!!! warning "Older than the code it measured"', "", f"    {note}", ""]


def opening(script: str, data: Any, fresh: freshness.Freshness, img: Path, files: dict[Path, bytes],
            link: str = "img", draw: bool = True) -> list[str]:
    """A headline page's first lines: its charts (written to ``img``, linked as ``link``/name;
    ``draw=False`` links them only) and a summary of at most five lines, every number
    from ``data``."""
    spec = result_charts.OPENINGS[script]
    lines: list[str] = []
    for chart in spec.charts:
        png = img / f"{script}_{chart.name}.png"
        if not draw:
            lines += [f"![{chart.caption}]({link}/{png.name})", ""]
            continue
        try:
            style.save(chart.draw(data), png)
        except (KeyError, TypeError, ValueError, IndexError) as error:
            raise SystemExit(f"bench/results/{script}.json: its chart {chart.name!r} cannot be drawn "
                             f"({type(error).__name__}: {error}); update tools/result_charts.py") from None
        files[png] = png.read_bytes()
        lines += [f"![{chart.caption}]({link}/{png.name})", ""]
    summary = [*spec.summary(data), measured_line(data, fresh)]
    assert len(summary) <= 5, f"{script}: a summary is at most five lines"
    return lines + [f"- {line}" for line in summary] + [""]


def _result_section(script: str, result: Path, data: Any, fresh: freshness.Freshness, img: Path,
                    files: dict[Path, bytes]) -> list[str]:
    lines = [f"## {result.stem}", "", f"From `bench/results/{result.name}` "
             f"(its own summary: `bench/results/{result.stem}.md`). {freshness.describe(fresh)}", ""]
    lines += _stale_note(fresh)
    if isinstance(data, dict) and isinstance(data.get("args"), dict):
        lines += ["```sh", without_machine_paths(_command(script, data)), "```", ""]
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
    return lines + rendered


def results_by_script() -> dict[str, list[Path]]:
    """Each bench script's result files (``bench/results/*.json``), by the script's name."""
    scripts = {p.stem for p in BENCH.glob("*.py") if p.stem != "common"}
    by_script: dict[str, list[Path]] = {}
    for result in sorted(RESULTS.glob("*.json")):
        script = script_of(result.stem, scripts)
        if script is None:
            raise SystemExit(f"{result}: no bench/*.py wrote it; add it to SCRIPT_OF")
        by_script.setdefault(script, []).append(result)
    return by_script


def bench_page(script: str, results: list[Path], history: list[freshness.Commit], img: Path,
               files: dict[Path, bytes], warnings: list[str]) -> str:
    """One bench's page: its opening (for a headline bench), its method, then every result."""
    doc = _docstring(BENCH / f"{script}.py")
    lines = [f"# {script}", ""]
    sections = []
    for result in results:
        data = json.loads(result.read_text())
        fresh = freshness.freshness(history, f"bench/results/{result.name}", script, data)
        if fresh.stale:
            warnings.append(f"bench/results/{result.name}: {freshness.warning(fresh)}")
        if result.stem == script and script in result_charts.OPENINGS:
            lines += opening(script, data, fresh, img, files)
        sections += _result_section(script, result, data, fresh, img, files)
    lines += ["## Method", "", f"`bench/{script}.py`", "", doc, "",
              "Reproduce (each result file below was written by this script; its own "
              "arguments are shown where the file recorded them):", "", "```sh",
              f".venv/bin/python bench/{script}.py --help", "```", ""]
    return "\n".join(lines + sections).rstrip() + "\n"


def bench_pages(out: Path, img: Path, warnings: list[str] | None = None,
                history: list[freshness.Commit] | None = None, only: set[str] | None = None) -> dict[Path, bytes]:
    """Every generated bench page (and plot) by path, plus the pictures, which are written
    to ``img`` as they are drawn (``only``: just those benches' pages, and no index). A
    result older than the code it measured adds a line to ``warnings``."""
    history = freshness.read_history(ROOT) if history is None else history
    warnings = [] if warnings is None else warnings
    by_script = results_by_script()
    files: dict[Path, bytes] = {}
    index = ["# Benchmarks", "",
             "Every page here is generated by `tools/docs_pages.py` from the JSON files the "
             "benches write to `bench/results/` (run `make docs` after a bench to refresh "
             "them); nothing is typed by hand. Each script runs every configuration in its own "
             "child process, and its page says which command reproduces it and the commit each "
             "result measured. The headline results, one chart per area, are on the "
             "[Results](../results.md) page.", "",
             "| bench | what it measures | result files |", "|---|---|---|"]
    if only is not None:
        for script in sorted(only):
            page = bench_page(script, by_script[script], history, img, files, warnings)
            files[out / f"{script}.md"] = page.encode()
        return files
    for script in sorted(by_script):
        doc = _docstring(BENCH / f"{script}.py")
        summary = doc.splitlines()[0] if doc else ""
        index.append(f"| [`{script}`]({script}.md) | {summary.replace('|', '/')} | "
                     f"{len(by_script[script])} |")
        page = bench_page(script, by_script[script], history, img, files, warnings)
        files[out / f"{script}.md"] = page.encode()
    files[out / "index.md"] = ("\n".join(index) + "\n").encode()
    return files


def results_page(history: list[freshness.Commit], img: Path, files: dict[Path, bytes], draw: bool = True) -> str:
    """The site's Results page (``docs/results.md``): the README's picture, then one chart
    per area (``result_charts.AREAS``), each with its summary, its machine and commit, and
    links to its bench page and the area's other pages. The bench pages draw the same
    charts; ``draw=False`` writes the text only."""
    by_script = results_by_script()
    readme = [(RESULTS / f"{name}.json") for name in ("auto_pipeline", "decoding")]
    said = [f"`{path.name}`: {measured_line(json.loads(path.read_text()), fresh)}" for path in readme
            for fresh in [freshness.freshness(history, f"bench/results/{path.name}", path.stem,
                                              json.loads(path.read_text()))]]
    lines = ["# Results", "",
             "What layerfit measured, one chart per area, each drawn by `tools/docs_pages.py` from the JSON a "
             "bench committed to `bench/results/`; the bench's page has the method, the full tables and the "
             "command that reproduces it. Where the code has changed since a result was measured, its bench "
             "page says so and `make docs` warns.", "",
             "![Latency against the memory the weights may take, for ResNet-152 and GPT-2 small]"
             "(img/memory_latency.png)", "",
             "Less memory for the weights costs time, and how much depends on the model: one inference of "
             "ResNet-152 and one generated token of GPT-2 small against the weights held, by pipeline "
             "([auto_pipeline](benchmarks/auto_pipeline.md), [decoding](benchmarks/decoding.md)).", ""]
    lines += [f"- {line}" for line in said] + [""]
    for area, script, others in result_charts.AREAS:
        path = RESULTS / f"{script}.json"
        data = json.loads(path.read_text())
        fresh = freshness.freshness(history, f"bench/results/{path.name}", script, data)
        lines += [f"## {area}", ""]
        lines += opening(script, data, fresh, img, files, link="benchmarks/img", draw=draw)
        links = [f"[{name}](benchmarks/{name}.md)" for name in (script, *others) if name in by_script]
        lines += [f"The method and every table: {', '.join(links)}.", ""]
    return "\n".join(lines).rstrip() + "\n"


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


def generate(warnings: list[str] | None = None) -> dict[Path, bytes]:
    history = freshness.read_history(ROOT)
    img = DOCS / "benchmarks" / "img"
    files = bench_pages(DOCS / "benchmarks", img, warnings, history)
    files[DOCS / "results.md"] = results_page(history, img, files, draw=False).encode()
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
    warnings: list[str] = []
    for path, data in generate(warnings).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    headline = [w for w in warnings if Path(w.split(":")[0]).stem in result_charts.OPENINGS]
    for line in headline:
        print(f"docs_pages: warning: {line}", file=sys.stderr)
    if len(warnings) > len(headline):
        print(f"docs_pages: warning: {len(warnings) - len(headline)} more result files are older than a change "
              "to the code they measured; their bench pages say which.", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
