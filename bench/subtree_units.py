"""What streaming a module's whole subtree as one unit buys a Transformer.

``nn.MultiheadAttention`` owns ``in_proj_weight`` beside its child ``out_proj`` and reads
``out_proj.weight`` from its own ``forward``. With layers as the only units both had to
stay resident: a third of every encoder block. The capture now streams such a module's
subtree as one unit (:meth:`layerfit.capture.units.UnitRecorder._merge_subtrees`). This
bench prepares the zoo's ViT (torchvision's layout, ``nn.MultiheadAttention`` blocks;
weights seeded, nothing downloaded) twice: as captured, and with subtree units switched off (the
capture before them, an ablation). It reports each one's resident bytes and minimum
budget, then runs both in alternating rounds in one process: ``preload``, and ``async``
and ``auto`` at the budget the ablation needs at least (resident tensors plus two of its
largest unit, its async default), plus ``async`` at the new minimum. Outputs are
checked bit for bit against ``model(x)``. Nothing asserts a timing. Writes
``bench/results/subtree_units.{json,md}``::

    .venv/bin/python bench/subtree_units.py [--size s|b] [--rounds 3] [--passes 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from layerfit import zoo

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reporting import machine, mb, paired_overhead, write_results  # noqa: E402

CACHE = Path(__file__).parent / ".cache" / "subtree_units"
SIZES = ("s", "b")


def prepare_both(size: str) -> tuple[Path, Path]:
    """The model prepared as captured, and with subtree units switched off."""
    from layerfit.capture.units import UnitRecorder
    from layerfit.store import prepare

    spec = f"vit_{size}16"
    merged, layers = CACHE / f"vit_{size}", CACHE / f"vit_{size}_layers_only"
    prepare(spec, merged, input_shape=(1, 3, 224, 224), force=True)
    original = UnitRecorder._merge_subtrees
    UnitRecorder._merge_subtrees = lambda self, streamed, resident, rescuable: set()  # the ablation
    try:
        prepare(spec, layers, input_shape=(1, 3, 224, 224), force=True)
    finally:
        UnitRecorder._merge_subtrees = original
    return merged, layers


def describe(directory: Path) -> dict[str, Any]:
    from layerfit.store import read_manifest

    m = read_manifest(directory)
    reasons: dict[str, int] = {}
    for r in m.graph.resident:
        key = r.reason.split(" (")[0]
        reasons[key] = reasons.get(key, 0) + r.nbytes
    return {
        "units": len(m.units),
        "weights_bytes": m.total_bytes,
        "resident_bytes": m.resident_bytes,
        "resident_by_reason": reasons,
        "largest_unit_bytes": m.largest_unit_bytes,
        "minimum_budget_bytes": m.resident_bytes + m.largest_unit_bytes,
        "async_default_bytes": m.resident_bytes + 2 * m.largest_unit_bytes,
    }


def one_engine(directory: Path, x: torch.Tensor, expected: torch.Tensor, passes: int, **options: Any) -> dict[str, Any]:
    from layerfit.engine import load

    with load(directory, **options) as engine:
        assert torch.equal(engine(x), expected), (directory.name, options)
        times, peak = [], 0
        for _ in range(passes):
            t0 = time.perf_counter()
            out = engine(x)
            times.append(time.perf_counter() - t0)
            peak = max(peak, engine.last_weights_peak)
        assert torch.equal(out, expected), (directory.name, options)
        return {"median_s": statistics.median(times), "policy": engine.policy.name,
                "kept_units": len(engine.kept_units), "weights_peak_bytes": peak}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="s", choices=sorted(SIZES), help="ViT-S/16 or ViT-B/16")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--passes", type=int, default=10, help="inferences per configuration and round")
    p.add_argument("--output", default="subtree_units")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    CACHE.mkdir(parents=True, exist_ok=True)
    merged, layers = prepare_both(args.size)
    shape = {"merged": describe(merged), "layers_only": describe(layers)}
    old_budget = shape["layers_only"]["async_default_bytes"]
    configs = {
        "layers_only preload": (layers, {"pipeline": "preload"}),
        "merged preload": (merged, {"pipeline": "preload"}),
        "layers_only async": (layers, {"pipeline": "async", "budget": old_budget}),
        "merged async": (merged, {"pipeline": "async", "budget": old_budget}),
        "merged auto": (merged, {"pipeline": "auto", "budget": old_budget}),
        "merged async at its default": (merged, {"pipeline": "async"}),
    }
    model = zoo.build(f"vit_{args.size}16")
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(x)
    del model
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    for _ in range(args.rounds):
        for name, (directory, options) in configs.items():
            rounds[name].append(one_engine(directory, x, expected, args.passes, **options))
    ref = [r["median_s"] for r in rounds["layers_only async"]]
    results = {}
    for name, rs in rounds.items():
        times = [r["median_s"] for r in rs]
        results[name] = {
            "median_s": statistics.median(times), "rounds_s": times,
            "against_layers_only_async": paired_overhead(times, ref),
            "weights_peak_bytes": max(r["weights_peak_bytes"] for r in rs),
            "policy": rs[0]["policy"], "kept_units": rs[0]["kept_units"],
            "budget_bytes": configs[name][1].get("budget"),
        }
    data = {"machine": machine(), "model": f"vit_{args.size}16 (the zoo's: torchvision layout, seeded)",
            "rounds": args.rounds, "passes": args.passes, "capture": shape, "results": results,
            "outputs_bit_identical": True, "wall_s": time.perf_counter() - t0}
    js, md = write_results(args.output, data, markdown(data))
    print(f"wrote {js} and {md}")
    return 0


def markdown(data: dict[str, Any]) -> str:
    cap = data["capture"]
    lines = [
        f"# Subtree units: {data['model']}",
        "",
        f"{data['rounds']} alternating rounds of {data['passes']} inferences; every output equal to model(x).",
        "",
        "| capture | units | resident (MB) | largest unit (MB) | minimum budget (MB) | async default (MB) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for key in ("layers_only", "merged"):
        c = cap[key]
        lines.append(f"| {key} | {c['units']} | {mb(c['resident_bytes'])} | {mb(c['largest_unit_bytes'])} | "
                     f"{mb(c['minimum_budget_bytes'])} | {mb(c['async_default_bytes'])} |")
    lines += ["", "| configuration | budget (MB) | ran | kept units | median | vs layers_only async (90 % CI) | weights peak (MB) |",
              "|---|---:|---|---:|---:|---:|---:|"]
    for name, r in data["results"].items():
        o = r["against_layers_only_async"]
        lines.append(
            f"| {name} | {mb(r['budget_bytes'])} | {r['policy']} | {r['kept_units']} | {r['median_s'] * 1e3:.1f} ms | "
            f"{o['median'] * 100:+.1f} % ({o['ci90_low'] * 100:+.1f} .. {o['ci90_high'] * 100:+.1f}) | {mb(r['weights_peak_bytes'])} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
