"""layerfit's footprint beside the weights, and each lever that cuts it, measured.

F is what a process running a prepared model holds beside the weight bytes the engine
held (#55): a fresh child runs ``layerfit.load(folder, budget=<minimum budget>)`` (or,
with ``--budget all``, every weight preloaded: a step is then compute alone) and
``--passes`` passes of the folder's example call (``layerfit.store.examples.example_call``);
its peak anonymous memory (RssAnon, sampled every 10 ms on a thread, as
bench/memory_limits.AnonPeak does) minus ``engine.last_weights_peak`` is F's anonymous
part, and its resident file pages at the end (RssFile: the libraries' code and data it
touched) F's file part. Beside RssFile each row gives the file pages the last pass itself
referenced (``/proc/self/clear_refs``, then the ``Referenced`` pages of its file mappings,
bench/vs_mmap.mapped_file_referenced): what a memory cgroup must leave the libraries, the
rest being cold pages it can reclaim.

Models: the ~0.5 GB Llama-style decoder of bench/vs_mmap.py (``llama-0.5g``, seeded,
written with ``save_pretrained`` and prepared with ``prepare("hf:" + folder)``) and the
zoo's ResNet-152, both cached by bench/vs_mmap.prepared under ``bench/.cache/vs_mmap/``.
Two rows measure the imports alone: ``import torch``, and ``import torch; from
transformers import LlamaForCausalLM``.

Each lever is a variant of the child (``LEVERS``), run beside the library as it is
(``baseline``) in the same rounds, the order rotated each round so a slow stretch of the
machine hits every variant; a row gives medians over ``--rounds`` fresh children. A
lever is kept where it lowers F without slowing a step beyond the rounds' spread. Each
row also says whether the run imported ``transformers`` and ``torch._dynamo``, and the
largest mappings of a baseline child (``/proc/self/smaps``). Nothing asserts a timing.

    .venv/bin/python bench/footprint.py [--models llama-0.5g,resnet152] [--rounds 3] [--passes 4]

Writes ``bench/results/footprint.{json,md}``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
MODELS = ["llama-0.5g", "resnet152"]
IMPORTS = {
    "import torch": "import torch",
    "import torch; from transformers import LlamaForCausalLM": "import torch; from transformers import LlamaForCausalLM",
}
# What each variant of the child does beside the library as it is. Applied in the child:
# "start" before anything is imported, "loaded" right after layerfit.load, "pass" after
# each pass (inside its time: its cost is the lever's).
LEVERS: dict[str, str] = {
    "baseline": "the library as it is",
    "trim-after-load": "malloc_trim(0) (osmem.trim_heap) once layerfit.load returns",
    "page-out-libraries": "the shared libraries' pages paged out once layerfit.load returns "
    "(osmem.page_out_libraries: madvise MADV_PAGEOUT on their read-only mappings)",
    "trim-after-pass": "malloc_trim(0) after each pass",
    "planned-activations": "activations='planned': one arena planned for a pass's activations "
    "(Pisarchyk & Lee), not PyTorch's allocator",
    "without-scipy": "SciPy not installed (`layerfit[hf]` without the tradeoff extra, whose pymoo needs it): "
    "transformers' modeling code imports scipy.optimize wherever SciPy is installed",
    "arenas-2": "glibc keeps at most 2 heap arenas (osmem.limit_heap_arenas(2)) from the start",
    "large-frees-to-os": "allocations of 4 MiB or more mapped alone and freed to the OS, heap trimmed above 128 KiB "
    "(osmem.return_large_frees_to_os()) from the start",
}
LEVERS["page-out-libraries+without-scipy"] = "the two levers that cut F, together"
DEFAULT_LEVERS = list(LEVERS)
# Levers that do not apply to every model: a decoder is captured by hooks, and planned
# activations need a graph captured by torch.fx; a CNN's run never imports SciPy.
ONLY = {
    "planned-activations": {"resnet152"},
    "without-scipy": {"llama-0.5g"},
    "page-out-libraries+without-scipy": {"llama-0.5g"},
}
TOP_MAPPINGS = 6


# --- the child ------------------------------------------------------------------------------


def status_kb(*keys: str) -> dict[str, int]:
    """Fields of ``/proc/self/status`` in bytes."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key = line.split(":", 1)[0]
            if key in keys:
                out[key] = int(line.split()[1]) * 1024
    return out


class Peaks:
    """Peak RssAnon and RssFile of this process, sampled every 10 ms on a thread."""

    def __init__(self) -> None:
        self.anon = self.file = 0
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while True:
            self.take()
            time.sleep(0.01)

    def take(self) -> None:
        now = status_kb("RssAnon", "RssFile")
        self.anon, self.file = max(self.anon, now["RssAnon"]), max(self.file, now["RssFile"])


def largest_mappings(top: int = TOP_MAPPINGS) -> dict[str, list[list[Any]]]:
    """This process's mappings (by path, or ``[heap]``/``[anon]``) holding the most
    anonymous and the most file bytes: ``[name, bytes]`` each."""
    anon: collections.Counter[str] = collections.Counter()
    file: collections.Counter[str] = collections.Counter()
    name, rss = "", 0
    with open("/proc/self/smaps") as fh:
        for line in fh:
            fields = line.split()
            if len(fields) >= 5 and "-" in fields[0] and ":" in fields[3]:
                name = fields[5] if len(fields) > 5 else "[anon]"
            elif fields[0] == "Rss:":
                rss = int(fields[1]) * 1024
            elif fields[0] == "Anonymous:":
                anon[name] += int(fields[1]) * 1024
                file[name] += rss - int(fields[1]) * 1024
    return {
        "anon": [[n, b] for n, b in anon.most_common(top)],
        "file": [[n, b] for n, b in file.most_common(top)],
    }


class _Blind:
    """An import finder that does not see some top-level packages: ``import x`` fails
    and ``importlib.util.find_spec("x")`` is None, as where ``x`` is not installed
    (tests/install/hiding.py's)."""

    def __init__(self, finder: Any, hidden: set[str]) -> None:
        self.finder, self.hidden = finder, hidden

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name.split(".")[0] in self.hidden:
            return None
        find = getattr(self.finder, "find_spec", None)
        return find(name, path, target) if find else None

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.finder, attr)


def hide_packages(hidden: set[str]) -> None:
    """Run on as if ``hidden`` were not installed."""
    sys.meta_path[:] = [_Blind(f, hidden) for f in sys.meta_path]


def child_import(statement: str) -> dict[str, Any]:
    peaks = Peaks()
    t0 = time.perf_counter()
    exec(statement, {})
    seconds = time.perf_counter() - t0
    peaks.take()
    return {
        "import_s": seconds,
        "anon_peak_bytes": peaks.anon,
        "file_bytes": status_kb("RssFile")["RssFile"],
        "modules": len(sys.modules),
        "largest_mappings": largest_mappings(),
    }


def child_run(folder: str, budget: int, passes: int, lever: str) -> dict[str, Any]:
    """One model at ``budget``: load, ``passes`` passes of its example call, with ``lever``."""
    peaks = Peaks()
    sys.path.insert(0, str(BENCH))
    from vs_mmap import disk_read_bytes, mapped_file_referenced

    parts = set(lever.split("+"))  # a row may combine levers
    if "without-scipy" in parts:
        hide_packages({"scipy"})
    elif "arenas-2" in parts:
        from layerfit.engine.osmem import limit_heap_arenas

        assert limit_heap_arenas(2)
    elif "large-frees-to-os" in parts:
        from layerfit.engine.osmem import return_large_frees_to_os

        assert return_large_frees_to_os()
    t0 = time.perf_counter()
    import layerfit
    from layerfit.engine.osmem import trim_heap
    from layerfit.store import read_manifest
    from layerfit.store.examples import example_call

    planned = {"activations": "planned"} if "planned-activations" in parts else {}
    engine = layerfit.load(folder, budget=budget, **planned)
    if "trim-after-load" in parts:
        trim_heap()
    elif "page-out-libraries" in parts:
        from layerfit.engine.osmem import page_out_libraries

        assert page_out_libraries() > 0
    load_s = time.perf_counter() - t0
    peaks.take()
    loaded = status_kb("RssAnon")["RssAnon"]
    args, kwargs = example_call(read_manifest(folder))
    seconds, reads, weights = [], [], 0
    for k in range(passes):
        if k == passes - 1:  # the pages the last pass touches get their accessed bit
            Path("/proc/self/clear_refs").write_text("1")
        t, r = time.perf_counter(), disk_read_bytes()
        engine(*args, **kwargs)
        if "trim-after-pass" in parts:
            trim_heap()
        seconds.append(time.perf_counter() - t)
        reads.append(disk_read_bytes() - r)
        weights = max(weights, engine.last_weights_peak)
    referenced = mapped_file_referenced()
    peaks.take()
    time.sleep(0.03)
    end = status_kb("RssAnon", "RssFile")
    return {
        "load_s": load_s,
        "first_s": seconds[0],
        "step_s": statistics.median(seconds[1:]),
        "steps_s": seconds[1:],
        "step_read_bytes": statistics.median(reads[1:]),
        "anon_peak_bytes": peaks.anon,
        "anon_loaded_bytes": loaded,
        "anon_end_bytes": end["RssAnon"],
        "file_bytes": end["RssFile"],
        "file_peak_bytes": peaks.file,
        "file_referenced_bytes": referenced,
        "weights_peak_bytes": weights,
        "modules": len(sys.modules),
        "torch_path": str(Path(sys.modules["torch"].__file__).parent),
        "layerfit_path": str(Path(layerfit.__file__).parent),
        "transformers": "transformers" in sys.modules,
        "dynamo": "torch._dynamo" in sys.modules,
        "transformers_modules": sum(m.split(".")[0] == "transformers" for m in sys.modules),
        "largest_mappings": largest_mappings() if lever == "baseline" else None,
    }


# --- the parent -----------------------------------------------------------------------------


CHILD_ENV: dict[str, str] = dict(os.environ)


def run_child(args: list[str]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=CHILD_ENV,
    )
    if proc.returncode != 0:
        raise SystemExit(f"child {args} failed: {(proc.stderr or proc.stdout).strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of every number over ``runs``, the spread of the step, and the flags of the first."""
    row: dict[str, Any] = {}
    for key, value in runs[0].items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            row[key] = value
        else:
            row[key] = statistics.median(r[key] for r in runs)
    if "step_s" in row:
        row["step_min_s"], row["step_max_s"] = (
            min(r["step_s"] for r in runs),
            max(r["step_s"] for r in runs),
        )
    if "weights_peak_bytes" in row:
        for r in runs:
            r["f_anon_bytes"] = r["anon_peak_bytes"] - r["weights_peak_bytes"]
        row["f_anon_bytes"] = statistics.median(r["f_anon_bytes"] for r in runs)
        row["f_bytes"] = row["f_anon_bytes"] + row["file_bytes"]
    row["runs"] = [{k: v for k, v in r.items() if k != "largest_mappings"} for r in runs]
    return row


def mb(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e6:.0f}"


def paired(p: dict[str, float] | None) -> str:
    """A paired overhead (reporting.paired_overhead) as a ratio with its interval."""
    if p is None:
        return "-"
    return f"{1 + p['median']:.2f} ({1 + p['ci90_low']:.2f}–{1 + p['ci90_high']:.2f})"


def markdown(data: dict[str, Any]) -> str:
    m = data["machine"]
    lines = [
        "# layerfit's footprint beside the weights (#55)",
        "",
        f"{m['cpu']}, {m['cores']} CPUs, {m['memory_bytes'] / 2**30:.0f} GiB, Python {m['python']}, torch "
        f"{m['torch']} ({m['torch_threads']} threads), transformers {data['transformers']}, layerfit "
        + (
            f"{data['layerfit_commit']} (src/ as committed)"
            if data.get("layerfit_commit")
            else f"{m['layerfit_commit']} (the working tree)"
        )
        + f"; load average {m['load_average_at_start'][0]:.1f} at the start. "
        f"`bench/footprint.py`: medians of {data['rounds']} fresh children per row, the variants of a model "
        "alternating (order rotated each round). "
        + (
            "The children import a private copy of torch (no other process maps its libraries' pages). "
            if data["torch_copy"]
            else "The children import the installed torch. "
        )
        + (
            f"DAMON runs on this machine ({', '.join(data['damon'])}): it pages cold memory out on its own "
            "and clears accessed bits as it samples, so RssFile falls as pages age and *referenced* may "
            "miss pages."
            if data["damon"]
            else ""
        ),
        "",
        "F = peak anonymous memory (RssAnon, sampled every 10 ms) − the weight bytes the engine held "
        "(`engine.last_weights_peak`) + resident file pages at the end (RssFile). Each child runs "
        f"`layerfit.load(folder, budget=<{'minimum budget' if data['budget'] == 'minimum' else 'all its weights'}>)` "
        f"and {data['passes']} passes of the folder's example "
        "call; *step* is the median of the passes after the first (min–max over the children); *paired* is the "
        "median over rounds of a child's step over the baseline child's of the same round. *referenced* is "
        "the file pages the last pass touched: what the libraries need of a memory limit, the rest of RssFile "
        "being cold pages the kernel reclaims first.",
        "",
        "## The imports alone",
        "",
        "| statement | anonymous (MB) | file (MB) | modules | seconds |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| `{name}` | {mb(r['anon_peak_bytes'])} | {mb(r['file_bytes'])} | {r['modules']:.0f} | "
            f"{r['import_s']:.2f} |"
            for name, r in data["imports"].items()
        ),
    ]
    for name, model in data["models"].items():
        base = model["rows"]["baseline"]
        lines += [
            "",
            f"## {name}: {mb(model['weights_bytes'])} MB of weights, minimum budget "
            f"{mb(model['minimum_budget_bytes'])} MB, run at {mb(model['budget_bytes'])} MB"
            f"{' (its minimum)' if data['budget'] == 'minimum' else ' (every weight preloaded)'}, "
            f"{data['passes']} passes of its example call "
            f"{model['example']}",
            "",
            "| lever | F (MB) | F anonymous (MB) | F file: RssFile (MB) | file referenced by a pass (MB) | "
            "anonymous peak (MB) | weights held (MB) | anonymous once loaded (MB) | step (ms) | step min–max (ms) "
            "| step ÷ baseline's, paired rounds (90 % CI) | first pass (ms) | load (s) | transformers imported | "
            "torch._dynamo imported |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---|---|",
        ]
        for lever, r in model["rows"].items():
            delta = (
                "" if lever == "baseline" else f" ({(r['f_bytes'] - base['f_bytes']) / 1e6:+.0f})"
            )
            lines.append(
                f"| {lever} | {mb(r['f_bytes'])}{delta} | {mb(r['f_anon_bytes'])} | {mb(r['file_bytes'])} | "
                f"{mb(r['file_referenced_bytes'])} | {mb(r['anon_peak_bytes'])} | {mb(r['weights_peak_bytes'])} | "
                f"{mb(r['anon_loaded_bytes'])} | {r['step_s'] * 1e3:.0f} | {r['step_min_s'] * 1e3:.0f}–"
                f"{r['step_max_s'] * 1e3:.0f} | {paired(r.get('paired'))} | {r['first_s'] * 1e3:.0f} | "
                f"{r['load_s']:.2f} | {'yes' if r['transformers'] else 'no'} "
                f"({r['transformers_modules']:.0f} modules) | {'yes' if r['dynamo'] else 'no'} |"
            )
        maps = base["largest_mappings"]
        lines += [
            "",
            "Largest mappings of a baseline child at the end: anonymous "
            + ", ".join(f"{Path(n).name} {mb(b)} MB" for n, b in maps["anon"] if b >= 1e6)
            + "; file "
            + ", ".join(f"{Path(n).name} {mb(b)} MB" for n, b in maps["file"] if b >= 1e6)
            + ".",
        ]
    lines += ["", *(f"- *{k}*: {v}" for k, v in LEVERS.items() if k in data["levers"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    p.add_argument("--models", default=",".join(MODELS), help=f"of {', '.join(MODELS)}")
    p.add_argument("--levers", default=",".join(DEFAULT_LEVERS), help=f"of {', '.join(LEVERS)}")
    p.add_argument("--rounds", type=int, default=3, help="fresh children per row")
    p.add_argument(
        "--passes", type=int, default=4, help="passes of the example call (the first is cold)"
    )
    p.add_argument("--output", default="footprint")
    p.add_argument(
        "--budget",
        choices=["minimum", "all"],
        default="minimum",
        help="the weight budget: the model's minimum (every pass streams its weights from the disk) or all "
        "its weights (preloaded: a step is compute alone, which shows a lever's cost without the disk's noise)",
    )
    p.add_argument(
        "--commit",
        help="measure src/ as committed at this revision (git archive), not the working tree: "
        "others may be editing it",
    )
    p.add_argument(
        "--system-torch",
        action="store_true",
        help="children import the installed torch, not a private copy (its pages are then shared "
        "with any other PyTorch process on the machine)",
    )
    args = p.parse_args(argv)
    if args.child:
        kind, rest = args.child[0], args.child[1:]
        result = (
            child_import(IMPORTS[rest[0]])
            if kind == "import"
            else child_run(rest[0], int(rest[1]), int(rest[2]), rest[3])
        )
        print(json.dumps(result))
        return 0
    names, levers = args.models.split(","), args.levers.split(",")
    unknown = [n for n in names if n not in MODELS] + [
        x for x in levers for part in x.split("+") if part not in LEVERS
    ]
    if unknown or "baseline" not in levers or args.rounds < 1 or args.passes < 2:
        p.error(f"unknown {unknown}, or no baseline lever, or --rounds < 1, or --passes < 2")
    sys.path.insert(0, str(BENCH))
    from reporting import write_results

    t_start = time.perf_counter()
    made = []
    try:
        if args.commit:
            made.append(committed_src(args.commit))
        copy = None if args.system_torch else private_torch()
        if copy is not None:
            made.append(copy)
        data = measure(args, names, levers, copy)
    finally:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)
    data["wall_s"] = time.perf_counter() - t_start
    text = markdown(data)
    js, md = write_results(args.output, data, text)
    print(text)
    print(f"wrote {js} and {md} in {data['wall_s']:.0f} s")
    return 0


def damon() -> list[str]:
    """The actions of the DAMON schemes running on this machine (``pageout`` pages cold
    memory out on its own and clears the pages' accessed bits as it samples them)."""
    root = Path("/sys/kernel/mm/damon/admin/kdamonds")
    actions = []
    for kdamond in root.glob("[0-9]*"):
        if (kdamond / "state").read_text().strip() == "on":
            actions += [a.read_text().strip() for a in kdamond.glob("contexts/*/schemes/*/action")]
    return actions


def child_path(folder: Path) -> None:
    """The children import from ``folder`` first."""
    CHILD_ENV["PYTHONPATH"] = os.pathsep.join(
        [str(folder), *filter(None, [CHILD_ENV.get("PYTHONPATH")])]
    )


def committed_src(rev: str) -> Path:
    """``src/`` as committed at ``rev``, in a folder the children import layerfit from;
    the results name the commit."""
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="footprint-src-", dir=BENCH / ".cache"))
    archive = subprocess.run(
        ["git", "-C", str(BENCH.parent), "archive", rev, "src"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    child_path(root / "src")
    sha = subprocess.run(
        ["git", "-C", str(BENCH.parent), "rev-parse", "--short", rev],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    CHILD_ENV["FOOTPRINT_COMMIT"] = sha
    return root


def private_torch() -> Path:
    """The children import a private copy of torch (memory_limits.private_torch)."""
    from memory_limits import private_torch as copy_torch

    root = copy_torch(BENCH / ".cache")
    child_path(root)
    return root


def measure(
    args: argparse.Namespace, names: list[str], levers: list[str], copy: Path | None
) -> dict[str, Any]:
    """Every row: the imports alone, then each model's levers."""
    from importlib.metadata import version

    from reporting import machine, paired_overhead, progress
    from vs_mmap import CACHE, prepared

    from layerfit.store import read_manifest
    from layerfit.store.examples import example_call

    data: dict[str, Any] = {
        "layerfit_commit": CHILD_ENV.get("FOOTPRINT_COMMIT"),
        "torch_copy": copy is not None,
        "damon": damon(),
        "machine": machine(),
        "transformers": version("transformers"),
        "rounds": args.rounds,
        "passes": args.passes,
        "budget": args.budget,
        "levers": levers,
        "imports": {},
        "models": {},
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in IMPORTS}
    for k in progress(range(args.rounds), "imports"):
        for name in list(IMPORTS)[k % 2 :] + list(IMPORTS)[: k % 2]:
            runs[name].append(run_child(["import", name]))
    data["imports"] = {name: medians(rs) for name, rs in runs.items()}
    for name in names:
        info = prepared(name, CACHE / name)
        folder = CACHE / name / "prepared"
        call_args, call_kwargs = example_call(read_manifest(folder))
        example = ", ".join(
            f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"
            for t in [*call_args, *call_kwargs.values()]
        )
        # the minimum streams every weight each pass; "all" preloads them (a step is compute alone)
        budget = info["minimum_budget_bytes"] if args.budget == "minimum" else info["weights_bytes"]
        ours = [lever for lever in levers if name in ONLY.get(lever, {name})]
        by_lever: dict[str, list[dict[str, Any]]] = {lever: [] for lever in ours}
        for k in progress(range(args.rounds), f"{name}: levers"):
            for lever in ours[k % len(ours) :] + ours[: k % len(ours)]:
                by_lever[lever].append(
                    run_child(
                        [
                            "run",
                            str(folder),
                            str(budget),
                            str(args.passes),
                            lever,
                        ]
                    )
                )
                r = by_lever[lever][-1]
                print(
                    f"  {name} {lever}: F anon {(r['anon_peak_bytes'] - r['weights_peak_bytes']) / 1e6:.0f} MB, "
                    f"file {r['file_bytes'] / 1e6:.0f} MB, step {r['step_s'] * 1e3:.0f} ms",
                    flush=True,
                )
        for lever, rs in by_lever.items():
            if lever != "baseline":
                steps = [r["step_s"] for r in rs]
                reference = [r["step_s"] for r in by_lever["baseline"]]
                rs[0]["paired"] = paired_overhead(steps, reference)
        data["models"][name] = {
            **info,
            "budget_bytes": budget,
            "example": example,
            "rows": {lever: medians(rs) for lever, rs in by_lever.items()},
        }
    return data


if __name__ == "__main__":
    raise SystemExit(main())
