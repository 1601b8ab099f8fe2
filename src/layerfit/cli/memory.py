"""``layerfit plan``: activation memory planning (Pisarchyk & Lee)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from layerfit.cli.app import app, console, parse_shape, print_json

if TYPE_CHECKING:
    pass


# --- memory (Pisarchyk & Lee: activation memory planning) -------------------------------


@app.command("plan")
def plan_activations(
    model: str | None = typer.Argument(
        None, help="zoo model name (planned at its paper resolution) or a prepared model directory"
    ),
    records: str | None = typer.Option(
        None, "--records", help='JSON list of {"id", "first_op", "last_op", "size"} instead of MODEL'
    ),
    approach: str | None = typer.Option(None, "--approach", help="objects or offsets (default: both)"),
    strategy: str = typer.Option("all", "--strategy", help="a strategy name, a comma list, or all"),
    align: int = typer.Option(64, "--align", help="round tensor sizes up to this many bytes (a power of two)"),
    order: str = typer.Option("captured", "--order", help="MODEL only: captured or searched operator order"),
    input_shape: str = typer.Option(
        None, "--input-shape", help="zoo MODEL only: plan at this input shape, e.g. 1,3,96,96"
    ),
    time_limit: float = typer.Option(
        10.0, "--time-limit", help="seconds for each exact CP-SAT model and for the operator order search"
    ),
    as_json: bool = typer.Option(False, "--json", help="totals, bounds and every tensor's assignment as JSON"),
) -> None:
    """Plan activation memory: every strategy's total next to the lower bound and naive total."""


    from layerfit.errors import PlanError
    from layerfit.memory import check_alignment, check_time_limit, get_strategy, load_records
    from layerfit.memory.registry import check_approach
    from layerfit.memory.report import plan_report

    if (model is None) == (records is None):
        raise PlanError("give either a MODEL (zoo name or prepared directory) or --records FILE.json (not both)")
    if order not in ("captured", "searched"):
        raise PlanError(f"--order must be captured or searched, not {order!r}")
    check_alignment(align, "--align")
    check_time_limit(time_limit, "--time-limit")
    approaches = ("objects", "offsets") if approach is None else (approach,)
    names: str | list[str] = "all"
    if strategy.strip() != "all":  # a comma list, each name once, in the order given
        names = list(dict.fromkeys(s.strip() for s in strategy.split(",") if s.strip()))
    if not names:
        raise PlanError("--strategy names no strategy; give a name, a comma list, or all")
    for kind in approaches:  # bad names fail before a model is captured
        check_approach(kind)
        for name in names if names != "all" else ():
            get_strategy(kind, name)
    extra: dict[str, Any] = {}
    if records is not None:
        if input_shape is not None:
            raise PlanError("--input-shape applies to a zoo MODEL, not to --records")
        if order != "captured":
            raise PlanError("--order applies to a MODEL; records files carry their own operator order")
        recs = load_records(records, alignment=align)
        if not recs:
            raise PlanError(f"records file {records!r} holds no tensor usage records; nothing to plan")
    else:
        from layerfit.memory.from_graph import records_from_graph
        from layerfit.memory.operator_order import search_operator_order

        graph = _graph_to_plan(model, parse_shape(input_shape))
        chosen = None
        if order == "searched":
            found = search_operator_order(graph, alignment=align, time_limit=time_limit)
            chosen = found.order
            extra["order_search"] = {k: v for k, v in found.to_dict().items() if k != "order"}
        converted = records_from_graph(graph, chosen, alignment=align)
        recs = converted.records
        if as_json:  # tensors folded into a buffer (views, in-place) take that buffer's place
            extra["buffer_of_tensor"] = {str(t): b for t, b in sorted(converted.record_of.items())}
    report = plan_report(recs, approaches, names, time_limit=time_limit, assignments=as_json)
    report.update(extra)
    if as_json:
        print_json(report)
        return
    _print_report(report, extra)


def _graph_to_plan(model: str, input_shape: tuple[int, ...] | None):
    """The captured graph of a prepared model directory (as prepared: its manifest holds
    it, no weights are read) or of a zoo model (captured now, at ``input_shape``)."""
    from pathlib import Path

    from layerfit.errors import PlanError
    from layerfit.memory.zoo_records import capture_zoo_model
    from layerfit.store import read_manifest

    if Path(model).is_dir():
        if input_shape is not None:
            raise PlanError(
                f"{model} was prepared for one input shape; --input-shape applies to zoo models "
                "(prepare the model again with `layerfit prepare --input-shape` to plan another)"
            )
        return read_manifest(model).graph
    if Path(model).is_file():
        raise PlanError(
            f"{model} is a file, not a zoo name or a prepared model directory; "
            f"plan a records file with --records {model}"
        )
    if "/" in model or model.startswith("."):
        raise PlanError(f"{model} is not a directory (MODEL is a zoo name or a prepared model directory)")
    return capture_zoo_model(model, input_shape)


def _print_report(report: dict[str, Any], extra: dict[str, Any]) -> None:
    """``plan``'s tables: each approach's strategies against the bound, and the order search."""
    from layerfit.console import table as new_table
    from layerfit.memory.report import MIB

    for name, part in report["approaches"].items():
        table = new_table(
            *((column, "left" if column in ("strategy", "status") else "right")
              for column in ("strategy", "MiB", "bytes", "vs bound", "status", "ms")),
            title=f"{name} — {report['tensors']} buffers (MiB = the paper's MB)",
        )
        notes = []
        for row in part["strategies"]:
            values = (f"{row['total'] / MIB:.3f}", str(row["total"]), f"{100 * row['vs_lower_bound']:+.1f}%")
            table.add_row(row["strategy"], *values, row["status"], f"{1000 * row['seconds']:.1f}")
            if row["note"]:
                notes.append(f"{row['strategy']}: {row['note']}")
        for label in ("lower_bound", "naive"):
            table.add_row(label.replace("_", " "), f"{part[label] / MIB:.3f}", str(part[label]), "", "", "")
        console.print(table)
        for note in notes:
            console.print(f"  {note}", highlight=False)
    if "order_search" in extra:
        s = extra["order_search"]
        console.print(
            f"operator order search: offsets bound {s['captured_peak'] / MIB:.3f} → {s['peak'] / MIB:.3f} MiB "
            f"({100 * s['saving']:.1f}% saved, {'exact' if s['exact'] else 'beam'})"
        )
