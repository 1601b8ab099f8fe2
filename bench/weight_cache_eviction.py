"""Which cached units to evict first: the weight cache's order against the usual ones.

The runtime's :class:`~layerfit.schedule.runtime.weight_cache.WeightCache` is driven here by
synthetic request traces — no model runs, no timing: each request streams its model's
units in order through the real cache and a real :class:`~layerfit.schedule.MemoryLedger`
(a load reserves its unit, the unload hands it to the cache), one request at a time or
several models per request. Reported per trace and cache size: the share of unit bytes
served from the cache. The orders compared (subclasses that change only the order):

- ``layerfit``: the cache's own (units no network in flight still needs first, then the
  least requested model's, then the units cached for the first time last);
- ``lru``: least recently cached or used unit first;
- ``mru``: most recently cached unit first;
- ``model-lru``: the least recently requested model's units first, its last units first;
- ``decayed-count``: the model with the lowest request count decayed by 0.9 per request
  first, its last units first (this cache's first design).

Writes ``bench/results/weight_cache_eviction.{json,md}``::

    .venv/bin/python bench/weight_cache_eviction.py
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
import time
from collections.abc import Hashable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reporting import machine, write_results  # noqa: E402

from layerfit.schedule.ledger import MemoryLedger  # noqa: E402
from layerfit.schedule.runtime.weight_cache import WeightCache  # noqa: E402
from layerfit.schedule.tasks import Task, TaskKind  # noqa: E402

UNIT_SIZES = (16, 64, 256, 1024, 2048)  # kB, drawn per unit: norms to large convolutions


class Buffer:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes

    def free(self) -> None:
        pass


class Recency(WeightCache):
    """The cache with the bookkeeping the alternative orders need."""

    def __init__(self, ledger: MemoryLedger) -> None:
        super().__init__(ledger, locate=lambda task: task.network.split("#")[0])
        self.tick = itertools.count()
        self.used: dict[tuple[Hashable, int], int] = {}
        self.model_used: dict[Hashable, int] = {}
        self.decayed: dict[Hashable, float] = {}

    def requested(self, network: Hashable, model: Hashable) -> None:
        super().requested(network, model)
        self.model_used[model] = next(self.tick)
        self.decayed = {m: c * 0.9 for m, c in self.decayed.items()}
        self.decayed[model] = self.decayed.get(model, 0.0) + 1.0

    def put(self, model: Hashable, unit: int, buffer: Any, held: Hashable) -> bool:
        self.used[(model, unit)] = next(self.tick)
        return super().put(model, unit, buffer, held)


class Lru(Recency):
    def _eviction_order(self, entry):
        return self.used[(entry.model, entry.unit)]


class Mru(Recency):
    def _eviction_order(self, entry):
        return -self.used[(entry.model, entry.unit)]


class ModelLru(Recency):
    def _eviction_order(self, entry):
        return self.model_used.get(entry.model, -1), -entry.unit


class DecayedCount(Recency):
    def _eviction_order(self, entry):
        return self.decayed.get(entry.model, 0.0), -entry.unit


ORDERS = {"layerfit": Recency, "lru": Lru, "mru": Mru, "model-lru": ModelLru, "decayed-count": DecayedCount}


def run(trace: list[list[str]], models: dict[str, list[int]], budget: int, order: type[Recency]) -> float:
    """Share of unit bytes served from the cache over ``trace`` (requests of models)."""
    ledger = MemoryLedger(budget, record=False)
    cache = order(ledger)
    served = read = 0
    for i, request in enumerate(trace):
        networks = {m: f"{m}#{i}" for m in request}
        for m, uid in networks.items():
            cache.requested(uid, m)
        for step in range(max(len(models[m]) for m in request)):  # the models' units interleaved
            for m in request:
                if step >= len(models[m]):
                    continue
                size = models[m][step]
                task = Task(id=f"{networks[m]}/L{step}", job=str(i), network=networks[m], network_name=m,
                            network_index=0, kind=TaskKind.LOAD, layer=step, layer_name=str(step),
                            duration=0.0, memory=size, retained=size)
                cache.make_room(task, size)
                buffer = cache.take(task.id)
                if buffer is None:
                    read += size
                    buffer = Buffer(size)
                else:
                    served += size
                ledger.acquire(task.id, size, owner=networks[m])
                ledger.finish(task.id, keep=size)
                if not cache.put(m, step, buffer, task.id):
                    ledger.release(task.id)
        for uid in networks.values():
            cache.finished(uid)
    return served / (served + read)


def traces(rng: random.Random, length: int) -> dict[str, list[list[str]]]:
    return {
        "C (the largest), repeated": [["C"]] * length,
        "A, B, C in turn": [[m] for m in itertools.islice(itertools.cycle("ABC"), length)],
        "A+B+C in every request": [["A", "B", "C"]] * (length // 3),
        "uniform": [[rng.choice("ABC")] for _ in range(length)],
        "skewed 6:3:1": [rng.choices("ABC", [6, 3, 1]) for _ in range(length)],
        "A,B then B,C": [[rng.choice("AB")] for _ in range(length // 2)]
        + [[rng.choice("BC")] for _ in range(length // 2)],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--sizes", default="0.3,0.6,0.9", help="cache room as fractions of all the models' weights")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    rng = random.Random(args.seed)
    models = {m: [rng.choice(UNIT_SIZES) * 1024 for _ in range(n)] for m, n in (("A", 30), ("B", 20), ("C", 40))}
    total = sum(sum(units) for units in models.values())
    largest_unit = max(max(units) for units in models.values())
    results = []
    for fraction in (float(f) for f in args.sizes.split(",")):
        budget = int(fraction * total) + 3 * largest_unit  # the cache's room beside what loads need
        for name, trace in traces(rng, args.requests).items():
            results.append({
                "cache_fraction": fraction, "trace": name,
                "served": {order: run(trace, models, budget, cls) for order, cls in ORDERS.items()},
            })
    data = {"machine": machine(), "models": {m: {"units": len(u), "bytes": sum(u)} for m, u in models.items()},
            "requests": args.requests, "seed": args.seed, "results": results, "wall_s": time.perf_counter() - t0}
    sizes = ", ".join(f"{m['units']} units / {m['bytes'] / 1e6:.1f} MB" for m in data["models"].values())
    lines = [
        "# Weight cache: eviction orders on synthetic traces",
        "",
        f"Three models of {sizes}; "
        f"{args.requests} requests per trace (seed {args.seed}). Share of unit bytes served from the cache; "
        "the cache's room is a fraction of all weights (beyond what the loads need). "
        "Driven through the real WeightCache and MemoryLedger; no model runs.",
        "",
        "| room | trace | " + " | ".join(ORDERS) + " |",
        "|---:|---|" + "---:|" * len(ORDERS),
    ]
    for r in results:
        best = max(r["served"].values())
        cells = [f"**{v:.2f}**" if v == best else f"{v:.2f}" for v in r["served"].values()]
        lines.append(f"| {r['cache_fraction']:.1f} | {r['trace']} | " + " | ".join(cells) + " |")
    lines += ["", f"Wall time {data['wall_s']:.0f} s."]
    markdown = "\n".join(lines) + "\n"
    js, md = write_results("weight_cache_eviction", data, markdown)
    print(markdown)
    print(f"wrote {js} and {md}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
