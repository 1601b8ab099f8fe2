"""How much memory ``layerfit prepare`` needs beyond building the model.

Preparing runs where the model can be built: on an edge board itself when no workstation
is at hand, so its peak matters as much as the engine's. Each model is built (seeded zoo
weights) in one child process and prepared in another (each in its own memory cgroup
where one can be made); the bench reports both peak RSS values, their difference (what
capture and writing add) and the model's weights. The writer streams each tensor's bytes
to the file and the hash without copying a segment (a copy of vgg16's 411 MB fc6 and its
bytes once doubled the peak). Writes ``bench/results/prepare_memory.{json,md}``::

    .venv/bin/python bench/prepare_memory.py [--models vgg16@64,resnet152@224,mobilenet_v2@224]

``--larger-than-memory`` measures instead ``prepare hf:FOLDER`` of a Llama-style decoder
whose weights are at least twice the limit of the memory cgroup it runs in (the page
cache counted, dropped before each run): the peak of the cgroup, the process's peak
anonymous memory (sampled every 20 ms), the time, and that the prepared model's logits
equal transformers' own. Beside it, in the same cgroup, the route without ``hf:``
(transformers' ``from_pretrained``, then ``prepare(module=...)``), which must hold the
whole model. Writes ``bench/results/prepare_larger_than_memory.{json,md}``::

    .venv/bin/python bench/prepare_memory.py --larger-than-memory [--limits 850MB,600MB]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_limits import AnonPeak, limited_child  # noqa: E402
from processes import run_child  # noqa: E402
from reporting import machine, mb, write_results  # noqa: E402

DEFAULT_MODELS = "vgg16@64,resnet152@224,mobilenet_v2@224"


def child(what: str, name: str, size: int) -> dict[str, Any]:
    """Build (``what`` = build) or prepare the model; peak RSS of this process."""
    from layerfit import zoo

    shape = (*zoo.get(name).input_shape[:-2], size, size)
    t0 = time.perf_counter()
    if what == "build":
        model = zoo.build(name)
        weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    else:
        from layerfit.store import prepare

        with tempfile.TemporaryDirectory() as tmp:
            manifest = prepare(name, Path(tmp) / "m", input_shape=shape)
            weights = manifest.total_bytes
    return {
        "seconds": time.perf_counter() - t0,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "weights_bytes": weights,
    }


CACHE = Path(__file__).parent / ".cache" / "prepare_memory"
# About 1.74 GB of float32 weights in 4 shards: 22 layers of 1024 wide, a 32k vocabulary.
DECODER = {
    "vocab_size": 32000, "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 22,
    "num_attention_heads": 16, "num_key_value_heads": 16, "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}


def decoder_folder() -> Path:
    """A Llama-style decoder saved as Hugging Face publishes one (sharded), made once."""
    folder = CACHE / "llama-1.7g"
    if (folder / "model.safetensors.index.json").is_file():
        return folder
    import torch
    import transformers

    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**DECODER))
    model = model.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0) if p.dim() == 1 else p.normal_(0, 0.02, generator=generator)
    model.save_pretrained(folder, max_shard_size="500MB")
    return folder


def build_decoder() -> Any:
    """The decoder's skeleton from its config (the factory the module route records)."""
    import transformers

    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**DECODER))


def hf_child(route: str, folder: str, out: str) -> dict[str, Any]:
    """Prepare ``folder`` by ``route``: ``hf`` (prepare hf:FOLDER), ``from_pretrained``
    (transformers' from_pretrained, then prepare(module=...)) or ``factory`` (a factory
    building the model in memory, the route ``prepare pkg:factory`` takes)."""
    sampler = AnonPeak()
    sys.path.insert(0, str(Path(__file__).parent))  # the factory routes import this module
    t0 = time.perf_counter()
    from layerfit.store import prepare

    if route == "import":  # the floor: PyTorch, transformers and layerfit loaded, nothing else
        import transformers  # noqa: F401

        return {"seconds": time.perf_counter() - t0, "anon_peak_bytes": sampler.peak_now(),
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "weights_bytes": 0}
    if route == "hf":
        manifest = prepare("hf:" + folder, out, force=True)
    elif route == "factory":
        manifest = prepare("prepare_memory:build_decoder", out, input_shape=(1, 32), input_dtype="int64", force=True)
    else:
        import transformers

        model = transformers.LlamaForCausalLM.from_pretrained(folder)
        manifest = prepare("prepare_memory:build_decoder", out, module=model, input_shape=(1, 32), input_dtype="int64", force=True)
    return {
        "seconds": time.perf_counter() - t0,
        "anon_peak_bytes": sampler.peak,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "weights_bytes": manifest.total_bytes,
    }


def check_outputs(folder: Path, out: Path) -> bool:
    """The prepared model's logits (budget 50 %) equal transformers' own, bit for bit."""
    import torch
    import transformers

    from layerfit.engine import load
    from layerfit.store import example_call, read_manifest

    args, kwargs = example_call(read_manifest(out))
    reference = transformers.LlamaForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        expected = reference(*args, **kwargs).logits
    del reference
    with load(out, budget="50%") as engine:
        return bool(torch.equal(engine(*args, **kwargs).logits, expected))


def larger_than_memory(limits: list[int], output: str) -> int:
    from layerfit.sizes import format_bytes

    folder = decoder_folder()
    out = CACHE / "llama-1.7g-prepared"
    weights = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    rows = []
    for limit in limits:
        for route in ("import", "hf", "from_pretrained", "factory"):
            r = limited_child(__file__, ["--what", f"hf-{route}", str(folder), str(out)], limit)
            r.update(route=route, limit_bytes=limit)
            if route == "import":
                r.pop("weights_bytes", None)
            if route == "hf" and r["returncode"] == 0:
                r["outputs_equal"] = check_outputs(folder, out)
            rows.append(r)
            print(format_bytes(limit), route, {k: v for k, v in r.items() if k != "route"}, flush=True)
    data = {"machine": machine(), "checkpoint_bytes": weights, "decoder": DECODER, "rows": rows}
    js, md = write_results(output, data, markdown_larger(data))
    print(f"wrote {js} and {md}")
    return 0


def markdown_larger(data: dict[str, Any]) -> str:
    lines = [
        "# `layerfit prepare hf:FOLDER` of a decoder larger than memory",
        "",
        f"A Llama-style decoder of {mb(data['checkpoint_bytes'])} MB (float32, 4 shards) prepared in a memory "
        "cgroup whose limit counts the page cache (dropped before each run). *hf* is `prepare hf:FOLDER` (the "
        "weights are views of the memory-mapped shards, paged in by the capture pass and copied to the "
        "prepared file); *from_pretrained* builds the model with transformers' `from_pretrained` (which in "
        "transformers 5 also leaves the weights as views of the mapped files) and passes it as "
        "`prepare(module=...)`; *factory* is `prepare pkg:factory`, whose factory builds the model in memory; "
        "*import* only imports PyTorch, transformers and layerfit: the floor.",
        "",
        "| limit (MB) | model ÷ limit | route | result | cgroup peak (MB) | anonymous peak (MB) | peak RSS (MB) | time (s) | logits equal transformers' |",
        "|---:|---:|---|---|---:|---:|---:|---:|---|",
    ]
    for r in data["rows"]:
        ok = r["returncode"] == 0
        result = ("imported" if r["route"] == "import" else "prepared") if ok else ("killed by the OOM killer" if r["oom_kills"] else f"failed: {r.get('error')}")
        lines.append(
            f"| {mb(r['limit_bytes'])} | {data['checkpoint_bytes'] / r['limit_bytes']:.2f} | {r['route']} | {result} | "
            f"{mb(r['cgroup_peak_bytes'])} | {mb(r.get('anon_peak_bytes'))} | {mb(r.get('peak_rss_bytes'))} | "
            f"{r['seconds']:.1f} | {r.get('outputs_equal', '-')} |" if ok else
            f"| {mb(r['limit_bytes'])} | {data['checkpoint_bytes'] / r['limit_bytes']:.2f} | {r['route']} | {result} | "
            f"{mb(r['cgroup_peak_bytes'])} | - | - | - | - |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--what", help=argparse.SUPPRESS)
    p.add_argument("--models", default=DEFAULT_MODELS, help="zoo models as NAME@SIZE (input resolution)")
    p.add_argument("--larger-than-memory", action="store_true", help="prepare hf: of a decoder 2-3x the cgroup limit")
    p.add_argument("--limits", default="850MB,600MB", help="with --larger-than-memory: the cgroup limits")
    p.add_argument("--output", default=None)
    args, rest = p.parse_known_args(argv)
    if args.child and args.what.startswith("hf-"):
        print(json.dumps(hf_child(args.what[3:], *rest)))
        return 0
    if args.larger_than_memory:
        from layerfit.sizes import parse_bytes

        return larger_than_memory([parse_bytes(x) for x in args.limits.split(",")], args.output or "prepare_larger_than_memory")
    args.output = args.output or "prepare_memory"
    if args.child:
        name, size = rest[0].split("@")
        print(json.dumps(child(args.what, name, int(size))))
        return 0
    rows = {}
    for spec in args.models.split(","):
        build = run_child(__file__, ["--what", "build", spec])
        prep = run_child(__file__, ["--what", "prepare", spec])
        rows[spec] = {"build": build, "prepare": prep}
        if "error" not in build and "error" not in prep:
            rows[spec]["prepare_over_build_bytes"] = prep["peak_rss_bytes"] - build["peak_rss_bytes"]
        print(spec, rows[spec], flush=True)
    data = {"machine": machine(), "models": rows}
    js, md = write_results(args.output, data, markdown(data))
    print(f"wrote {js} and {md}")
    return 0


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# Peak memory of `layerfit prepare`",
        "",
        "| model | weights (MB) | build: peak RSS (MB) | prepare: peak RSS (MB) | prepare over build (MB) | prepare (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for spec, r in data["models"].items():
        b, p = r["build"], r["prepare"]
        if "error" in b or "error" in p:
            lines.append(f"| {spec} | failed: {b.get('error') or p.get('error')} | | | | |")
            continue
        lines.append(
            f"| {spec} | {mb(p['weights_bytes'])} | {mb(b['peak_rss_bytes'])} | {mb(p['peak_rss_bytes'])} | "
            f"{mb(r['prepare_over_build_bytes'])} | {p['seconds']:.1f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
