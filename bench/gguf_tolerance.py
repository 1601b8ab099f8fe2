"""How far layerfit's packed int4 mode is from ``--dequantize`` on a trained model's GGUF files (#54).

A GGUF folder runs in two modes: ``dequantize=True``, bit-equal to transformers' GGUF loader,
and the default *packed* mode (Q4_0, Q4_1 and Q4_K weights on PyTorch's int4 kernel with
bf16 scales and zeros and bf16 activations, every other type dequantized to bf16:
``layerfit.engine.int4_packed``). Issue #54 asks for the packed mode's tolerance, measured:
greedy agreement with ``--dequantize`` over 256 tokens of real text, and perplexity on a
text within 1 %. Seeded random weights give neither text nor a perplexity that means
anything, and nothing is downloaded, so the bench trains its model itself:

- *Model*: a byte-level ``transformers.LlamaForCausalLM`` (4 layers, 256 wide, MLP 1024,
  4 query / 2 key-value heads of 64, untied output; ``CONFIG``), its vocabulary
  the sentencepiece one of ``bench/vs_llamacpp_quantized.py``'s GGUF files (``<unk> <s>
  </s> <pad>``, the 256 byte pieces ``<0x00>``..``<0xFF>`` at ids 4..259, then pieces the
  model never sees), padded to 416 ids so that every matrix's rows and columns suit the
  int4 kernel (N % 16, K % 32) and llama.cpp's K-quants (K % 256). Text is its UTF-8
  bytes, byte ``b`` token ``4 + b``: a valid tokenization under that vocabulary.
- *Data*: the running Python's standard library, its top-level ``*.py`` files in name
  order (``bench/moe_decoding.py``'s corpus: 168 files, 4.7 MB for CPython 3.11.7); the
  last 5 % of its bytes (the tail of ``uuid.py`` to ``zipimport.py``) held out, never
  trained on. The JSON records the Python version, the files and the corpus's SHA-256.
- *Training*: seeded, on the CPU, two threads, float32, AdamW with a warmup and a cosine
  decay, a fixed number of steps (``TRAINING``) on random 512-byte windows of the training
  part; the held-out loss (nats per byte) is recorded along the way. Cached under
  ``bench/.cache/gguf_tolerance/`` by a hash of the config, the training settings and the
  corpus (trained again only when one changes).
- *Files*: the trained model written as an F16 GGUF file (norms F32) by
  ``vs_llamacpp_quantized.write_f16_gguf``, quantized by llama.cpp's own quantizer
  (``llama_model_quantize`` through llama-cpp-python, in its own environment) to Q4_0,
  Q4_1 and Q4_K_M (llama.cpp keeps the output matrix at Q6_K in each, and Q4_K_M, the mix
  users download, puts some ``attn_v``/``ffn_down`` at Q6_K too; Q6_K runs on the int4 kernel
  in packed mode as well, ``layerfit.engine.q6k_packed``). Each file is prepared with
  ``layerfit.store.prepare("gguf:" + file)`` on every run (the store's writer may change;
  the GGUF files are cached).
- *Measured*, every weight resident (``pipeline="preload"``), ``layerfit.from_pretrained``
  in each mode, and transformers' own ``AutoModelForCausalLM.from_pretrained(folder,
  gguf_file=...)`` (float32) as the reference that ``--dequantize`` must equal:

  * perplexity, teacher-forced, over ``--windows`` disjoint 512-byte windows of the held-out
    text (exp of the mean next-byte loss over all their positions); packed ÷ dequantize
    against the goal (within 1 %, both ways); the share of positions whose argmax agrees,
    and the largest logit difference;
  * greedy decoding of ``--new-tokens`` tokens (256) through the model's ``generate``
    (``do_sample=False``) from a 128-byte held-out prompt: the tokens equal before the first
    difference and the positions equal in all; at the first difference, both modes'
    logit margins between the two tokens (how near a tie it was);
  * the same perplexity and greedy text in the packed mode *streamed* at the least budget
    (``pipeline="async"``), where a Q6_K weight runs as its form's stripes on the int4
    kernel rather than dense bf16;
  * the reference's perplexity and greedy tokens, which must equal dequantize's exactly;
    and, for scale, the trained float32 model's own perplexity before any GGUF file.

Run (writes ``bench/results/gguf_tolerance.{json,md}``; on the shared 2-core development machine,
other jobs running (load average 3-5), training took 29 minutes the first time and the rest 4
minutes; a rerun finds the model and the GGUF files cached and takes the 4 minutes)::

    .venv/bin/python bench/gguf_tolerance.py [--quants Q4_0,Q4_1,Q4_K_M] [--windows 4] [--new-tokens 256]
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import platform
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import torch

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from model_setup import cached_training, train_step  # noqa: E402
from moe_decoding import corpus  # noqa: E402
from reporting import machine, mb, write_results  # noqa: E402
from vs_llamacpp_quantized import LLAMACPP_FTYPES, write_f16_gguf  # noqa: E402
from vs_mmap import LLAMACPP_PYTHON, llamacpp_status  # noqa: E402

CACHE = BENCH / ".cache" / "gguf_tolerance"
BYTE0 = 4  # the id of <0x00>: after <unk>, <s>, </s>, <pad> in the sentencepiece vocabulary
CONFIG = {"vocab_size": 416, "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 1024,
          "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
          "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}
TRAINING = {"seed": 0, "steps": 700, "batch": 4, "length": 512, "lr": 3e-3, "warmup": 30, "final_lr_share": 0.1,
            "bf16": False, "threads": 2, "held_out": 0.05, "eval_every": 100}
WINDOW, PROMPT = 512, 128  # bytes per perplexity window; bytes of the greedy prompt
QUANTS = ("Q4_0", "Q4_1", "Q4_K_M")
PACKED_TYPES = ("Q4_0", "Q4_1", "Q4_K")  # what the packed mode runs on the int4 kernel
GOAL_PPL = 0.01  # packed's perplexity within 1 % of dequantize's


# --- the data -------------------------------------------------------------------------------


def corpus_files() -> list[str]:
    """The files ``moe_decoding.corpus`` reads, by name (recorded with the results)."""
    return [Path(f).name for f in sorted(glob.glob(str(Path(sysconfig.get_paths()["stdlib"]) / "*.py")))]


def tokens_of(data: bytes) -> torch.Tensor:
    """Bytes as token ids: byte ``b`` is the piece ``<0xbb>``, id ``BYTE0 + b``."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long() + BYTE0


def text_of(ids: list[int]) -> str:
    """Token ids back to text (ids outside the byte pieces shown as U+FFFD)."""
    return bytes(i - BYTE0 if BYTE0 <= i < BYTE0 + 256 else 0x3F for i in ids).decode("utf-8", "replace")


def split(data: bytes) -> tuple[torch.Tensor, torch.Tensor]:
    """The training part and the held-out part (the last ``held_out`` share of the bytes)."""
    tokens = tokens_of(data)
    at = int(len(tokens) * (1 - TRAINING["held_out"]))
    return tokens[:at], tokens[at:]


def windows(held: torch.Tensor, count: int) -> torch.Tensor:
    """``count`` disjoint ``WINDOW``-byte windows spread over the held-out part, after the
    greedy prompt's bytes (which start it)."""
    stride = (len(held) - PROMPT) // count
    return torch.stack([held[PROMPT + k * stride: PROMPT + k * stride + WINDOW] for k in range(count)])


# --- the trained model ----------------------------------------------------------------------


def trained(data: bytes) -> tuple[Path, dict[str, Any]]:
    """The trained model's folder and its training record (trained once, then cached)."""
    return cached_training(CACHE, [CONFIG, TRAINING], data, lambda digest, out: _train(data, digest, out))


def held_out_loss(model: Any, held: torch.Tensor) -> float:
    """Mean next-byte loss (nats per byte) over 4 held-out windows."""
    batch = windows(held, 4)
    model.eval()
    with torch.no_grad():
        loss = model(batch, labels=batch).loss.item()
    model.train()
    return loss


def _train(data: bytes, digest: str, out: Path) -> dict[str, Any]:
    import transformers

    threads = torch.get_num_threads()
    torch.set_num_threads(TRAINING["threads"])
    try:
        torch.manual_seed(TRAINING["seed"])
        train_part, held = split(data)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG))
        steps, warmup, floor = TRAINING["steps"], TRAINING["warmup"], TRAINING["final_lr_share"]

        def rate(s: int) -> float:
            if s < warmup:
                return (s + 1) / warmup
            return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * (s - warmup) / max(steps - warmup, 1)))

        optimizer = torch.optim.AdamW(model.parameters(), lr=TRAINING["lr"], betas=(0.9, 0.98), weight_decay=0.01)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
        gen = torch.Generator().manual_seed(TRAINING["seed"])
        length, curve, t0 = TRAINING["length"], [], time.perf_counter()
        initial = held_out_loss(model, held)
        model.train()
        for step in range(1, steps + 1):
            starts = torch.randint(0, len(train_part) - length, (TRAINING["batch"],), generator=gen)
            ids = torch.stack([train_part[s: s + length] for s in starts.tolist()])
            loss = train_step(model, optimizer, schedule, ids, ids, TRAINING["bf16"])
            if step % TRAINING["eval_every"] == 0 or step == steps:
                held_loss = held_out_loss(model, held)
                seconds = time.perf_counter() - t0
                curve.append({"step": step, "loss": loss.item(), "held_out_loss": held_loss, "seconds": seconds})
                print(f"gguf tolerance: training step {step} loss {loss.item():.3f} held-out {held_loss:.3f} "
                      f"nats/byte ({seconds:.0f} s)", flush=True)
        model.eval()
        record = {"config": CONFIG, "training": TRAINING, "corpus_bytes": len(data), "corpus_sha256": digest,
                  "corpus_files": corpus_files(), "python": platform.python_version(),
                  "train_bytes": len(train_part), "held_out_bytes": len(held),
                  "parameters": sum(p.numel() for p in model.parameters()),
                  "seconds": time.perf_counter() - t0, "initial_held_out_loss": initial,
                  "held_out_loss_nats_per_byte": curve[-1]["held_out_loss"], "curve": curve}
        partial = out.with_name(out.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        model.save_pretrained(partial)
        (partial / "training.json").write_text(json.dumps(record, indent=2) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        partial.rename(out)
        return record
    finally:
        torch.set_num_threads(threads)


# --- the GGUF files -------------------------------------------------------------------------


def gguf_files(folder: Path, quants: list[str], llamacpp: dict[str, Any]) -> dict[str, Path]:
    """The trained model as F16 GGUF, quantized by llama.cpp to each of ``quants`` (cached
    beside the model, keyed by llama-cpp-python's version)."""
    import transformers

    work = folder / "gguf"
    stamp = work / "files.key"
    key = json.dumps({"llama_cpp_python": llamacpp["llama_cpp_python"], "gguf": llamacpp["gguf"],
                      "quants": sorted(quants)})
    paths = {q: work / f"model.{q}.gguf" for q in quants}
    if stamp.is_file() and stamp.read_text() == key and all(p.is_file() for p in paths.values()):
        return paths
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    transformers.logging.set_verbosity_error()
    model = transformers.LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32)
    f16 = work / "model.F16.gguf"
    write_f16_gguf(model, f16)
    for q, path in paths.items():
        proc = subprocess.run([str(LLAMACPP_PYTHON), str(BENCH / "vs_llamacpp_quantized.py"), "--child", "quantize",
                               str(f16), str(path), q], capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"quantizing to {q} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    f16.unlink()
    stamp.write_text(key)
    return paths


# --- the measurement ------------------------------------------------------------------------


def tensor_types(folder: Path) -> dict[str, int]:
    """How many of a prepared folder's tensors are stored in each GGML type (float ones by dtype)."""
    from layerfit.store import read_manifest

    counts: dict[str, int] = {}
    for segment in read_manifest(folder).segments:
        for t in segment.tensors:
            kind = t.encoding.ggml if t.encoding else str(t.dtype).removeprefix("torch.")
            counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items()))


def scored(logits: torch.Tensor, batch: torch.Tensor) -> dict[str, float]:
    """Teacher-forced next-byte loss and perplexity of ``logits`` over ``batch``."""
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                             batch[:, 1:].reshape(-1)).item()
    return {"loss_nats_per_byte": loss, "perplexity": math.exp(loss)}


def greedy(model: Any, prompt: torch.Tensor, new: int) -> list[int]:
    """``new`` greedy tokens of ``model.generate`` after ``prompt`` (no early stop)."""
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                             pad_token_id=CONFIG["pad_token_id"])
    return out[0, prompt.shape[1]:].tolist()


def agreement(a: list[int], b: list[int]) -> dict[str, int]:
    """Two greedy decodes: tokens equal before the first difference, positions equal in all."""
    n = min(len(a), len(b))
    return {"equal_before_difference": next((i for i in range(n) if a[i] != b[i]), n),
            "equal_positions": sum(x == y for x, y in zip(a, b, strict=False)), "tokens": n}


def margins(models: dict[str, Any], prompt: torch.Tensor, tokens: dict[str, list[int]], at: int) -> dict[str, Any]:
    """At the first difference ``at``: each mode's logit of its own token less that of the
    other's, after the prompt and the common tokens (how near a tie the step was)."""
    ids = torch.cat([prompt, torch.tensor([tokens["packed"][:at]])], dim=1)
    chosen = {mode: tokens[mode][at] for mode in models}
    out: dict[str, Any] = {"position": at, "tokens": chosen}
    with torch.no_grad():
        for mode, model in models.items():
            last = model(ids).logits[0, -1].float()
            other = next(t for m, t in chosen.items() if m != mode)
            out[f"{mode}_margin"] = (last[chosen[mode]] - last[other]).item()
    return out


def measure(kind: str, path: Path, held: torch.Tensor, args: argparse.Namespace,
            trained_tokens: list[int]) -> dict[str, Any]:
    """One quantized file: prepared, then both modes and transformers' own model on the
    held-out windows and the greedy prompt."""
    import transformers

    from layerfit import from_pretrained
    from layerfit.engine.gather import streamed_minimum
    from layerfit.store import prepare, read_manifest

    folder = path.parent / f"prepared-{kind}"
    t0 = time.perf_counter()
    prepare("gguf:" + str(path), folder, force=True)
    prepare_s = time.perf_counter() - t0
    batch, prompt = windows(held, args.windows), held[:PROMPT][None]
    result: dict[str, Any] = {"gguf_bytes": path.stat().st_size, "prepare_s": prepare_s,
                              "tensor_types": tensor_types(folder)}
    logits: dict[str, torch.Tensor] = {}
    tokens: dict[str, list[int]] = {}
    manifest = read_manifest(folder)
    least = manifest.resident_bytes + streamed_minimum(manifest.units)
    with from_pretrained(folder, pipeline="preload", dequantize=True) as exact, \
            from_pretrained(folder, pipeline="preload") as packed, \
            from_pretrained(folder, budget=least, pipeline="async") as streamed:
        models = {"dequantize": exact, "packed": packed, "packed_streamed": streamed}
        for mode, model in models.items():
            with torch.no_grad():
                logits[mode] = model(batch).logits.float()
            tokens[mode] = greedy(model, prompt, args.new_tokens)
            result[mode] = {**scored(logits[mode], batch), "weights_held_bytes": model.engine.memory.weight_bytes,
                            "tokens": tokens[mode]}
        agree = agreement(tokens["packed"], tokens["dequantize"])
        pair = {"dequantize": exact, "packed": packed}
        result["first_difference"] = (margins(pair, prompt, tokens, agree["equal_before_difference"])
                                      if agree["equal_before_difference"] < agree["tokens"] else None)
    reference = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                                   torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits["reference"] = reference(batch).logits.float()
    tokens["reference"] = greedy(reference, prompt, args.new_tokens)
    result["reference"] = {**scored(logits["reference"], batch), "tokens_equal_dequantize":
                           tokens["reference"] == tokens["dequantize"],
                           "logits_equal_dequantize": torch.equal(logits["reference"], logits["dequantize"])}
    del reference
    diff = (logits["packed"] - logits["dequantize"]).abs()
    ppl_ratio = result["packed"]["perplexity"] / result["dequantize"]["perplexity"]
    result["packed_vs_dequantize"] = {
        "perplexity_ratio": ppl_ratio, "goal": GOAL_PPL, "met": abs(ppl_ratio - 1) <= GOAL_PPL,
        "greedy": agree,
        "argmax_agreement": (logits["packed"].argmax(-1) == logits["dequantize"].argmax(-1)).float().mean().item(),
        "max_abs_logit_diff": diff.max().item(), "median_abs_logit_diff": diff.median().item(),
        "logit_range": (logits["dequantize"].max() - logits["dequantize"].min()).item(),
    }
    streamed_ratio = result["packed_streamed"]["perplexity"] / result["dequantize"]["perplexity"]
    result["packed_streamed_vs_dequantize"] = {
        "budget_bytes": least, "perplexity_ratio": streamed_ratio, "goal": GOAL_PPL,
        "met": abs(streamed_ratio - 1) <= GOAL_PPL,
        "greedy": agreement(tokens["packed_streamed"], tokens["dequantize"]),
        "argmax_agreement": (logits["packed_streamed"].argmax(-1) == logits["dequantize"].argmax(-1)).float().mean().item(),
        "max_abs_logit_diff": (logits["packed_streamed"] - logits["dequantize"]).abs().max().item(),
    }
    result["dequantize_vs_float32_model"] = agreement(tokens["dequantize"], trained_tokens)
    shutil.rmtree(folder, ignore_errors=True)
    return result


def trained_baseline(folder: Path, held: torch.Tensor, args: argparse.Namespace) -> dict[str, Any]:
    """The trained float32 model itself (before any GGUF file): perplexity and greedy tokens."""
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    batch, prompt = windows(held, args.windows), held[:PROMPT][None]
    with torch.no_grad():
        logits = model(batch).logits.float()
    tokens = greedy(model, prompt, args.new_tokens)
    return {**scored(logits, batch), "tokens": tokens, "text": text_of(tokens)}


# --- the report -----------------------------------------------------------------------------


def verdict(met: bool) -> str:
    return "met" if met else "not met"


def markdown(data: dict[str, Any]) -> str:
    """The setting, the training, then a row per quantized file and the goals."""
    t, base = data["training"], data["float32_model"]
    c = t["config"]
    lines = [
        "# The packed int4 mode's tolerance against `--dequantize`, on a trained model's GGUF files",
        "",
        f"A byte-level Llama ({c['num_hidden_layers']} layers, {c['hidden_size']} wide, MLP "
        f"{c['intermediate_size']}, {c['num_attention_heads']} query / {c['num_key_value_heads']} key-value heads of "
        f"{c['head_dim']}, {c['vocab_size']} ids, untied output; {t['parameters'] / 1e6:.2f} M parameters) trained "
        f"here on the CPU on CPython {t['python']}'s standard library ({len(t['corpus_files'])} top-level `*.py` "
        f"files, {mb(t['corpus_bytes'])} MB, SHA-256 `{t['corpus_sha256'][:16]}…`; the last "
        f"{t['training']['held_out'] * 100:.0f} %, {t['held_out_bytes'] / 1e3:.0f} kB from `{data['held_out_from']}` on, "
        f"held out): {t['training']['steps']} steps of {t['training']['batch']} × {t['training']['length']} bytes in "
        f"{t['seconds']:.0f} s ({t['training']['threads']} threads), held-out loss "
        f"{t['initial_held_out_loss']:.2f} → {t['held_out_loss_nats_per_byte']:.2f} nats per byte "
        f"(uniform: {math.log(256):.2f}).",
        "",
        "Written as an F16 GGUF file, quantized by llama.cpp's own quantizer (llama-cpp-python "
        f"{data['llamacpp']['llama_cpp_python']}), each file prepared with `prepare(\"gguf:\" + file)` and run with "
        "every weight resident (`pipeline=\"preload\"`) in both modes; *reference*: transformers' "
        "`AutoModelForCausalLM.from_pretrained(folder, gguf_file=...)`, float32. Perplexity: teacher-forced over "
        f"{data['args']['windows']} disjoint {WINDOW}-byte held-out windows ({data['args']['windows'] * (WINDOW - 1)} "
        f"predicted bytes). Greedy: {data['args']['new_tokens']} tokens of `generate(do_sample=False)` after a "
        f"{PROMPT}-byte held-out prompt; *equal before* the first difference, *equal* positions in all. "
        f"*argmax agree*: share of the teacher-forced positions whose top token is the same. "
        f"The trained float32 model itself (no GGUF file): perplexity {base['perplexity']:.4f}.",
        "",
        "| file | MB | tensor types | perplexity reference | dequantize | packed | packed ÷ dequantize | "
        "within 1 % | greedy equal before | greedy equal | argmax agree | max abs logit diff (range) | "
        "reference = dequantize |",
        "|---|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for kind, r in data["quants"].items():
        x, g, ref = r["packed_vs_dequantize"], r["packed_vs_dequantize"]["greedy"], r["reference"]
        same = ("yes" if ref["logits_equal_dequantize"] and ref["tokens_equal_dequantize"]
                else f"no (logits {ref['logits_equal_dequantize']}, tokens {ref['tokens_equal_dequantize']})")
        types = ", ".join(f"{k} {v}" for k, v in r["tensor_types"].items())
        lines.append(f"| {kind} | {mb(r['gguf_bytes'])} | {types} | {ref['perplexity']:.4f} | "
                     f"{r['dequantize']['perplexity']:.4f} | {r['packed']['perplexity']:.4f} | "
                     f"{(x['perplexity_ratio'] - 1) * 100:+.3f} % | {verdict(x['met'])} | "
                     f"{g['equal_before_difference']} / {g['tokens']} | {g['equal_positions']} / {g['tokens']} | "
                     f"{x['argmax_agreement'] * 100:.2f} % | {x['max_abs_logit_diff']:.3f} ({x['logit_range']:.1f}) | "
                     f"{same} |")
    lines += ["", "*Streamed*: the packed mode again at the least budget (`pipeline=\"async\"`, every unit but the "
              "resident ones read for each pass), where a Q6_K weight runs as its stripes on the int4 kernel "
              "(`layerfit.engine.q6k_packed`) instead of dense bf16.", "",
              "| file | budget (MB) | perplexity | streamed ÷ dequantize | within 1 % | greedy equal before | "
              "greedy equal | argmax agree | max abs logit diff |", "|---|---:|---:|---:|---|---:|---:|---:|---:|"]
    for kind, r in data["quants"].items():
        s = r["packed_streamed_vs_dequantize"]
        lines.append(f"| {kind} | {mb(s['budget_bytes'])} | {r['packed_streamed']['perplexity']:.4f} | "
                     f"{(s['perplexity_ratio'] - 1) * 100:+.3f} % | {verdict(s['met'])} | "
                     f"{s['greedy']['equal_before_difference']} / {s['greedy']['tokens']} | "
                     f"{s['greedy']['equal_positions']} / {s['greedy']['tokens']} | {s['argmax_agreement'] * 100:.2f} % | "
                     f"{s['max_abs_logit_diff']:.3f} |")
    lines += ["", "At the first greedy difference (logit of a mode's own token less that of the other mode's, "
              "after the prompt and the common tokens), and how far dequantize's greedy text is from the float32 "
              "model's (quantization's own effect, for scale). A margin of 0 is an exact tie: the packed mode's output "
              "layer multiplies in bf16, so its logits are bf16 values (1/16 apart between 8 and 16) and argmax takes "
              "the lower id.", ""]
    for kind, r in data["quants"].items():
        d, q = r["first_difference"], r["dequantize_vs_float32_model"]
        where = ("none: all tokens equal" if d is None else
                 f"token {d['position']}: dequantize's margin {d['dequantize_margin']:.3f}, "
                 f"packed's {d['packed_margin']:.3f}")
        lines.append(f"- {kind}: {where}; dequantize vs the float32 model: {q['equal_before_difference']} equal "
                     f"before the first difference, {q['equal_positions']} of {q['tokens']} equal.")
    met = [k for k, r in data["quants"].items()
           if r["packed_vs_dequantize"]["met"] and r["packed_streamed_vs_dequantize"]["met"]]
    firsts = {k: r["first_difference"] for k, r in data["quants"].items() if r["first_difference"]}
    ties = [k for k, d in firsts.items() if d["packed_margin"] == 0]
    within = [k for k, d in firsts.items()
              if d["dequantize_margin"] <= data["quants"][k]["packed_vs_dequantize"]["max_abs_logit_diff"]]
    lines += [
        "",
        f"Goals (#54): perplexity within {GOAL_PPL * 100:.0f} % of dequantize's, held and streamed: "
        f"{len(met)} of {len(data['quants'])} files "
        f"({', '.join(met) or 'none'}). Greedy agreement over {data['args']['new_tokens']} tokens: stated above "
        "(the issue sets no threshold; a difference where the margin is within the logits' measured difference is "
        f"a near tie that bf16 rounding decides): of {len(firsts)} files whose greedy tokens differ, the first "
        f"difference is an exact tie in packed's logits in {len(ties)} and within the largest teacher-forced logit "
        f"difference in dequantize's in {len(within)}.",
        "",
        f"The prompt and the float32 model's greedy continuation ({data['args']['new_tokens']} bytes):",
        "",
        "```text",
        data["prompt"] + "⟨continuation⟩" + base["text"],
        "```",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quants", default=",".join(QUANTS), help=f"of {', '.join(QUANTS)}")
    p.add_argument("--windows", type=int, default=4, help=f"held-out {WINDOW}-byte perplexity windows")
    p.add_argument("--new-tokens", type=int, default=256, help="greedy tokens compared")
    p.add_argument("--threads", type=int, default=2, help="PyTorch's threads while measuring")
    p.add_argument("--llamacpp-python", type=Path, default=LLAMACPP_PYTHON,
                   help="the interpreter of a virtual environment with llama-cpp-python and gguf")
    p.add_argument("--output", default="gguf_tolerance")
    args = p.parse_args(argv)
    quants = args.quants.split(",")
    if unknown := [q for q in quants if q not in QUANTS or q not in LLAMACPP_FTYPES]:
        p.error(f"unknown quantization types {unknown}: use {', '.join(QUANTS)}")
    if PROMPT + args.new_tokens > CONFIG["max_position_embeddings"] or args.windows < 1:
        p.error("--new-tokens too many for the model's positions, or --windows below 1")
    llamacpp = llamacpp_status(args.llamacpp_python)
    if not llamacpp["available"]:
        raise SystemExit(f"llama.cpp: {llamacpp['note']}")
    import transformers

    transformers.logging.set_verbosity_error()
    t_start = time.perf_counter()
    data_bytes = corpus()
    folder, record = trained(data_bytes)
    torch.set_num_threads(args.threads)
    _, held = split(data_bytes)
    paths = gguf_files(folder, quants, llamacpp)
    base = trained_baseline(folder, held, args)
    print(f"float32 model: perplexity {base['perplexity']:.4f}", flush=True)
    names = record["corpus_files"]
    at, held_from = 0, names[-1]
    for name in names:  # the file the held-out bytes start in
        size = (Path(sysconfig.get_paths()["stdlib"]) / name).stat().st_size
        if at + size > record["train_bytes"]:
            held_from = name
            break
        at += size
    data: dict[str, Any] = {
        "args": {"quants": args.quants, "windows": args.windows, "new_tokens": args.new_tokens,
                 "threads": args.threads},
        "machine": machine(), "llamacpp": llamacpp, "training": record, "held_out_from": held_from,
        "prompt": text_of(held[:PROMPT].tolist()), "float32_model": base, "quants": {}}
    for kind in quants:
        r = data["quants"][kind] = measure(kind, paths[kind], held, args, base["tokens"])
        x = r["packed_vs_dequantize"]
        print(f"{kind}: perplexity reference {r['reference']['perplexity']:.4f} dequantize "
              f"{r['dequantize']['perplexity']:.4f} packed {r['packed']['perplexity']:.4f} "
              f"({(x['perplexity_ratio'] - 1) * 100:+.3f} %), greedy {x['greedy']}, reference = dequantize: "
              f"{r['reference']['logits_equal_dequantize']} / {r['reference']['tokens_equal_dequantize']}", flush=True)
    data["wall_s"] = time.perf_counter() - t_start
    js, md = write_results(args.output, data, markdown(data))
    print(f"wrote {js} and {md} in {data['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
