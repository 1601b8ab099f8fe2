"""What GGUF weights cost to compute with on this CPU (issue #54): dequantizing, and the kernels.

Three tables, each a median over ``--rounds`` rounds in which every variant runs once in turn
(alternating, one process; a variant's time in a round is the mean of enough calls to fill
about ``--target-ms``):

1. ``dequantize``: `engine/dequantize.py` per GGML type at two weight shapes, in MB/s of the
   blocks read and of the float32 values written (the `--dequantize` mode runs it on every
   streamed unit).
2. ``matmul``: one ``F.linear`` of a weight ``[out, in]`` on 1 and 8 tokens: float32, dense
   bf16, Q4 packed (Q4_K, or Q4_0 where the input axis is not a multiple of 256; `engine/int4_packed.py`: bf16 activations in, the result in float32),
   ``_weight_int8pack_mm`` (float32 and bf16 activations; per-channel scales), and what making
   each operand costs per unit when it is bound: Q4 blocks packed, Q8_0 blocks dequantized to
   bf16 or to float32, Q8_0 blocks re-quantized per output channel for the int8 kernel. The
   Q8_0 columns say which path a streamed unit should take (`q8_*` rows: conversion + product).
3. ``overhead``: an ``nn.Linear`` whose weight is a `PackedWeight` against calling
   `packed_linear` and the ATen op directly (the wrapper's ``__torch_function__`` cost).

    .venv/bin/python bench/quant_kernels.py [--rounds 5] [--quick]

writes ``bench/results/quant_kernels.{json,md}``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from reporting import machine, write_results  # noqa: E402

from layerfit.engine.dequantize import TYPES, bytes_per_tensor, dequantize  # noqa: E402
from layerfit.engine.int4_packed import bind_packed, pack, packed_linear  # noqa: E402

DEQUANT_SHAPES = ((576, 1536), (4096, 4096))
#: (in_features, out_features): SmolLM-135M's MLP up and down, its head, Llama-7B's MLP up
MATMUL_SHAPES = ((576, 1536), (1536, 576), (576, 49152), (4096, 11008))
TOKENS = (1, 8)


def realistic_blocks(type_name: str, shape: tuple[int, ...], seed: int = 54) -> torch.Tensor:
    """Random blocks whose f16 scalars are a real file's size (no inf/NaN in a timing)."""
    spec = TYPES[type_name]
    rng = np.random.default_rng(seed)
    if spec.elements == 1:
        values = torch.from_numpy(rng.standard_normal(int(np.prod(shape)), dtype=np.float32))
        stored = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[type_name]
        return values.to(stored).view(torch.uint8)
    rows = rng.integers(
        0, 256, (bytes_per_tensor(type_name, shape) // spec.nbytes, spec.nbytes), dtype=np.uint8
    )
    offsets = {"Q2_K": (80, 82), "Q3_K": (108,), "Q6_K": (208,)}.get(type_name, (0, 2))
    for offset in offsets:
        rows[:, offset : offset + 2] = (
            rng.uniform(1e-3, 1e-2, (len(rows), 1)).astype(np.float16).view(np.uint8)
        )
    return torch.from_numpy(rows.reshape(-1))


def timed(
    calls: dict[str, Callable[[], object]], rounds: int, target_ms: float
) -> dict[str, float]:
    """Median seconds per call of each, over `rounds` alternating rounds of about `target_ms` each.

    Every call is timed on its own and the median taken over all of them, so a call that the
    shared machine's other work interrupts moves the result less than a mean would; the
    minimum is kept too (``<name>.min``), as the uncontended cost.
    """
    repeats = {}
    for name, call in calls.items():
        call()
        start = time.perf_counter()
        call()
        repeats[name] = max(1, int(target_ms / 1e3 / max(time.perf_counter() - start, 1e-7)))
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            for _ in range(repeats[name]):
                start = time.perf_counter()
                call()
                samples[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in samples.items()}
    return medians | {f"{name}.min": min(values) for name, values in samples.items()}


def bench_dequantize(rounds: int, target_ms: float) -> list[dict]:
    """MB/s of `dequantize` per type and shape, into a preallocated float32 buffer."""
    rows = []
    for shape in DEQUANT_SHAPES:
        out = torch.empty(shape)
        inputs = {name: realistic_blocks(name, shape) for name in TYPES}
        calls = {
            name: (lambda b=b, n=name, s=shape, o=out: dequantize(b, n, s, out=o))
            for name, b in inputs.items()
        }
        times = timed(calls, rounds, target_ms)
        for name in calls:
            seconds = times[name]
            rows.append(
                {
                    "shape": list(shape),
                    "type": name,
                    "ms": seconds * 1e3,
                    "min_ms": times[f"{name}.min"] * 1e3,
                    "blocks_MB_per_s": inputs[name].numel() / seconds / 1e6,
                    "values_MB_per_s": out.numel() * 4 / seconds / 1e6,
                }
            )
    return rows


def requantize_per_channel(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0 values -> int8 codes with one scale per output channel (inexact: block-32 scales lost)."""
    scale = values.abs().amax(dim=1).clamp(min=1e-12) / 127
    codes = torch.round(values / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return codes, scale


def q4_type_for(k: int) -> str:
    """Q4_K where the input axis holds its 256-value super-blocks, else Q4_0 (as llama.cpp falls back)."""
    return "Q4_K" if k % 256 == 0 else "Q4_0"


def matmul_calls(k: int, n: int, tokens: int) -> dict[str, Callable[[], object]]:
    """Every product and per-unit conversion for a weight ``[n, k]`` and `tokens` rows."""
    x = torch.randn(tokens, k)
    xb = x.bfloat16()
    q4_type = q4_type_for(k)
    q4 = realistic_blocks(q4_type, (n, k))
    q8 = realistic_blocks("Q8_0", (n, k))
    weight = dequantize(q8, "Q8_0", (n, k))
    weight_bf16 = weight.bfloat16()
    packed = pack(q4, q4_type, (n, k))
    codes, scale = requantize_per_channel(weight)
    scale_bf16 = scale.bfloat16()
    buffer32, buffer16 = torch.empty(n, k), torch.empty(n, k, dtype=torch.bfloat16)
    return {
        "fp32": lambda: F.linear(x, weight),
        "bf16": lambda: F.linear(xb, weight_bf16),
        "int4_packed": lambda: packed_linear(x, packed),
        "int8_fp32_act": lambda: torch._weight_int8pack_mm(x, codes, scale),
        "int8_bf16_act": lambda: torch._weight_int8pack_mm(xb, codes, scale_bf16),
        "bind_q4_pack": lambda: pack(q4, q4_type, (n, k)),
        "bind_q4_to_bf16": lambda: dequantize(q4, q4_type, (n, k), torch.bfloat16, out=buffer16),
        "bind_q8_to_bf16": lambda: dequantize(q8, "Q8_0", (n, k), torch.bfloat16, out=buffer16),
        "bind_q8_to_fp32": lambda: dequantize(q8, "Q8_0", (n, k), out=buffer32),
        "bind_q8_requantize": lambda: requantize_per_channel(
            dequantize(q8, "Q8_0", (n, k), out=buffer32)
        ),
    }


def bench_matmul(rounds: int, target_ms: float, shapes: tuple[tuple[int, int], ...]) -> list[dict]:
    """ms per product and per conversion, at each shape and token count."""
    rows = []
    for k, n in shapes:
        for tokens in TOKENS:
            medians = timed(matmul_calls(k, n, tokens), rounds, target_ms)
            row = {"in": k, "out": n, "tokens": tokens, "q4_type": q4_type_for(k)}
            row |= {name: s * 1e3 for name, s in medians.items() if not name.endswith(".min")}
            row["min"] = {
                name[:-4]: s * 1e3 for name, s in medians.items() if name.endswith(".min")
            }
            row["q8_streamed_bf16"] = row["bind_q8_to_bf16"] + row["bf16"]
            row["q8_streamed_fp32"] = row["bind_q8_to_fp32"] + row["fp32"]
            row["q8_streamed_int8_requantized"] = row["bind_q8_requantize"] + row["int8_fp32_act"]
            row["q4_streamed_packed"] = row["bind_q4_pack"] + row["int4_packed"]
            row["q4_streamed_bf16"] = row["bind_q4_to_bf16"] + row["bf16"]
            rows.append(row)
    return rows


def bench_overhead(rounds: int, target_ms: float) -> dict[str, float]:
    """µs per call: the op, `packed_linear` (float32 or bf16 in), an ``nn.Linear`` holding a
    `PackedWeight`, and one whose ``forward`` is replaced by `packed_linear` (the alternative
    to the wrapper tensor)."""
    k, n = 576, 1536
    x = torch.randn(1, k)
    packed = pack(realistic_blocks("Q4_0", (n, k)), "Q4_0", (n, k))
    linear = nn.Linear(k, n, bias=False)
    bind_packed(linear, packed)
    xb = x.bfloat16()
    op = torch.ops.aten._weight_int4pack_mm_for_cpu
    plain = nn.Linear(k, n, bias=False)
    overridden = nn.Linear(k, n, bias=False)
    overridden.forward = lambda inputs: packed_linear(inputs, packed)
    calls = {
        "nn_linear_fp32_dense": lambda: plain(x),
        "aten_op_bf16_in_out": lambda: op(xb, packed.packed, 32, packed.scales_and_zeros),
        "packed_linear_fp32_in_out": lambda: packed_linear(x, packed),
        "packed_linear_bf16_in_out": lambda: packed_linear(xb, packed),
        "nn_linear_packed_weight": lambda: linear(x),
        "nn_linear_forward_replaced": lambda: overridden(x),
    }
    with torch.no_grad():
        return {name: s * 1e6 for name, s in timed(calls, rounds, target_ms).items()}


def markdown(data: dict) -> str:
    """The three tables."""
    lines = [
        "# GGUF kernels on this CPU (issue #54)",
        "",
        f"machine: `{data['machine']}`",
        "",
        "## dequantize (MB/s; median of alternating rounds)",
        "",
        "| shape | type | ms | min ms | blocks MB/s | float32 values MB/s |",
        "|---|---|---|---|---|---|",
    ]
    for r in data["dequantize"]:
        lines.append(
            f"| {r['shape'][0]}x{r['shape'][1]} | {r['type']} | {r['ms']:.2f} | {r['min_ms']:.2f} | "
            f"{r['blocks_MB_per_s']:.0f} | {r['values_MB_per_s']:.0f} |"
        )
    every = [
        key for key in data["matmul"][0] if key not in ("in", "out", "tokens", "q4_type", "min")
    ]
    for title, keys in (
        (
            "products (ms; weight [out, in]; int4 = the Q4 type shown)",
            [k for k in every if "_" not in k or k.startswith("int")],
        ),
        (
            "making each operand when a unit is bound (ms)",
            [k for k in every if k.startswith("bind_")],
        ),
        ("a streamed unit: bind + product (ms)", [k for k in every if "_streamed_" in k]),
    ):
        lines += ["", f"## {title}", "", "| in x out | tokens | Q4 | " + " | ".join(keys) + " |"]
        lines.append("|---|---|---|" + "---|" * len(keys))
        for r in data["matmul"]:
            cells = " | ".join(f"{r[key]:.2f}" for key in keys)
            lines.append(f"| {r['in']}x{r['out']} | {r['tokens']} | {r['q4_type']} | {cells} |")
    lines += [
        "",
        "## wrapper overhead (µs per call, 576x1536, 1 token)",
        "",
        "| call | µs |",
        "|---|---|",
    ]
    lines += [
        f"| {name} | {us:.1f} |"
        for name, us in data["overhead"].items()
        if not name.endswith(".min")
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--target-ms", type=float, default=30.0)
    parser.add_argument("--quick", action="store_true", help="small shapes only, 3 rounds")
    parser.add_argument("--name", default="quant_kernels")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (1: a 2-thread OpenMP team on a shared 2-core machine waits on "
        "whichever thread is descheduled, and its tail swamps the medians)",
    )
    args = parser.parse_args()
    rounds = 3 if args.quick else args.rounds
    shapes = MATMUL_SHAPES[:2] if args.quick else MATMUL_SHAPES
    torch.set_num_threads(args.threads)
    data = {"machine": machine(), "rounds": rounds}
    data["overhead"] = bench_overhead(rounds, args.target_ms)
    data["dequantize"] = bench_dequantize(rounds, args.target_ms)
    data["matmul"] = bench_matmul(rounds, args.target_ms, shapes)
    data["machine"]["load_average_at_end"] = __import__("os").getloadavg()
    js, md = write_results(args.name, data, markdown(data))
    print(md.read_text())
    print(f"wrote {js} and {md}")


if __name__ == "__main__":
    main()
