"""layerfit against llama.cpp on the same quantized GGUF file, at the same memory limits (#54).

bench/vs_mmap.py's quantized rows, in their own script: there every configuration computes
the same float32 weights and checks its logits bit for bit against a PyTorch reference,
its limits start from layerfit's footprint, and mmap is the peer each ratio divides by;
here the file is quantized, llama.cpp is the peer, each configuration decodes greedily on
its own (no reference: the tokens are compared, not asserted), and four layerfit routes
run (packed, ``--dequantize``, the float32 folder). The method is vs_mmap's, and so are its
helpers (``timed_passes``, ``fastest``, ``llamacpp_status``, the footprint rule):

- Every configuration runs in a fresh child process in its own memory cgroup (v1) at the
  limit, the page cache dropped before each (``memory_limits.limited_child``); each
  reports its step times, disk reads, anonymous peak (RssAnon, sampled every 20 ms), the
  process's peak resident memory (``VmHWM``) and the cgroup's peak.
- Models, seeded Llamas written by ``gguf``'s writer as F16 (norms F32) with a
  sentencepiece vocabulary, quantized by llama.cpp's own quantizer
  (``llama_model_quantize`` through llama-cpp-python), cached under
  ``bench/.cache/vs_llamacpp_quantized/``: *smol-135m-q4_1* (SmolLM2-135M's shape, Q4_1:
  98 MB, the size of the published file) and *llama-1g-q4* (TinyLlama-1.1B's shape, Q4_1:
  about 0.7 GB). Q4_1 for both: llama.cpp's CPU backend repacks Q4_0 (and Q4_K) weights
  into anonymous memory at load (the Q4_0 file of llama-1g-q4: 588 MB of anonymous memory
  for a 637 MB file), so they no longer run from its mmap; Q4_1's stay in the mapping. layerfit's folder is ``prepare("gguf:" +
  file)``; the *fp32* route is the same seeded model saved with ``save_pretrained`` and
  prepared with ``prepare("hf:" + folder)``.
- Configurations: *llamacpp* (llama-cpp-python, mmap loading, an f16 KV cache,
  ``n_threads`` = ``n_threads_batch`` = ``--threads``), *packed* (layerfit's default for a
  GGUF folder: int4 kernels), *dequantize* (``dequantize=True``, bit-equal to
  transformers), *fp32*; layerfit's children run ``torch.set_num_threads(--threads)``.
  Bounds, no limit: *floor* (transformers' own decode at width 64), *kernels* (the packed
  model's weight products alone), *bare* (transformers' own model of the config with every
  linear layer on the kernel packed calls, its activations cast as packed casts them, no
  layerfit code: the most running the model unchanged on these kernels gives) and
  *bare-bf16* (the same, the whole model in bf16, nothing cast).
- Limits: layerfit's footprint beside its weights F is measured per route as in vs_mmap
  (a child without a limit: anonymous peak minus the weight bytes held, plus
  ``FILE_ROOM`` for its libraries). The packed route's F grows with what it holds, so it
  is measured at its minimum budget and with every weight held and taken as linear
  between; the limits run from the minimum budget + its F to max(the weights + their F,
  llama.cpp's cgroup peak without a limit) + ``HEADROOM``. At each limit: llamacpp and
  packed (the largest budget B with B + F(B) within the limit: everything where it fits,
  streaming below). dequantize runs once, every
  weight held, at the larger of the top limit and the weights + its own F (measured
  the same way, with every weight held; the packed route's F is the larger of the two
  measured at its minimum budget and with every weight held). At 40 % of the fp32 weights (limit = that budget + the fp32 route's F) fp32
  and packed run side by side. llama.cpp *holds the file* at a limit where its steps read
  less than 1 % of the file from the disk.
- Decode: a seeded ``PROMPT``-token prompt (the first, cold pass), then ``--steps`` cached
  steps, each feeding the configuration's own greedy token; tokens/s = 1 / the median
  step. ``--rounds`` rounds, the configurations alternating within each; the fastest run
  of each is shown, the JSON keeps all.
- Derived: packed ÷ llama.cpp tokens/s at each limit against the goals (≥ 0.5× where
  llama.cpp holds the file, ≥ 1.5× where it does not), packed ÷ fp32 at 40 % (≥ 3×), the
  greedy tokens' agreement (packed vs dequantize, packed vs llama.cpp: steps equal before
  the first difference), and both processes' peaks side by side. Nothing asserts a timing.

Run (writes ``bench/results/vs_llamacpp_quantized.{json,md}``)::

    .venv/bin/python bench/vs_llamacpp_quantized.py [--models smol-135m-q4_1,llama-1g-q4] [--limits 5] [--steps 16] [--rounds 3]

At the defaults a model runs 5 children without a limit and 13 a round (44 in all); on
the 2-core development machine a child of smol-135m-q4_1 takes 15-25 s and one of
llama-1g-q4 an estimated 30-90 s, so the whole run takes about an hour, plus 5 minutes
the first time for each model's files. ``--quick`` is a smoke run (2 limits, 1 round, 4
steps: 4-5 minutes for smol-135m-q4_1); give it ``--output-dir /tmp/...``.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from memory_limits import vm_hwm  # noqa: E402
from vs_mmap import (  # noqa: E402  (stdlib-only at import, as in llama.cpp's environment)
    CHILD_TIMEOUT,
    FILE_ROOM,
    FITS_READ_SHARE,
    LLAMACPP_PYTHON,
    fastest,
    llamacpp_status,
    timed_passes,
)

CACHE = BENCH / ".cache" / "vs_llamacpp_quantized"
PROMPT = 32
HEADROOM = 64_000_000  # above the larger of the two "everything fits" limits
FP32_SHARE = 0.4  # the fp32 route's budget: this share of its weights
GOAL_HOLDS, GOAL_SHORT, GOAL_FP32 = 0.5, 1.5, 3.0
LLAMACPP_FTYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q4_K_M": 15}  # llama_ftype of llama.h

MODELS: dict[str, dict[str, Any]] = {
    "smol-135m-q4_1": {
        "quant": "Q4_1",
        "config": {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                   "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 2048,
                   "tie_word_embeddings": True, "rope_theta": 100000.0, "rms_norm_eps": 1e-5,
                   "bos_token_id": 1, "eos_token_id": 2},
    },
    "llama-1g-q4": {
        "quant": "Q4_1",
        "config": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32,
                   "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 2048,
                   "tie_word_embeddings": False, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
                   "bos_token_id": 1, "eos_token_id": 2},
    },
}


# --- the children ---------------------------------------------------------------------------


def prompt_tokens(vocab: int) -> list[int]:
    """The seeded prompt (ids above the vocabulary's special and byte pieces)."""
    import random

    rng = random.Random(1)
    return [rng.randrange(300, vocab) for _ in range(PROMPT)]


def greedy_decode(step: Any, passes: int) -> dict[str, Any]:
    """``timed_passes`` of a greedy decode: ``step(ids)`` returns the last position's
    logits; pass 0 feeds the prompt, pass k the token pass k - 1 chose."""
    tokens: list[int] = []

    def check(k: int, logits: Any) -> int:
        tokens.append(int(logits.argmax()))
        return tokens[-1]

    result = timed_passes(lambda k: step(None if k == 0 else tokens[-1]), passes, check)
    result.pop("checks")
    return {**result, "tokens": tokens, "tokens_per_s": 1 / result["step_s"],
            "vm_hwm_bytes": vm_hwm(os.getpid())}


def cached_step(model: Any, prompt: list[int]) -> Any:
    """``step(token)`` for a decode of ``model`` (a transformers model, or an engine running
    one): the prompt when ``token`` is None, else that one token on the cache the last step
    returned; each returns the last position's logits."""
    import torch

    state: dict[str, Any] = {"past": None}

    def step(token: int | None) -> Any:
        ids = torch.tensor([prompt if token is None else [token]])
        with torch.no_grad():
            out = model(ids, past_key_values=state["past"], use_cache=True)
        state["past"] = out.past_key_values
        return out.logits[0, -1]

    return step


def child_layerfit(folder: Path, passes: int, budget: int, threads: int, dequantize: bool) -> dict[str, Any]:
    """layerfit on ``folder`` at ``budget`` (pipeline auto), then one more step, traced,
    for the weight bytes a step reads."""
    import torch

    from layerfit.engine import load

    torch.set_num_threads(threads)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    prompt = prompt_tokens(vocab)
    t0 = time.perf_counter()
    engine = load(folder, budget=budget, dequantize=dequantize)
    load_s = time.perf_counter() - t0

    step = cached_step(engine, prompt)

    result = greedy_decode(step, passes)
    engine.trace = True
    step(result["tokens"][-1])
    return {
        "load_s": load_s, **result, "policy": engine.policy.name, "weights_held_bytes": engine.memory.weight_bytes,
        "engine_read_per_step_bytes": sum(e.nbytes for e in engine.last_timeline.events if e.stage == "read"),
        "threads": torch.get_num_threads(),
    }


def child_llamacpp(path: Path, passes: int, threads: int) -> dict[str, Any]:
    """llama.cpp (llama-cpp-python, mmap loading) on the GGUF file (its own environment)."""
    import llama_cpp
    import numpy as np

    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=PROMPT + passes + 8, n_batch=PROMPT, n_threads=threads,
                          n_threads_batch=threads, use_mmap=True, verbose=False)
    load_s = time.perf_counter() - t0
    prompt = prompt_tokens(llm.n_vocab())

    def step(token: int | None) -> Any:
        llm.eval(prompt if token is None else [token])
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)).copy()

    return {"load_s": load_s, **greedy_decode(step, passes), "threads": threads, "policy": "mmap"}


def child_floor(config: dict[str, Any], passes: int, threads: int) -> dict[str, Any]:
    """transformers' own eager decode of the architecture with nothing of size to compute
    (width 64, one head, a 512-token vocabulary; the layers the model has): the time its
    Python code and small ops take per step, which layerfit, running the model unchanged,
    cannot go below."""
    import torch
    import transformers

    torch.set_num_threads(threads)
    transformers.logging.set_verbosity_error()
    narrow = {**config, "hidden_size": 64, "intermediate_size": 64, "num_attention_heads": 1,
              "num_key_value_heads": 1, "vocab_size": 512}
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**narrow)).eval()
    prompt = [i % 500 + 3 for i in prompt_tokens(narrow["vocab_size"] + 300)]

    step = cached_step(model, prompt)

    return {"load_s": 0.0, **greedy_decode(step, passes), "threads": torch.get_num_threads(), "policy": "transformers"}


def child_bare(folder: Path, passes: int, threads: int, bf16: bool) -> dict[str, Any]:
    """The bound of running this model unchanged on PyTorch's kernels, with no layerfit code:
    transformers' own model of the folder's config, every linear layer the packed mode runs
    on the int4 kernel a plain module calling that kernel (seeded codes and scales: the
    time does not depend on their values), every other one a bf16 matrix as packed runs it,
    the embedding the model's own. Its activations are float32, cast to bf16 around each
    kernel as packed does; with ``bf16`` the whole model is bf16 and nothing is cast."""
    import torch
    import transformers
    from torch import nn

    from layerfit.engine.int4_packed import GROUP_SIZE
    from layerfit.store import read_manifest

    torch.set_num_threads(threads)
    transformers.logging.set_verbosity_error()
    config = {k: v for k, v in json.loads((folder / "config.json").read_text()).items() if k != "quantization_config"}
    manifest = read_manifest(folder)
    segments = ((manifest.resident,) if manifest.resident else ()) + tuple(manifest.units)
    int4 = {place.removesuffix(".weight") for segment in segments for t in segment.tensors
            if t.encoding is not None and t.encoding.int4_rows for place in t.places}
    generator = torch.Generator().manual_seed(0)

    class Product(nn.Module):
        """``[N, K]`` on the int4 kernel (``codes``) or as a bf16 matrix."""

        def __init__(self, n: int, k: int, codes: bool) -> None:
            super().__init__()
            self.n, self.k = n, k
            if codes:
                values = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=generator)
                self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(values, 1)
                self.scales = (torch.rand(k // GROUP_SIZE, n, 2, generator=generator) * 1e-2).to(torch.bfloat16)
            else:
                self.packed, self.weight = None, (torch.randn(n, k, generator=generator) * 2e-2).to(torch.bfloat16)

        def forward(self, x: Any) -> Any:
            flat = x.reshape(-1, self.k).to(torch.bfloat16)
            if self.packed is None:
                y = torch.nn.functional.linear(flat, self.weight)
            else:
                y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP_SIZE, self.scales)
            return y.to(x.dtype).reshape(*x.shape[:-1], self.n)

    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                place = f"{name}.{child_name}" if name else child_name
                setattr(module, child_name, Product(child.out_features, child.in_features, place in int4))
    model = model.to(torch.bfloat16 if bf16 else torch.float32).eval()
    prompt = prompt_tokens(config["vocab_size"])

    step = cached_step(model, prompt)

    return {"load_s": 0.0, **greedy_decode(step, passes), "int4_layers": len(int4), "threads": torch.get_num_threads(),
            "policy": "transformers, bf16 throughout" if bf16 else "transformers, no layerfit"}


def child_kernels(folder: Path, threads: int, repeats: int = 15) -> dict[str, Any]:
    """The packed model's weight products alone: every linear layer of the folder loaded
    with every weight held, its operand (int4 codes, or bf16) multiplied by one token's
    activations with the kernel the packed mode calls, each the median of ``repeats``; and
    the same through the layer's module call (layerfit's wrapper: casts, dispatch). A step
    computes each once, so the sums are the step's kernel time."""
    import statistics

    import torch
    import torch.nn.functional as F
    from torch import nn

    from layerfit.engine import load
    from layerfit.engine.int4_packed import GROUP_SIZE, PackedInt4

    torch.set_num_threads(threads)
    engine = load(folder, budget=manifest_info(folder)["weights_bytes"])
    with torch.no_grad():
        engine(torch.tensor([[5, 6, 7]]))  # binds every unit (preload)

        def median_s(call: Any) -> float:
            call()
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
            return statistics.median(times)

        raw = module_calls = 0.0
        int4 = other = 0
        for module in engine.model.modules():
            if not isinstance(module, nn.Linear):
                continue
            operand = getattr(module.weight, "operand", module.weight)
            x = torch.randn(1, module.in_features).to(torch.bfloat16)
            if isinstance(operand, PackedInt4):
                int4 += 1
                raw += median_s(lambda o=operand, x=x: torch.ops.aten._weight_int4pack_mm_for_cpu(
                    x, o.packed, GROUP_SIZE, o.scales_and_zeros))
            else:
                other += 1
                raw += median_s(lambda o=operand, x=x: F.linear(x.to(o.dtype), o))
            x32 = torch.randn(1, 1, module.in_features)
            module_calls += median_s(lambda m=module, x=x32: m(x))
    return {"load_s": 0.0, "first_s": 0.0, "step_s": raw, "module_calls_s": module_calls, "int4_layers": int4,
            "other_layers": other, "step_read_bytes": 0.0, "tokens_per_s": 1 / raw, "tokens": [],
            "vm_hwm_bytes": vm_hwm(os.getpid()), "threads": torch.get_num_threads(), "policy": "products alone"}


def child_quantize(source: Path, target: Path, kind: str) -> dict[str, Any]:
    """llama.cpp's own quantizer (``llama_model_quantize``) from ``source`` to ``target``."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = LLAMACPP_FTYPES[kind]
    params.nthread = os.cpu_count() or 1
    rc = llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize returned {rc}")
    return {"gguf_bytes": target.stat().st_size}


def run_child(argv: list[str]) -> dict[str, Any]:
    side, rest = argv[0], argv[1:]
    if side == "quantize":
        return child_quantize(Path(rest[0]), Path(rest[1]), rest[2])
    if side == "llamacpp":
        return child_llamacpp(Path(rest[0]), int(rest[1]), int(rest[2]))
    if side == "floor":
        return child_floor(json.loads(rest[0]), int(rest[1]), int(rest[2]))
    if side == "kernels":
        return child_kernels(Path(rest[0]), int(rest[1]))
    if side in ("bare", "bare-bf16"):
        return child_bare(Path(rest[0]), int(rest[1]), int(rest[2]), bf16=side == "bare-bf16")
    return child_layerfit(Path(rest[0]), int(rest[1]), int(rest[2]), int(rest[3]), dequantize=side == "dequantize")


# --- the models -----------------------------------------------------------------------------


def gguf_f16_tensors(model: Any) -> dict[str, Any]:
    """``model``'s weights named and laid out as llama.cpp's converter writes a Llama
    (query and key rows permuted), matrices F16 and vectors F32 (llama.cpp needs F32 norms)."""
    import gguf
    import numpy as np

    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    out = {}
    for hf_name, tensor in model.state_dict().items():
        if config.tie_word_embeddings and hf_name == "lm_head.weight":
            continue
        name = names.get_name(hf_name.removesuffix(".weight")) + ".weight"
        w = tensor.detach().float().numpy()
        n_head = next((n for key, n in heads.items() if f".{key}." in name), None)
        if n_head is not None:
            w = w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
        out[name] = np.ascontiguousarray(w.astype(np.float16) if w.ndim > 1 else w)
    return out


def write_f16_gguf(model: Any, path: Path) -> None:
    """The seeded model as an F16 GGUF file with tests/gguf_models.py's sentencepiece
    vocabulary, padded to the model's with filler pieces (transformers reads it)."""
    sys.path.insert(0, str(BENCH.parent / "tests"))
    import gguf
    import gguf_models

    vocab = model.config.vocab_size
    meta = gguf_models.tokenizer_metadata("llama")
    tokens, scores, types = (list(meta["tokenizer.ggml.tokens"]), list(meta["tokenizer.ggml.scores"][1]),
                             list(meta["tokenizer.ggml.token_type"][1]))
    filler = vocab - len(tokens)
    tokens += [f"\u2581w{i}" for i in range(filler)]
    scores += [-1000.0 - i for i in range(filler)]
    types += [1] * filler
    meta.update({"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": ("float32", scores),
                 "tokenizer.ggml.token_type": ("int32", types)})
    metadata = {"general.architecture": "llama", "general.file_type": ("uint32", int(gguf.LlamaFileType.MOSTLY_F16)),
                **gguf_models.config_metadata("llama", model.config), **meta}
    gguf_models.write_raw_gguf(path, gguf_f16_tensors(model), metadata)


def manifest_info(folder: Path) -> dict[str, Any]:
    """A prepared folder's weight bytes and layerfit's minimum budget for it."""
    from layerfit.engine.gather import streamed_minimum
    from layerfit.store import read_manifest

    manifest = read_manifest(folder)
    return {"weights_bytes": manifest.total_bytes, "resident_bytes": manifest.resident_bytes,
            "units": len(manifest.units),
            "minimum_budget_bytes": manifest.resident_bytes + streamed_minimum(manifest.units)}


def prepared_form_key() -> str:
    """A digest of the sources that decide how a GGUF file is prepared."""
    import layerfit.store as store

    root = Path(store.__file__).parent
    digest = hashlib.sha256()
    for name in ("writer.py", "int4_form.py", "q6k_form.py", "gguf_blocks.py", "gguf_folder.py", "manifest.py"):
        digest.update((root / name).read_bytes())
    return digest.hexdigest()


def model_files(name: str, llamacpp_python: str) -> dict[str, Any]:
    """The quantized GGUF file and both prepared folders of ``name`` (made once, cached
    while the model's description is the same)."""
    import torch
    import transformers

    from layerfit.store import prepare

    spec, work = MODELS[name], CACHE / name
    gguf_path, stamp = work / f"model.{spec['quant']}.gguf", work / "files.key"
    key = json.dumps(spec, sort_keys=True)
    if not (stamp.is_file() and stamp.read_text() == key):
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        transformers.logging.set_verbosity_error()
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**spec["config"])).eval()
        model.save_pretrained(work / "hf")
        write_f16_gguf(model, work / "model.F16.gguf")
        del model
        proc = subprocess.run([llamacpp_python, __file__, "--child", "quantize", str(work / "model.F16.gguf"),
                               str(gguf_path), spec["quant"]], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{name}: quantizing failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
        (work / "model.F16.gguf").unlink()
        prepare("hf:" + str(work / "hf"), work / "fp32", force=True)
        shutil.rmtree(work / "hf")
        stamp.write_text(key)
    # the GGUF folder again whenever the code that writes it changed (the stored form of its
    # weights is layerfit's, not the file's)
    packed_stamp, packed_key = work / "packed.key", prepared_form_key()
    if not (packed_stamp.is_file() and packed_stamp.read_text() == packed_key):
        prepare("gguf:" + str(gguf_path), work / "packed", force=True)
        packed_stamp.write_text(packed_key)
    return {"gguf_path": str(gguf_path), "gguf_bytes": gguf_path.stat().st_size, "quant": spec["quant"],
            "config": spec["config"], "packed": manifest_info(work / "packed"), "fp32": manifest_info(work / "fp32")}


# --- the parent -----------------------------------------------------------------------------


def row(config: str, files: dict[str, Any], args: argparse.Namespace, limit: int | None,
        budget: int | None = None) -> dict[str, Any]:
    """One configuration in a fresh child in its own memory cgroup at ``limit``."""
    from memory_limits import limited_child

    passes, threads = str(args.steps + 1), str(args.threads)
    if config == "llamacpp":
        child, python = ["llamacpp", files["gguf_path"], passes, threads], str(args.llamacpp_python)
    elif config == "floor":
        child, python = ["floor", json.dumps(files["config"]), passes, threads], sys.executable
    elif config == "kernels":
        child, python = ["kernels", str(Path(files["gguf_path"]).parent / "packed"), threads], sys.executable
    elif config in ("bare", "bare-bf16"):
        child, python = [config, str(Path(files["gguf_path"]).parent / "packed"), passes, threads], sys.executable
    else:
        folder = Path(files["gguf_path"]).parent / ("fp32" if config == "fp32" else "packed")
        child, python = [config, str(folder), passes, str(budget), threads], sys.executable
    load_average = os.getloadavg()[0]
    try:
        r = limited_child(__file__, child, limit, python=python, timeout=CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        r = {"returncode": None, "error": f"stalled: killed after {CHILD_TIMEOUT} s", "timed_out": True}
    r = {"config": config, "limit_bytes": limit, "budget_bytes": budget, "load_average_1m": load_average, **r}
    print(" ", summary(r), flush=True)
    return r


def summary(r: dict[str, Any]) -> str:
    """One line of a row for the log."""
    where = f"{r['config']} at {mb(r['limit_bytes'])} MB (budget {mb(r['budget_bytes'])} MB)"
    if r.get("returncode") != 0:
        return f"{where}: failed ({r.get('oom_kills', 0)} OOM kills): {r.get('error')}"
    return (f"{where}: {r['tokens_per_s']:.1f} tokens/s, read/step {r['step_read_bytes'] / 1e6:.1f} MB, "
            f"cgroup peak {mb(r['cgroup_peak_bytes'])} MB, VmHWM {mb(r['vm_hwm_bytes'])} MB, "
            f"policy {r.get('policy')}")


def mb(x: float | None) -> str:
    return "-" if x is None else f"{x / 1e6:.0f}"


def footprint(config: str, files: dict[str, Any], args: argparse.Namespace, budget: int) -> int:
    """F of a layerfit route at ``budget``: a child without a limit; its anonymous peak
    less the weights it held, plus ``FILE_ROOM`` (vs_mmap's rule)."""
    r = row(config, files, args, None, budget)
    if r.get("returncode") != 0:
        raise SystemExit(f"{config} without a limit at {budget} bytes failed: {r.get('error')}")
    return r["anon_peak_bytes"] - r["weights_held_bytes"] + FILE_ROOM


def plan(files: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The footprints, llama.cpp's peak without a limit, and the limits to run. The packed
    route's F grows with the weights it holds (their int4 kernels' layout is anonymous memory
    beside the blocks read), so it is measured at the minimum budget and with every weight
    held, and taken as linear between the two (``packed_budget``)."""
    packed, fp32 = files["packed"], files["fp32"]
    f_min = footprint("packed", files, args, packed["minimum_budget_bytes"])
    f_full = footprint("packed", files, args, packed["weights_bytes"])
    f_dequantize = footprint("dequantize", files, args, packed["weights_bytes"])
    fp32_budget = max(int(FP32_SHARE * fp32["weights_bytes"]), fp32["minimum_budget_bytes"])
    f_fp32 = footprint("fp32", files, args, fp32_budget)
    free = row("llamacpp", files, args, None)
    if free.get("returncode") != 0:
        raise SystemExit(f"llama.cpp without a limit failed: {free.get('error')}")
    low = packed["minimum_budget_bytes"] + f_min
    high = max(packed["weights_bytes"] + f_full, free["cgroup_peak_bytes"]) + HEADROOM
    limits = [megabytes_up(low + (high - low) * i / (args.limits - 1)) for i in range(args.limits)]
    return {"footprint_packed_bytes": [f_min, f_full], "footprint_dequantize_bytes": f_dequantize,
            "footprint_fp32_bytes": f_fp32, "llamacpp_unlimited": free, "limits_bytes": limits,
            "dequantize_limit_bytes": max(limits[-1], megabytes_up(packed["weights_bytes"] + f_dequantize)),
            "fp32_budget_bytes": fp32_budget, "fp32_limit_bytes": megabytes_up(fp32_budget + f_fp32)}


def megabytes_up(x: float) -> int:
    """``x`` bytes rounded up to whole megabytes."""
    return -int(-x // 1_000_000) * 1_000_000


def packed_budget(packed: dict[str, Any], p: dict[str, Any], limit: int) -> int:
    """The packed route's budget at ``limit``: the largest B with B + F(B) <= limit, F linear
    between its two measurements, within [the minimum budget, the weights]."""
    low, high = packed["minimum_budget_bytes"], packed["weights_bytes"]
    f_min, f_full = p["footprint_packed_bytes"]
    slope = (f_full - f_min) / (high - low) if high > low else 0.0
    return int(min(max((limit - f_min + slope * low) / (1 + slope), low), high))


def configurations(files: dict[str, Any], p: dict[str, Any]) -> list[tuple[str, int | None, int]]:
    """(configuration, limit, budget) of every row of a round, alternating llama.cpp and layerfit."""
    weights = files["packed"]["weights_bytes"]
    out: list[tuple[str, int | None, int]] = []
    for limit in p["limits_bytes"]:
        out += [("llamacpp", limit, 0), ("packed", limit, packed_budget(files["packed"], p, limit))]
    out.append(("dequantize", p["dequantize_limit_bytes"], weights))
    at40 = p["fp32_limit_bytes"]
    out += [("fp32", at40, p["fp32_budget_bytes"]),
            ("packed", at40, packed_budget(files["packed"], p, at40)),
            ("floor", None, 0), ("kernels", None, 0), ("bare", None, 0), ("bare-bf16", None, 0)]
    return out


def run_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every row of ``name``: ``--rounds`` rounds of its configurations; the fastest of each."""
    files = model_files(name, str(args.llamacpp_python))
    print(f"{name}: {files['quant']} file {mb(files['gguf_bytes'])} MB, packed {mb(files['packed']['weights_bytes'])} "
          f"MB, fp32 {mb(files['fp32']['weights_bytes'])} MB", flush=True)
    p = plan(files, args)
    print(f"{name}: limits {', '.join(mb(x) for x in p['limits_bytes'])} MB; fp32 at "
          f"{mb(p['fp32_limit_bytes'])} MB", flush=True)
    runs: dict[tuple[str, int | None, int], list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for c in configurations(files, p):
            budget = None if c[0] == "llamacpp" else c[2]
            runs.setdefault(c, []).append(row(c[0], files, args, c[1], budget))
    rows = []
    for rs in runs.values():
        best = fastest(rs)
        for summary_of, r in zip(best["rounds"], rs, strict=True):
            summary_of.update({k: r.get(k) for k in ("tokens_per_s", "vm_hwm_bytes", "tokens")})
        rows.append(best)
    return {**files, **p, "rows": rows}


def agreement(a: list[int] | None, b: list[int] | None) -> dict[str, Any] | None:
    """Two greedy decodes' tokens: how many agree before the first difference, of how many."""
    if not a or not b:
        return None
    n = min(len(a), len(b))
    same = next((i for i in range(n) if a[i] != b[i]), n)
    return {"equal_before_difference": same, "tokens": n}


def find(rows: list[dict[str, Any]], config: str, limit: int | None) -> dict[str, Any] | None:
    """The row of ``config`` at ``limit`` that ran to the end, or None."""
    return next((r for r in rows if r["config"] == config and r["limit_bytes"] == limit and r.get("returncode") == 0),
                None)


def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    return a["tokens_per_s"] / b["tokens_per_s"] if a and b else None


def derive(model: dict[str, Any]) -> None:
    """Per limit: whether llama.cpp held the file, packed ÷ llama.cpp against its goal and
    both peaks; packed ÷ fp32 at 40 %; the tokens' agreement."""
    rows, top = model["rows"], model["limits_bytes"][-1]
    model["reachable"] = reachable = reachable_terms(model)
    model["per_limit"] = []
    for limit in model["limits_bytes"]:
        lc, pk = find(rows, "llamacpp", limit), find(rows, "packed", limit)
        holds = lc["step_read_bytes"] < FITS_READ_SHARE * model["gguf_bytes"] if lc else None
        x = ratio(pk, lc)
        goal = GOAL_HOLDS if holds else GOAL_SHORT
        most = at_most(reachable, limit, lc)
        model["per_limit"].append({
            "limit_bytes": limit, "llamacpp_holds_file": holds, "packed_over_llamacpp": x, "goal": goal,
            "met": None if x is None else x >= goal, **most,
            "goal_reachable": None if most["at_most_over_llamacpp"] is None else most["at_most_over_llamacpp"] >= goal,
            **{f"{k}_{w}": r.get(f"{w}_bytes") if r else None
               for k, r in (("packed", pk), ("llamacpp", lc)) for w in ("vm_hwm", "cgroup_peak", "anon_peak")},
        })
    at40 = model["fp32_limit_bytes"]
    x = ratio(find(rows, "packed", at40), find(rows, "fp32", at40))
    held = ratio(find(rows, "packed", top), find(rows, "fp32", at40))
    model["packed_over_fp32_at_40"] = {"limit_bytes": at40, "ratio": x, "goal": GOAL_FP32,
                                       "met": None if x is None else x >= GOAL_FP32,
                                       "packed_all_held_ratio": held}
    floor, kernels = find(rows, "floor", None), find(rows, "kernels", None)
    lc_best = max((r for r in rows if r["config"] == "llamacpp" and r.get("returncode") == 0),
                  key=lambda r: r["tokens_per_s"], default=None)
    ceiling = floor["step_s"] + kernels["step_s"] if floor and kernels else None
    model["transformers_floor"] = {
        "step_s": floor["step_s"] if floor else None,
        "kernels_step_s": kernels["step_s"] if kernels else None,
        "kernels_module_calls_s": kernels.get("module_calls_s") if kernels else None,
        "llamacpp_best_step_s": lc_best["step_s"] if lc_best else None,
        "share_of_llamacpp_step": floor["step_s"] / lc_best["step_s"] if floor and lc_best else None,
        "packed_bound_over_llamacpp": lc_best["step_s"] / ceiling if ceiling and lc_best else None,
    }
    best_packed = max((r for r in rows if r["config"] == "packed" and r.get("policy") == "preload" and r.get("returncode") == 0),
                      key=lambda r: r["tokens_per_s"], default=None)
    for config, key in (("bare", "bare"), ("bare-bf16", "bare_bf16")):
        bare = find(rows, config, None)
        model["transformers_floor"][f"{key}_step_s"] = bare["step_s"] if bare else None
        model["transformers_floor"][f"{key}_over_llamacpp"] = ratio(bare, lc_best)
        model["transformers_floor"][f"packed_over_{key}"] = ratio(best_packed, bare)
    where = {"packed": top, "llamacpp": top, "dequantize": model["dequantize_limit_bytes"]}
    tokens = {c: (find(rows, c, limit) or {}).get("tokens") for c, limit in where.items()}
    model["agreement"] = {"packed_vs_dequantize": agreement(tokens["packed"], tokens["dequantize"]),
                          "packed_vs_llamacpp": agreement(tokens["packed"], tokens["llamacpp"]),
                          "dequantize_vs_llamacpp": agreement(tokens["dequantize"], tokens["llamacpp"])}


def reachable_terms(model: dict[str, Any]) -> dict[str, Any] | None:
    """What bounds any run of this model through transformers on PyTorch, from this run's rows:
    the libraries' memory (the *floor* row's anonymous peak, plus ``FILE_ROOM`` for their
    files), the least compute a step takes (floor + kernels), and the fastest rate at which
    any row read the disk (its disk reads a step ÷ its step time). None without those rows."""
    rows = model["rows"]
    floor, kernels = find(rows, "floor", None), find(rows, "kernels", None)
    rates = [r["step_read_bytes"] / r["step_s"] for r in rows
             if r.get("returncode") == 0 and r.get("step_read_bytes", 0) > FITS_READ_SHARE * model["gguf_bytes"]]
    if not (floor and kernels and rates):
        return None
    return {"libraries_bytes": floor["anon_peak_bytes"] + FILE_ROOM, "compute_step_s": floor["step_s"] + kernels["step_s"],
            "read_bytes_per_s": max(rates), "quantized_bytes": model["gguf_bytes"]}


def at_most(terms: dict[str, Any] | None, limit: int, lc: dict[str, Any] | None) -> dict[str, Any]:
    """The most packed could reach at ``limit`` (its tokens/s ÷ llama.cpp's there), on
    assumptions that favour it: the process takes only what the libraries take, every other
    byte of the limit holds weights, a step reads the rest of the GGUF file's quantized bytes
    (none of the packed form's extra) at the run's fastest disk rate, fully overlapped with
    the least compute. A goal above it cannot be met running the model through transformers."""
    if terms is None or lc is None:
        return {"at_most_streamed_bytes": None, "at_most_step_s": None, "at_most_over_llamacpp": None}
    held = min(max(limit - terms["libraries_bytes"], 0), terms["quantized_bytes"])
    streamed = terms["quantized_bytes"] - held
    step = max(terms["compute_step_s"], streamed / terms["read_bytes_per_s"])
    return {"at_most_streamed_bytes": streamed, "at_most_step_s": step, "at_most_over_llamacpp": lc["step_s"] / step}


def number(x: float | None, unit: str = "") -> str:
    return "-" if x is None else f"{x:.2f}{unit}"


def markdown(data: dict[str, Any]) -> str:
    """The results as Markdown: the setting, then per model its rows, goals and peaks."""
    lc = data["llamacpp"]
    lines = [
        "# layerfit against llama.cpp on the same quantized GGUF file, at the same memory limits",
        "",
        "Each row is one fresh child process in its own memory cgroup at the limit (page cache counted, dropped "
        f"before each child), {data['threads']} threads each (llama.cpp's `n_threads`, PyTorch's). A "
        f"{PROMPT}-token prompt (the first, cold pass), then {data['steps']} cached steps, each feeding the "
        "configuration's own greedy token; tokens/s = 1 ÷ the median step. "
        f"{data['rounds']} round(s), the configurations alternating; each row is its fastest run, the JSON has all. "
        "*llamacpp*: llama-cpp-python, mmap loading; *packed*: layerfit's default for a GGUF folder (int4 kernels); "
        "*dequantize*: `dequantize=True` (bit-equal to transformers); *fp32*: the same seeded model prepared from "
        "its `save_pretrained` folder. layerfit's budget is min(limit − F, the weights), F its footprint beside the "
        f"weights (bench/vs_mmap.py's rule, {FILE_ROOM / 1e6:.0f} MB of it for its libraries' files). llama.cpp "
        f"*holds the file* where its steps read less than {FITS_READ_SHARE:.0%} of it from the disk. "
        "*VmHWM* is the process's peak resident memory (its mapped file pages included), *anon* its peak anonymous "
        "memory, *cgroup* the group's peak (page cache included).",
        "",
        "llama.cpp: " + (f"llama-cpp-python {lc['llama_cpp_python']}, gguf {lc['gguf']}." if lc["available"]
                         else lc["note"]),
        "",
        cpu_line(data["machine"]),
    ]
    if data.get("quick"):
        lines += ["", "**Smoke run (`--quick`)**: few steps, one round, two limits; not a measurement."]
    for name, model in data["models"].items():
        lines += model_markdown(name, model)
    return "\n".join(lines) + "\n"


def cpu_line(machine: dict[str, Any]) -> str:
    """The CPU the run had: PyTorch's int4 and bf16 kernels depend on its SIMD far more than
    llama.cpp's do."""
    if "cpu_model" not in machine:
        return "CPU: not recorded (a run before the bench recorded it)."
    return (f"CPU: {machine['cpu_model'] or '?'} ({', '.join(machine['cpu_simd']) or 'no listed SIMD'}); PyTorch "
            f"{machine['torch']} dispatches its CPU kernels at {machine['torch_cpu_capability']}.")


def model_markdown(name: str, model: dict[str, Any]) -> list[str]:
    """One model's section."""
    pk, fp = model["packed"], model["fp32"]
    at40 = model["packed_over_fp32_at_40"]
    agree = "; ".join(f"{k.replace('_', ' ')}: " + (f"{v['equal_before_difference']} of {v['tokens']} tokens equal "
                                                     "before the first difference" if v else "-")
                      for k, v in model["agreement"].items())
    lines = [
        "", f"## {name}: {model['quant']} file {mb(model['gguf_bytes'])} MB",
        "",
        f"layerfit's packed folder {mb(pk['weights_bytes'])} MB (minimum budget {mb(pk['minimum_budget_bytes'])} MB, "
        f"F = {mb(model['footprint_packed_bytes'][0])} MB there, {mb(model['footprint_packed_bytes'][1])} MB with "
        f"every weight held); fp32 folder {mb(fp['weights_bytes'])} MB (F = "
        f"{mb(model['footprint_fp32_bytes'])} MB); dequantize's F {mb(model['footprint_dequantize_bytes'])} MB "
        f"(its row runs at {mb(model['dequantize_limit_bytes'])} MB); llama.cpp without a limit: cgroup peak "
        f"{mb(model['llamacpp_unlimited']['cgroup_peak_bytes'])} MB, VmHWM "
        f"{mb(model['llamacpp_unlimited']['vm_hwm_bytes'])} MB.",
        "",
        f"packed ÷ fp32 tokens/s at {FP32_SHARE:.0%} of the fp32 weights ({mb(at40['limit_bytes'])} MB limit): "
        f"{number(at40['ratio'], '×')} (goal ≥ {GOAL_FP32:.0f}×: {verdict(at40['met'])}; packed's budget there is "
        "the limit less its own F, larger than fp32's); packed with every weight held (the top limit) ÷ fp32 at "
        f"{FP32_SHARE:.0%}: {number(at40['packed_all_held_ratio'], '×')}. Greedy tokens (packed and llama.cpp "
        f"at the top limit, dequantize at its own): {agree} (a seeded model's logits are nearly flat, so a "
        "difference in the last bits changes the greedy token where two nearly tie; the tokens are reported, "
        "not asserted).",
        "",
        floor_line(model),
        "",
        reachable_line(model),
        "",
        "| limit (MB) | llama.cpp holds the file | packed ÷ llama.cpp | goal | met | at most | layerfit VmHWM (MB) | "
        "llama.cpp VmHWM (MB) | layerfit anon (MB) | llama.cpp anon (MB) | layerfit cgroup (MB) | llama.cpp cgroup "
        "(MB) |",
        "|---:|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in model["per_limit"]:
        holds = "-" if x["llamacpp_holds_file"] is None else "yes" if x["llamacpp_holds_file"] else "no"
        lines.append(f"| {mb(x['limit_bytes'])} | {holds} | {number(x['packed_over_llamacpp'], '×')} | "
                     f"≥ {x['goal']}× | {verdict(x['met'])} | {number(x.get('at_most_over_llamacpp'), '×')} | "
                     f"{mb(x['packed_vm_hwm'])} | {mb(x['llamacpp_vm_hwm'])} | "
                     f"{mb(x['packed_anon_peak'])} | {mb(x['llamacpp_anon_peak'])} | {mb(x['packed_cgroup_peak'])} | "
                     f"{mb(x['llamacpp_cgroup_peak'])} |")
    lines += [
        "",
        "| limit (MB) | configuration | budget (MB) | policy | load (s) | first pass (ms) | step (ms) | tokens/s | "
        "disk read per step (MB) | layerfit read per step (MB) | VmHWM (MB) | anon (MB) | cgroup peak (MB) | "
        "load average |",
        "|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(model["rows"], key=lambda r: (r["limit_bytes"] or 0, r["config"])):
        head = f"| {mb(r['limit_bytes'])} | {r['config']} | {mb(r['budget_bytes'])} |"
        if r.get("returncode") != 0:
            why = "killed by the OOM killer" if r.get("oom_kills") else f"failed: {r.get('error')}"
            lines.append(f"{head} {why} | | | | | | | | | {mb(r.get('cgroup_peak_bytes'))} | "
                         f"{r['load_average_1m']:.1f} |")
            continue
        lines.append(f"{head} {r.get('policy')} | {r['load_s']:.1f} | {r['first_s'] * 1e3:.0f} | "
                     f"{r['step_s'] * 1e3:.1f} | {r['tokens_per_s']:.1f} | {mb(r['step_read_bytes'])} | "
                     f"{mb(r.get('engine_read_per_step_bytes'))} | {mb(r['vm_hwm_bytes'])} | "
                     f"{mb(r['anon_peak_bytes'])} | {mb(r['cgroup_peak_bytes'])} | {r['load_average_1m']:.1f} |")
    return lines


def floor_line(model: dict[str, Any]) -> str:
    """What transformers' own code costs a step of this architecture (the *floor* row)."""
    f = model.get("transformers_floor") or {}
    if f.get("step_s") is None:
        return "transformers' floor: not measured."
    line = (f"*floor*: transformers' own eager decode of this architecture (its {model['config']['num_hidden_layers']} "
            f"layers at width 64: its Python code and small ops, nothing of size to compute) takes "
            f"{f['step_s'] * 1e3:.1f} ms a step, {number(f['share_of_llamacpp_step'])}× llama.cpp's fastest step "
            f"({f['llamacpp_best_step_s'] * 1e3:.1f} ms).")
    if f.get("kernels_step_s") is None:
        return line
    return (line + f" *kernels*: the packed model's weight products alone (each linear layer's operand times one "
            f"token, with the kernel the packed mode calls) take {f['kernels_step_s'] * 1e3:.1f} ms a step "
            f"({f['kernels_module_calls_s'] * 1e3:.1f} ms through the layers' calls, layerfit's casts and dispatch "
            f"included). Running the model unchanged on these kernels, a step takes at least floor + kernels = "
            f"{(f['step_s'] + f['kernels_step_s']) * 1e3:.1f} ms: packed can reach at most "
            f"{number(f['packed_bound_over_llamacpp'], '×')} llama.cpp's tokens/s." + bare_line(f))


def reachable_line(model: dict[str, Any]) -> str:
    """How the *at most* column is computed, with this model's terms."""
    t = model.get("reachable")
    if not t:
        return "*at most*: not computed (the floor, kernels or a streamed row is missing)."
    short = [x for x in model["per_limit"] if x["met"] is False]
    beyond = [mb(x["limit_bytes"]) for x in short if x.get("goal_reachable") is False]
    within = [mb(x["limit_bytes"]) for x in short if x.get("goal_reachable")]
    return (f"*at most*: the most packed could reach at the limit running the model through transformers on "
            f"PyTorch, on assumptions that favour it: the process takes only what its libraries take (the floor "
            f"row's anonymous peak + {FILE_ROOM / 1e6:.0f} MB for their files: {mb(t['libraries_bytes'])} MB), "
            f"every other byte of the limit holds weights, and a step reads the rest of the file's "
            f"{mb(t['quantized_bytes'])} MB of quantized bytes (none of the packed form's extra) at the run's "
            f"fastest disk rate ({t['read_bytes_per_s'] / 1e9:.2f} GB/s), wholly overlapped with the least compute "
            f"(floor + kernels, {t['compute_step_s'] * 1e3:.1f} ms); ÷ llama.cpp's step at that limit. Goals not "
            f"met beyond that bound (unreachable this way): {megabytes_list(beyond)}; not met within it: "
            f"{megabytes_list(within)}.")


def megabytes_list(limits: list[str]) -> str:
    return f"{', '.join(limits)} MB" if limits else "none"


def bare_line(f: dict[str, Any]) -> str:
    """The *bare* rows: the model unchanged on the kernels, with no layerfit code."""
    if f.get("bare_step_s") is None:
        return ""
    line = (f" *bare*: transformers' own model of this config with every linear layer on the kernel packed calls "
            f"(its fp32 activations cast to bf16 around each, as packed does) and no layerfit code takes "
            f"{f['bare_step_s'] * 1e3:.1f} ms a step: {number(f['bare_over_llamacpp'], '×')} llama.cpp's tokens/s")
    if f.get("bare_bf16_step_s") is not None:
        line += (f"; with the whole model in bf16 (nothing cast) {f['bare_bf16_step_s'] * 1e3:.1f} ms: "
                 f"{number(f['bare_bf16_over_llamacpp'], '×')}")
    return line + (f". packed with every weight held reaches {number(f['packed_over_bare'], '×')} bare's tokens/s "
                   "(fastest runs).")


def verdict(met: bool | None) -> str:
    return "-" if met is None else "met" if met else "not met"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    p.add_argument("--models", default=",".join(MODELS), help=f"of {', '.join(MODELS)}")
    p.add_argument("--limits", type=int, default=5, help="memory limits per model (at least 2)")
    p.add_argument("--steps", type=int, default=16, help="cached decode steps")
    p.add_argument("--rounds", type=int, default=3, help="runs of each configuration; the fastest is shown")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="llama.cpp's and PyTorch's threads")
    p.add_argument("--llamacpp-python", type=Path, default=LLAMACPP_PYTHON,
                   help="the interpreter of a virtual environment with llama-cpp-python and gguf")
    p.add_argument("--quick", action="store_true", help="smoke run: 2 limits, 1 round, 4 steps")
    p.add_argument("--output", default="vs_llamacpp_quantized")
    p.add_argument("--output-dir", type=Path, default=None, help="default bench/results")
    args = p.parse_args(argv)
    if args.child:
        from memory_limits import AnonPeak

        sampler = AnonPeak()
        result = run_child(args.child)
        print(json.dumps({**result, "anon_peak_bytes": sampler.peak_now()}))
        return 0
    if args.quick:
        args.limits, args.rounds, args.steps = 2, 1, 4
    names = args.models.split(",")
    if unknown := [n for n in names if n not in MODELS]:
        p.error(f"unknown models {unknown}: use {', '.join(MODELS)}")
    if args.limits < 2 or args.steps < 1 or args.rounds < 1:
        p.error("--limits at least 2, --steps and --rounds at least 1")
    from reporting import RESULTS, machine

    llamacpp = llamacpp_status(args.llamacpp_python)
    if not llamacpp["available"]:
        raise SystemExit(f"llama.cpp: {llamacpp['note']}")
    t_start = time.perf_counter()
    data: dict[str, Any] = {"machine": machine(), "steps": args.steps, "rounds": args.rounds, "threads": args.threads,
                            "quick": args.quick, "prompt_tokens": PROMPT, "llamacpp": llamacpp, "models": {}}
    for name in names:
        data["models"][name] = model = run_model(name, args)
        derive(model)
    data["wall_s"] = time.perf_counter() - t_start
    out = args.output_dir or RESULTS
    out.mkdir(parents=True, exist_ok=True)
    js, md = out / f"{args.output}.json", out / f"{args.output}.md"
    js.write_text(json.dumps(data, indent=2, default=str) + "\n")
    md.write_text(markdown(data))
    print(f"wrote {js} and {md} in {data['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
