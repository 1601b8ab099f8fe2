"""What checking weights costs: ``--verify never / first / always`` per inference, and one
pass of ``--reverify-every`` (the whole folder hashed again).

A zoo model streamed through the async pipeline at a budget that keeps nothing beyond
two units (every pass reads every unit: the most ``always`` can cost). The three modes
run as three engines, called in turn for ``--passes`` rounds after one warm-up each, so
the noise of this shared machine falls on all of them alike; medians and ratios to
``never`` come from the same run. ``first`` checks a unit on its first read only, so
after the warm-up it costs what ``never`` does.

    .venv/bin/python bench/verify_cost.py --model resnet50 --resolution 224
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_setup import prepared_zoo_model  # noqa: E402
from reporting import machine, mb, write_results  # noqa: E402

from layerfit.engine import load  # noqa: E402
from layerfit.store import example_input, read_manifest  # noqa: E402
from layerfit.store.verify import verify_folder  # noqa: E402

CACHE = Path(__file__).parent / ".cache" / "verify_cost"
MODES = ("never", "first", "always")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--resolution", type=int, default=224)
    parser.add_argument("--passes", type=int, default=9)
    args = parser.parse_args(argv)
    directory = prepared_zoo_model(args.model, args.resolution, CACHE)
    m = read_manifest(directory)
    budget = m.resident_bytes + 2 * m.largest_unit_bytes
    x = example_input(m.input_shape, m.input_dtype, m.seed)
    engines = {mode: load(directory, pipeline="async", budget=budget, verify=mode) for mode in MODES}
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    outputs = {}
    try:
        with torch.no_grad():
            for mode, engine in engines.items():
                outputs[mode] = engine(x)  # warm-up: "first" checks every unit here
            for _ in range(args.passes):
                for mode, engine in engines.items():
                    start = time.perf_counter()
                    engine(x)
                    times[mode].append(time.perf_counter() - start)
    finally:
        for engine in engines.values():
            engine.close()
    identical = all(torch.equal(outputs[mode], outputs["never"]) for mode in MODES)
    start = time.perf_counter()
    checked = verify_folder(directory)
    reverify_s = time.perf_counter() - start
    medians = {mode: statistics.median(v) for mode, v in times.items()}
    streamed = m.total_bytes - m.resident_bytes
    result = {
        "machine": machine(), "args": vars(args), "budget_bytes": budget, "streamed_bytes": streamed,
        "median_s": medians, "times_s": times, "ratio_to_never": {k: v / medians["never"] for k, v in medians.items()},
        "outputs_identical": identical, "reverify_s": reverify_s, "reverify_bytes": checked.nbytes,
        "reverify_io": checked.io_mode,
    }
    rows = "\n".join(
        f"| {mode} | {medians[mode] * 1e3:.1f} | {medians[mode] / medians['never']:.3f} |" for mode in MODES
    )
    markdown = (
        f"# Cost of verifying weights ({args.model} at {args.resolution} px)\n\n"
        f"`bench/verify_cost.py`: async pipeline at {mb(budget)} MB (two units: all {mb(streamed)} MB streamed "
        f"every pass), median of {args.passes} passes per mode, the modes called in turn; outputs identical: "
        f"{identical}. {result['machine'].get('cpu', '')}\n\n"
        "| --verify | ms per inference | × never |\n|---|---:|---:|\n" + rows + "\n\n"
        f"One re-verification pass (`--reverify-every`): {checked.nbytes / 1e6:.0f} MB hashed in {reverify_s:.2f} s "
        f"({checked.nbytes / 1e6 / reverify_s:.0f} MB/s, {checked.io_mode} I/O).\n"
    )
    write_results("verify_cost", result, markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
