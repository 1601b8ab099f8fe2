"""layerfit against PyTorch's own answer to weights larger than memory: ``torch.load(mmap=True)``.

PyTorch documents how to run a model whose weights do not fit: save the state dict with
``torch.save``, load it with ``torch.load(path, mmap=True)`` and assign it
(``load_state_dict(assign=True)``) to a skeleton whose parameters live on device meta;
the kernel then pages the weights in as they are touched and out under memory pressure.
Users compare layerfit with that first, so this bench runs both, and llama.cpp (its own
mmap loading of a GGUF file) where it builds, side by side at the same memory limits.

Every configuration runs in a fresh child process in its own memory cgroup (v1) at the
same limit; the limit counts the page cache (the mapped weights', and the libraries'),
which is dropped before each child. Configurations:

- *mmap*: the state dict saved once with ``torch.save``, loaded with
  ``torch.load(..., mmap=True, weights_only=True)`` and ``load_state_dict(assign=True)``
  into a skeleton built with its parameters on meta and its buffers real (a decoder's
  rotary ``inv_freq`` is a non-persistent buffer the state dict does not hold); tied
  weights are tied again afterwards where the model ties them.
- *layerfit*: the model prepared once with ``prepare("hf:" + folder)`` (a folder written
  by ``save_pretrained``; the zoo's ResNet-152 by name), loaded with
  ``layerfit.engine.load(prepared, memory_limit=L)`` (pipeline ``auto``) inside the cgroup
  of L: the bench's budget rule is layerfit's own. The engine runs its folder's example
  call twice at its minimum budget, measures the process beside its weights (anonymous
  memory, mapped file pages, a pass's activations, KV cache reserved, headroom: its
  ``Footprint``) and spends what L leaves on weights; the row's budget is the one it
  chose, and its footprint is in the JSON. A limit it finds too small is a row with its
  one-line error.
- *layerfit-budget*: hand-chosen plain budgets, ``load(prepared, budget=B)`` in the same
  cgroup of L, to say how close the memory limit's choice comes to the best budget at
  that limit. Each is chosen by: *memory limit* (the budget the layerfit child chose,
  run plainly), *F rule* (the rule of the earlier runs: B = L − F_anon − ``FILE_ROOM``
  (128 MB of page cache for the libraries' code), with F_anon the peak anonymous memory
  (RssAnon, sampled every 20 ms) beside the weights the engine held of a child without a
  limit at the minimum budget), and *sweep*: ``--sweep`` budgets evenly above the
  minimum budget up to L less the smallest footprint measured (F_anon, the footprints
  the memory limit measured), at most the weights. They run in ascending order; once one
  is killed for memory or stalls (past ``SWEEP_TIMEOUT_FACTOR`` times the slowest peer
  child's time at that limit, ``SWEEP_TIMEOUT_MIN`` seconds at least: too little room for
  the libraries' pages livelocks re-reading them, every fault bringing the disk's
  read-ahead in), the larger ones do not run in that round and their rows say so. The
  best hand-chosen budget is the fastest that completed; the goal is layerfit within the
  limit at most ``GOAL_VS_SWEEP`` (1.1) times its step. A child's disk reads per step
  beside the engine's own show any library page the limit evicted and a step read again
  (each layerfit child measures one more step with ``/proc/self/clear_refs`` and its
  mappings' ``Referenced`` pages).
- *llama.cpp* (decoders): the same weights written as an f32 GGUF file with the ``gguf``
  package, run by ``llama-cpp-python`` with its defaults (mmap loading, an f16 KV cache),
  in its own virtual environment (``--llamacpp-python``); where it is not there the
  output says so. To make one (it compiles llama.cpp with cmake and a C++ compiler: 9
  minutes on 2 cores), in a folder of your choice, and give the bench its python::

      python3 -m venv LLAMACPP_VENV
      LLAMACPP_VENV/bin/pip install llama-cpp-python gguf
      .venv/bin/python bench/vs_mmap.py --llamacpp-python LLAMACPP_VENV/bin/python

  llama.cpp on quantized GGUF files (Q4), against layerfit's packed, ``--dequantize`` and
  float32 routes at the same limits, is bench/vs_llamacpp_quantized.py (#54), with these
  helpers and this method.

Decoders run a 32-token prompt (the first, cold pass) and then ``--steps`` cached steps,
one token per call with ``past_key_values``; the reference's greedy tokens are fed to
every configuration, and each pass's logits are compared with the model's own
(computed once in the parent) by SHA-256, bit for bit, for mmap and layerfit; llama.cpp's
kernels differ, so its rows give the largest difference from the reference's last-position
logits and whether the greedy token agrees. The CNN runs one cold pass and then
``--cnn-passes`` more. Each configuration runs ``--rounds`` times at each limit, mmap's
layerfit's and the plain budgets' alternating, and the fastest run is shown (a busy machine
only ever slows a run down); the JSON keeps every run. Limits run from layerfit's own need
(its minimum weight budget plus its footprint F, both as reported by one child within a
roomy memory limit, the weights + ``ROOMY``, without a cgroup limit) to where everything
fits (the weights plus F), each ``NEED_MARGIN`` (3 %) above (the measure varies by a few MB
from one process to the next); the model does not fit a limit where the mmap peer's cached
steps read 1 % of its weights or more from the disk. The disk's direct-I/O read bandwidth is
measured in the same run (the largest prepared weights file read with ``O_DIRECT`` in
8 MiB and in 256 MiB reads, at the start and at the end), and
each layerfit row is set against its bound: max(bytes the engine read in a step ÷
the highest bandwidth, the step's time with every weight preloaded). Nothing asserts a
timing.

The prepared models are cached under ``bench/.cache/vs_mmap/``; the ``torch.save`` and
GGUF files are written for a model's rows and removed after them (the disk of the
development machine holds only one model's three copies at a time). Writes
``bench/results/vs_mmap.{json,md}``::

    .venv/bin/python bench/vs_mmap.py [--models llama-0.5g,llama-2.1g,resnet152] [--limits 5] [--steps 8] [--rounds 2] [--sweep 4]

layerfit's children load with its defaults, the read-ahead across passes on; with
``--no-read-ahead`` they load with ``read_ahead=False`` (give another ``--output``).
``bench/results/vs_mmap_read_ahead`` is a run with it on from before it was the default.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
CACHE = BENCH / ".cache" / "vs_mmap"
PROMPT = 32  # prompt tokens: the first pass
GENERATED = 16  # tokens of the reference decode; a run feeds the first --steps of them
CNN_SHAPE = (1, 3, 224, 224)
LLAMACPP_PYTHON = Path("/work/cache/llamacpp-venv/bin/python")
FILE_ROOM = 128_000_000  # page cache left to the files a layerfit child keeps using (its libraries' code)
CHILD_TIMEOUT = 300  # seconds: the slowest child of the full run takes about 30
ROOMY = 2_000_000_000  # beyond the weights: the memory limit of the child that measures layerfit's footprint
SWEEP = 4  # hand-chosen budgets spread at each limit (--sweep), beside the memory limit's and the F rule's
SWEEP_TIMEOUT_FACTOR, SWEEP_TIMEOUT_MIN = 4, 60  # a plain-budget child past 4x the slowest peer's time (60 s at least) stalled
GOAL_VS_SWEEP = 1.1  # layerfit within the limit: its step at most this times the best hand-chosen budget's
FITS_READ_SHARE = 0.01  # a limit fits the model where mmap's steps read less than this share of it

# Llama-style decoders, float32, seeded weights. The small one is bench/decoding.py's
# llama (GPT-2 small's width); the large one is TinyLlama's shape with 9 of its 22 layers.
DECODERS: dict[str, dict[str, Any]] = {
    "llama-0.5g": {
        "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12,
        "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 2048, "tie_word_embeddings": False,
    },
    "llama-2.1g": {
        "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 9, "num_attention_heads": 32,
        "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 2048, "tie_word_embeddings": False,
    },
    # bench/moe_decoding.py's Mixtral-style decoder: 8 experts, 2 per token (not in the
    # default --models; llama.cpp's GGUF writer here is Llama's, so it has no llama.cpp row)
    "mixtral-0.6g": {
        "vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 8,
        "num_attention_heads": 8, "num_key_value_heads": 4, "num_local_experts": 8, "num_experts_per_tok": 2,
        "max_position_embeddings": 1024,
    },
}
DEFAULT_MODELS = ["llama-0.5g", "llama-2.1g"]


def decoder(name: str) -> Any:
    """The transformers model of decoder ``name``, built from its config (seeded by the caller)."""
    import transformers

    config = DECODERS[name]
    if "num_local_experts" in config:
        return transformers.MixtralForCausalLM(transformers.MixtralConfig(**config))
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
CNN = "resnet152"
NEED_MARGIN = 1.03  # limits start this far above the need layerfit measured in the roomy child


# --- shared by the children ---------------------------------------------------------------


def digest(out: Any) -> str:
    """SHA-256 of a tensor's (or an array's) bytes."""
    array = out.detach().contiguous().numpy() if hasattr(out, "detach") else out
    return hashlib.sha256(array.tobytes()).hexdigest()


def disk_read_bytes() -> int:
    """Bytes this process has read from block devices so far (``/proc/self/io``)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    return 0


def cnn_input() -> Any:
    """The CNN's seeded input."""
    import torch

    return torch.randn(CNN_SHAPE, generator=torch.Generator().manual_seed(1))


def timed_passes(run: Callable[[int], Any], passes: int, check: Callable[[int, Any], Any] = lambda k, out: digest(out)) -> dict[str, Any]:
    """Time ``run(k)`` for ``k`` in ``range(passes)`` (pass 0 is the cold one): the first
    pass's seconds, the median of the others, the disk bytes each read, and ``check(k,
    output)`` of each pass, taken after its time."""
    seconds, reads, checks = [], [], []
    for k in range(passes):
        r0, t0 = disk_read_bytes(), time.perf_counter()
        out = run(k)
        seconds.append(time.perf_counter() - t0)
        reads.append(disk_read_bytes() - r0)
        checks.append(check(k, out))
    return {
        "first_s": seconds[0], "step_s": statistics.median(seconds[1:]), "steps_s": seconds[1:],
        "first_read_bytes": reads[0], "step_read_bytes": statistics.median(reads[1:]), "checks": checks,
    }


class Decode:
    """One decode as the reference ran it: call 0 is the prompt's pass, call k feeds the
    reference's k-th token with the cache the previous call returned; each returns its
    logits. The reference itself appends its greedy tokens to ``tokens`` as it goes."""

    def __init__(self, model: Any, tokens: list[int]) -> None:
        self.model, self.tokens, self.past = model, tokens, None

    def __call__(self, k: int) -> Any:
        import torch

        with torch.no_grad():
            if k == 0:
                out = self.model(torch.tensor([self.tokens[:PROMPT]]), use_cache=True)
            else:
                ids = torch.tensor([[self.tokens[PROMPT + k - 1]]])
                out = self.model(ids, past_key_values=self.past, use_cache=True)
        self.past = out.past_key_values
        return out.logits


class Forward:
    """The CNN's pass on its seeded input."""

    def __init__(self, model: Any) -> None:
        self.model, self.x = model, cnn_input()

    def __call__(self, k: int) -> Any:
        import torch

        with torch.no_grad():
            return self.model(self.x)


def runner(model: str, net: Any, expected: dict[str, Any]) -> Callable[[int], Any]:
    """The passes ``model`` runs: a decode of the reference's tokens, or the CNN's pass."""
    return Forward(net) if model == CNN else Decode(net, expected["tokens"])


def run_and_check(model: str, run: Callable[[int], Any], expected: dict[str, Any], passes: int) -> dict[str, Any]:
    """``timed_passes`` and whether every output equals the reference's, bit for bit."""
    result = timed_passes(run, passes)
    want = expected["digests"] * passes if model == CNN else expected["digests"][:passes]
    return {**result, "outputs_equal": result.pop("checks") == want}


# --- the children ---------------------------------------------------------------------------


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside register their parameters on device meta and their buffers
    as usual: the skeleton for ``load_state_dict(assign=True)``, with the non-persistent
    buffers (absent from a state dict) computed as the model's constructor computes them."""
    import torch
    from torch import nn

    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None:
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign]
    try:
        with torch.no_grad():
            yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def child_mmap(model: str, work: Path, passes: int) -> dict[str, Any]:
    """The PyTorch peer: the state dict memory-mapped and assigned to a meta skeleton."""
    import torch

    expected = json.loads((work / "expected.json").read_text())
    t0 = time.perf_counter()
    with parameters_on_meta():
        if model == CNN:
            from layerfit.zoo import get

            entry = get(model)
            net = entry.factory(**entry.kwargs)
        else:
            import transformers

            transformers.logging.set_verbosity_error()
            net = decoder(model)
    state = torch.load(work / "state.pt", mmap=True, weights_only=True)
    net.load_state_dict(state, assign=True)
    if getattr(getattr(net, "config", None), "tie_word_embeddings", False):
        net.tie_weights()
    net.eval()
    meta = [name for name, t in [*net.named_parameters(), *net.named_buffers()] if t.is_meta]
    if meta:
        raise RuntimeError(f"left on meta after loading: {meta}")
    load_s = time.perf_counter() - t0
    return {"load_s": load_s, **run_and_check(model, runner(model, net, expected), expected, passes)}


def child_layerfit(model: str, work: Path, passes: int, budget: int | None = None, read_ahead: bool = True,
                   memory_limit: int | None = None) -> dict[str, Any]:
    """layerfit: the prepared model at ``budget`` bytes of weights, or within
    ``memory_limit`` bytes for the whole process (``load(..., memory_limit=)``: the engine
    measures its own footprint and spends the rest on weights), pipeline auto, the
    read-ahead across passes on unless ``read_ahead`` is False; then one more pass,
    untimed and traced, for the weight bytes a pass reads."""
    from layerfit.engine import load

    expected = json.loads((work / "expected.json").read_text())
    t0 = time.perf_counter()
    engine = load(work / "prepared", budget=budget, memory_limit=memory_limit, read_ahead=read_ahead)
    load_s = time.perf_counter() - t0
    footprint = {} if engine.footprint is None else {
        **engine.footprint.to_dict(), "budget_bytes": engine.footprint.weight_budget_bytes,
        "footprint_describe": engine.footprint.describe()}
    run = runner(model, engine, expected)
    result = run_and_check(model, run, expected, passes)
    engine.trace = True
    Path("/proc/self/clear_refs").write_text("1")  # the pages the next step touches get their accessed bit
    run(passes)
    return {
        "load_s": load_s, **result, **footprint, "policy": engine.policy.name, "io_mode": engine.io_mode,
        "weights_held_bytes": engine.memory.weight_bytes, "kept_units": len(engine.kept_units),
        "units": len(engine.blocks),
        "engine_read_per_step_bytes": sum(e.nbytes for e in engine.last_timeline.events if e.stage == "read"),
        "file_pages_per_step_bytes": mapped_file_referenced(),
    }


def mapped_file_referenced() -> int:
    """Bytes of this process's file mappings (its libraries) referenced since the last
    ``clear_refs``: the page cache a step keeps using, which a limit must leave room for."""
    total, file_backed = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 5 and "-" in fields[0] and ":" in fields[3]:  # a mapping's header: inode 0 is anonymous
            file_backed = fields[4] != "0"
        elif fields[0] == "Referenced:" and file_backed:
            total += int(fields[1]) * 1024
    return total


def child_llamacpp(model: str, work: Path, passes: int) -> dict[str, Any]:
    """llama.cpp (llama-cpp-python, mmap loading) on the GGUF file; its last position's
    logits of each pass against the reference's (runs in llama.cpp's own environment)."""
    import llama_cpp
    import numpy as np

    expected = json.loads((work / "expected.json").read_text())
    tokens = expected["tokens"]
    rows = np.fromfile(work / "expected_logits.f32", dtype=np.float32).reshape(GENERATED + 1, -1)
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=str(work / "model.gguf"), n_ctx=PROMPT + GENERATED + 8, n_batch=PROMPT,
                n_threads=os.cpu_count(), use_mmap=True, verbose=False)
    load_s = time.perf_counter() - t0

    def run(k: int) -> Any:  # the last position's logits (the only ones llama.cpp keeps by default)
        llm.eval(tokens[:PROMPT] if k == 0 else [tokens[PROMPT + k - 1]])
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))

    def check(k: int, logits: Any) -> list[Any]:
        return [float(np.abs(logits - rows[k]).max()), int(logits.argmax()) == int(rows[k].argmax())]

    result = timed_passes(run, passes, check)
    checks = result.pop("checks")
    return {
        "load_s": load_s, **result, "outputs_equal": False, "max_abs_diff": max(c[0] for c in checks),
        "reference_max_abs": float(np.abs(rows[:passes]).max()), "argmax_equal": all(c[1] for c in checks),
    }


def child_gguf(work: Path) -> dict[str, Any]:
    """Write the prepared decoder's weights (``weights.safetensors``, named as the model
    names them) as an f32 GGUF file for llama.cpp, as its converter lays out a Llama:
    the query and key rows permuted back to the interleaved rotary halves llama.cpp uses.
    The vocabulary is placeholders (ids are fed directly; nothing is tokenized)."""
    import gguf
    import numpy as np

    config = json.loads((work / "prepared" / "config.json").read_text())
    path = work / "prepared" / "weights.safetensors"
    with open(path, "rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(size))
    data = np.memmap(path, dtype=np.uint8, mode="r")

    def tensor(name: str) -> Any:
        begin, end = header[name]["data_offsets"]
        return data[8 + size + begin:8 + size + end].view(np.float32).reshape(header[name]["shape"])

    def permute(w: Any, heads: int) -> Any:
        return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    rope = config.get("rope_parameters") or {}
    vocab = config["vocab_size"]
    writer = gguf.GGUFWriter(str(work / "model.gguf"), "llama")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_rope_dimension_count(head_dim)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("llama")
    special = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    writer.add_token_list(special + byte_tokens + [f"t{i}" for i in range(vocab - 259)])
    writer.add_token_scores([0.0] * vocab)
    writer.add_token_types([gguf.TokenType.UNKNOWN] + [gguf.TokenType.CONTROL] * 2 + [gguf.TokenType.BYTE] * 256
                           + [gguf.TokenType.NORMAL] * (vocab - 259))
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(config["num_hidden_layers"]):
        names.update({f"model.layers.{i}.{hf}.weight": f"blk.{i}.{g}.weight" for hf, g in layer.items()})
    for hf, name in names.items():
        w = tensor(hf)
        if hf.endswith("q_proj.weight"):
            w = permute(w, heads)
        elif hf.endswith("k_proj.weight"):
            w = permute(w, kv_heads)
        writer.add_tensor(name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"gguf_bytes": (work / "model.gguf").stat().st_size, "gguf_version": gguf.__version__ if hasattr(gguf, "__version__") else None}


# --- the parent -----------------------------------------------------------------------------


def build_model(name: str) -> Any:
    """The model with its seeded weights, in eval mode."""
    import torch

    if name == CNN:
        from layerfit.zoo import build

        return build(name)
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    return decoder(name).eval()


def prepared(name: str, work: Path) -> dict[str, Any]:
    """The model prepared for layerfit under ``work`` (cached while its configuration is
    the same): a decoder through a folder written by ``save_pretrained`` (removed after),
    the CNN by its zoo name. Returns its sizes and layerfit's minimum budget."""
    from layerfit.engine.gather import streamed_minimum
    from layerfit.errors import LayerfitError
    from layerfit.store import prepare, read_manifest

    work.mkdir(parents=True, exist_ok=True)
    key = json.dumps({"model": name, "config": DECODERS.get(name), "input_shape": CNN_SHAPE if name == CNN else None})
    out, stamp = work / "prepared", work / "prepared.key"
    try:
        manifest = read_manifest(out) if stamp.is_file() and stamp.read_text() == key else None
    except LayerfitError:
        manifest = None
    if manifest is None:
        stamp.unlink(missing_ok=True)
        if name == CNN:
            manifest = prepare(name, out, input_shape=CNN_SHAPE, force=True)
        else:
            folder = work / "hf"
            build_model(name).save_pretrained(folder)
            manifest = prepare("hf:" + str(folder), out, force=True)
            shutil.rmtree(folder)
        stamp.write_text(key)
    return {
        "weights_bytes": manifest.total_bytes, "resident_bytes": manifest.resident_bytes,
        "largest_unit_bytes": manifest.largest_unit_bytes, "units": len(manifest.units),
        "minimum_budget_bytes": manifest.resident_bytes + streamed_minimum(manifest.units),
        "pass_bytes": pass_bytes(name, manifest),
    }


def pass_bytes(name: str, manifest: Any) -> int:
    """What one step needs of the streamed weights at the least, whatever reads them: every
    unit but an embedding table (a step looks up a row or a few) and, of a module of routed
    experts, the share of the experts a token uses. Holding ``B`` bytes beside the resident
    tensors, any reader reads at least ``pass_bytes - B`` of them per step."""
    from layerfit.engine.experts import experts_segment
    from layerfit.engine.gather import gatherable_segment

    config = DECODERS.get(name, {})
    share = config.get("num_experts_per_tok", 1) / config.get("num_local_experts", 1)
    return sum(0 if gatherable_segment(u) else int(u.nbytes * share) if experts_segment(u) else u.nbytes
               for u in manifest.units)


def peer_files(name: str, work: Path) -> int:
    """Build the model, save its state dict with ``torch.save`` for the mmap peer and its
    reference outputs (``expected.json``; a decoder's greedy tokens, each pass's logits'
    digest, and their last rows as raw float32 for llama.cpp). Returns the file's bytes."""
    import torch

    net = build_model(name)
    torch.save(net.state_dict(), work / "state.pt")
    if name == CNN:
        expected = {"digests": [digest(Forward(net)(0))]}
    else:
        prompt = torch.randint(0, DECODERS[name]["vocab_size"], (PROMPT,), generator=torch.Generator().manual_seed(1))
        tokens = prompt.tolist()
        decode, digests, rows = Decode(net, tokens), [], []
        for k in range(GENERATED + 1):
            logits = decode(k)
            digests.append(digest(logits))
            rows.append(logits[0, -1])
            tokens.append(int(logits[0, -1].argmax()))
        torch.stack(rows).numpy().tofile(work / "expected_logits.f32")
        expected = {"tokens": tokens, "digests": digests}
    (work / "expected.json").write_text(json.dumps(expected))
    return (work / "state.pt").stat().st_size


def llamacpp_status(python: Path) -> dict[str, Any]:
    """Whether llama-cpp-python and gguf import in ``python``'s environment, and their versions."""
    import subprocess

    if not python.is_file():
        return {"available": False, "note": f"no llama.cpp environment at {python}"}
    probe = "import importlib.metadata as m, llama_cpp, gguf; print(m.version('llama-cpp-python'), m.version('gguf'))"
    proc = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    if proc.returncode != 0:
        return {"available": False, "note": f"llama_cpp or gguf does not import in {python}: "
                + ((proc.stderr.strip().splitlines() or ["?"])[-1])}
    llama, gguf = proc.stdout.split()
    return {"available": True, "python": str(python), "llama_cpp_python": llama, "gguf": gguf}


BANDWIDTH_CHUNKS = (8 << 20, 256 << 20)  # dd's kind of read, and one as large as a large unit


def read_ahead_kb(path: Path) -> int:
    """The read-ahead of the disk holding ``path``, which a page fault on a mapped file reads around."""
    from storage import block_device

    path.mkdir(parents=True, exist_ok=True)
    return int((Path("/sys/dev/block") / block_device(path) / "queue" / "read_ahead_kb").read_text())


def child_row(config: str, name: str, work: Path, passes: int, limit: int | None, budget: int | None = None,
              python: Path | str = sys.executable, read_ahead: bool = True, memory_limit: int | None = None,
              timeout: float = CHILD_TIMEOUT) -> dict[str, Any]:
    """One configuration in a fresh child at ``limit``; a child past its time is a row too.
    A layerfit child (``layerfit``, ``layerfit-budget``) runs at ``budget`` bytes of weights
    or within ``memory_limit`` (its row's ``budget_bytes`` is then the one it chose)."""
    import subprocess

    from memory_limits import limited_child

    args = [config, name, str(work), str(passes)]
    if config.startswith("layerfit"):
        args += [*([] if budget is None else [f"budget={budget}"]),
                 *([] if memory_limit is None else [f"memory-limit={memory_limit}"]),
                 *([] if read_ahead else ["no-read-ahead"])]
    load_average, t0 = os.getloadavg()[0], time.perf_counter()
    try:
        r = limited_child(__file__, args, limit, python=python, timeout=timeout)
    except subprocess.TimeoutExpired:
        r = {"returncode": None, "error": f"stalled: killed after {timeout:.0f} s", "timed_out": True}
    return {"model": name, "config": config, "limit_bytes": limit, "budget_bytes": budget,
            "load_average_1m": load_average, "wall_s": time.perf_counter() - t0, **r}


def failed(r: dict[str, Any]) -> bool:
    """Whether a child did not complete (killed for memory, stalled, or raised)."""
    return r.get("returncode") != 0


def sweep_budgets(limit: int, spread: int, minimum: int, weights: int, anon_footprint: int | None,
                  footprints: list[int], chosen: int | None) -> dict[int, str]:
    """The plain budgets layerfit runs at ``limit`` beside its memory limit, each with what
    chose it, ascending: the budget the memory limit chose (``chosen``), the earlier runs'
    F rule (``limit`` − the anonymous footprint − ``FILE_ROOM``), and ``spread`` budgets
    evenly above the ``minimum`` up to ``limit`` less the smallest footprint measured
    (``footprints``, ``anon_footprint`` among them), none above the ``weights``."""
    found = [f for f in [*footprints, anon_footprint] if f is not None]
    top = min(limit - min(found), weights)
    budgets: dict[int, str] = {}

    def add(budget: int, why: str) -> None:
        if minimum <= budget and all(abs(budget - b) >= 1_000_000 for b in budgets):
            budgets[budget] = why

    if chosen is not None:
        add(min(chosen, weights), "memory limit")
    if anon_footprint is not None:
        add(min(limit - anon_footprint - FILE_ROOM, weights), "F rule")
    for i in range(1, spread + 1):  # whole megabytes, but every weight where the top holds them all
        budget = minimum + (top - minimum) * i // spread
        add(budget if budget == weights else max(minimum, budget // 1_000_000 * 1_000_000), "sweep")
    return dict(sorted(budgets.items()))


def run_model(name: str, info: dict[str, Any], args: argparse.Namespace, llamacpp: dict[str, Any]) -> dict[str, Any]:
    """Every configuration of ``name`` at each limit; see the module's docstring."""
    import subprocess

    from layerfit.memory_limit import machine_memory_bytes
    from layerfit.sizes import format_bytes

    work = CACHE / name
    info = {**info, "state_dict_bytes": peer_files(name, work)}
    passes = (args.cnn_passes if name == CNN else args.steps) + 1
    read_ahead = not args.no_read_ahead
    # layerfit's own footprint: one child within a roomy memory limit (no cgroup limit).
    roomy = min(info["weights_bytes"] + ROOMY, machine_memory_bytes())
    measured = child_row("layerfit", name, work, passes, None, read_ahead=read_ahead, memory_limit=roomy)
    if failed(measured):
        raise SystemExit(f"{name}: layerfit within a memory limit of {format_bytes(roomy)} failed: {measured.get('error')}")
    footprint, minimum = measured["footprint_bytes"], measured["minimum_weight_bytes"]
    # The earlier runs' rule: one child without a limit at the minimum budget; its anonymous
    # peak beside the weights it held (plus FILE_ROOM) gave B = limit - F.
    rule = child_row("layerfit-budget", name, work, passes, None, info["minimum_budget_bytes"], read_ahead=read_ahead)
    anon_footprint = None if failed(rule) else rule["anon_peak_bytes"] - rule["weights_held_bytes"]
    # From a little above what layerfit says it needs (its measure varies by a few MB from one
    # process to the next) to where every weight fits beside the footprint.
    low, high = (minimum + footprint) * NEED_MARGIN, (info["weights_bytes"] + footprint) * NEED_MARGIN
    limits = [int(low + (high - low) * i / (args.limits - 1)) // 1_000_000 * 1_000_000 + 1_000_000
              for i in range(args.limits)]
    print(f"{name}: weights {format_bytes(info['weights_bytes'])}, layerfit's footprint {format_bytes(footprint)} "
          f"({measured['footprint_describe']}), its minimum weight budget {format_bytes(minimum)}; anonymous beside "
          f"the weights at the minimum budget {format_bytes(anon_footprint or 0)}; limits "
          + ", ".join(format_bytes(x) for x in limits), flush=True)
    from reporting import progress
    from storage import direct_read_once

    rows = []
    for limit in progress(limits, f"vs mmap {name}: memory limits"):
        mmap_runs: list[dict[str, Any]] = []
        ours_runs: list[dict[str, Any]] = []
        swept: dict[int, list[dict[str, Any]]] = {}
        budgets: dict[int, str] | None = None
        for _ in range(args.rounds):  # they alternate, so a slow stretch of the machine hits each
            mmap_runs.append(child_row("mmap", name, work, passes, limit))
            print(" ", summary(mmap_runs[-1]), flush=True)
            # The disk's rate the minute this child runs (its own weights file, the
            # engine's request size): the bound at that rate says what the reader lost.
            rate = direct_read_once(work / "prepared" / "weights.safetensors", BANDWIDTH_CHUNKS[0])
            ours_runs.append({**child_row("layerfit", name, work, passes, limit, read_ahead=read_ahead,
                                          memory_limit=limit),
                              "bandwidth_before_bytes_per_s": rate["bytes_per_s"]})
            print(" ", summary(ours_runs[-1]), flush=True)
            ours = ours_runs[-1]
            if budgets is None:
                budgets = sweep_budgets(
                    limit, args.sweep, minimum, info["weights_bytes"], anon_footprint,
                    [footprint, *([] if failed(ours) else [ours["footprint_bytes"]])],
                    None if failed(ours) else ours["budget_bytes"])
            # A plain budget that stalls is past its time well before CHILD_TIMEOUT.
            timeout = min(CHILD_TIMEOUT, max(SWEEP_TIMEOUT_MIN, SWEEP_TIMEOUT_FACTOR * max(
                ours["wall_s"], *(r["wall_s"] for r in mmap_runs if not failed(r)))))
            below: int | None = None  # a budget killed or stalled: no larger one runs after it
            for budget, why in budgets.items():
                earlier = swept.setdefault(budget, [])
                if below is None:
                    below = next((b for b, runs in swept.items() if b <= budget and runs and all(map(failed, runs))), None)
                if below is not None:
                    if not earlier:
                        earlier.append({"model": name, "config": "layerfit-budget", "limit_bytes": limit,
                                        "budget_bytes": budget, "chosen_by": why, "returncode": None,
                                        "error": f"not run: the smaller budget {format_bytes(below)} failed",
                                        "not_run": True, "load_average_1m": os.getloadavg()[0]})
                    continue
                earlier.append({**child_row("layerfit-budget", name, work, passes, limit, budget,
                                            read_ahead=read_ahead, timeout=timeout), "chosen_by": why})
                print(" ", summary(earlier[-1]), flush=True)
        rows += [fastest(mmap_runs), fastest(ours_runs), *(fastest(runs) for runs in swept.values())]
    (work / "state.pt").unlink()
    gguf_note = None
    if name != CNN and "num_local_experts" in DECODERS[name]:
        gguf_note = "No llama.cpp row: this bench writes GGUF files of Llama's layout only."
    elif name != CNN and llamacpp["available"]:
        proc = subprocess.run([llamacpp["python"], __file__, "--child", "gguf", str(work)], capture_output=True, text=True)
        if proc.returncode != 0:
            gguf_note = "writing the GGUF file failed: " + ((proc.stderr.strip().splitlines() or ["?"])[-1])
        else:
            info.update(json.loads(proc.stdout.strip().splitlines()[-1]))
            for limit in limits:
                runs = [child_row("llamacpp", name, work, passes, limit, python=llamacpp["python"])
                        for _ in range(args.rounds)]
                for r in runs:
                    print(" ", summary(r), flush=True)
                rows.append(fastest(runs))
        (work / "model.gguf").unlink(missing_ok=True)
    return {**info, "footprint_run": measured, "footprint_bytes": footprint, "minimum_weight_bytes": minimum,
            "rule_run": rule, "anon_footprint_bytes": anon_footprint, "limits_bytes": limits,
            "gguf_note": gguf_note, "rows": rows}


def streaming_budgets(name: str) -> list[int]:
    """The budgets the last run (``bench/results/vs_mmap.json``) gave layerfit's ``name``
    where it streamed: what the benches that study those budgets further run."""
    rows = json.loads((BENCH / "results" / "vs_mmap.json").read_text())["models"][name]["rows"]
    return sorted({r["budget_bytes"] for r in rows
                   if r["config"] == "layerfit" and r.get("returncode") == 0 and r.get("engine_read_per_step_bytes")})


def fastest(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run of a configuration with the fastest step (a busy machine only ever slows a
    run down), with every run's times and peaks under ``rounds``; the last run if none
    completed."""
    done = [r for r in runs if r.get("returncode") == 0]
    keys = ("returncode", "oom_kills", "timed_out", "error", "budget_bytes", "footprint_bytes", "first_s", "step_s",
            "step_read_bytes", "cgroup_peak_bytes", "anon_peak_bytes", "load_average_1m", "wall_s", "outputs_equal",
            "bandwidth_before_bytes_per_s")
    best = min(done, key=lambda r: r["step_s"]) if done else runs[-1]
    return {**best, "rounds": [{k: r.get(k) for k in keys} for r in runs]}


def summary(r: dict[str, Any]) -> str:
    """One line of a row for the log."""
    budget = "" if r.get("budget_bytes") is None else f" budget {r['budget_bytes']}"
    if r.get("returncode") != 0:
        return (f"{r['config']} at {r['limit_bytes']}{budget}: failed ({r.get('oom_kills', 0)} OOM kills): "
                f"{r.get('error')}")
    return (f"{r['config']} at {r['limit_bytes']}{budget}: first {r['first_s'] * 1e3:.0f} ms, step {r['step_s'] * 1e3:.1f} ms, "
            f"read/step {r['step_read_bytes'] / 1e6:.1f} MB, peak {r['cgroup_peak_bytes'] / 1e6:.0f} MB, "
            f"equal {r['outputs_equal']}")


def derive(data: dict[str, Any]) -> None:
    """Add to each row its step time over layerfit's at the same limit (``vs_layerfit``),
    whether the model fits the limit (the mmap peer's steps read less than ``FITS_READ_SHARE``
    of the weights from the disk), and, to layerfit's rows, the bound and its ratio."""
    bandwidth = max(b["bytes_per_s"] for b in data["bandwidth"])
    for model in data["models"].values():
        ok = [r for r in model["rows"] if r.get("returncode") == 0]
        preloaded = [r["step_s"] for r in ok if r.get("policy") == "preload"]
        model["preloaded_step_s"] = min(preloaded, default=None)
        peer = {r["limit_bytes"]: r["step_read_bytes"] for r in ok if r["config"] == "mmap"}
        for r in model["rows"]:
            r["fits"] = peer.get(r["limit_bytes"], math.inf) < FITS_READ_SHARE * model["weights_bytes"]
            ours = next((x for x in ok if x["config"] == "layerfit" and x["limit_bytes"] == r["limit_bytes"]), None)
            if r.get("returncode") == 0 and ours is not None:
                r["vs_layerfit"] = r["step_s"] / ours["step_s"]
                r["first_vs_layerfit"] = r["first_s"] / ours["first_s"]
                if ours["step_read_bytes"]:
                    r["read_vs_layerfit"] = r["step_read_bytes"] / ours["step_read_bytes"]
            if r["config"].startswith("layerfit") and r.get("returncode") == 0:
                r["bound_s"] = max(r["engine_read_per_step_bytes"] / bandwidth, model["preloaded_step_s"] or 0.0)
                r["step_over_bound"] = r["step_s"] / r["bound_s"] if r["bound_s"] else None
                if r.get("bandwidth_before_bytes_per_s"):  # the bound at the rate of the child's minute
                    minute = max(r["engine_read_per_step_bytes"] / r["bandwidth_before_bytes_per_s"],
                                 model["preloaded_step_s"] or 0.0)
                    r["step_over_minute_bound"] = r["step_s"] / minute if minute else None
        short = [r for r in model["rows"] if r["config"] == "mmap" and not r["fits"] and "vs_layerfit" in r]
        model["target_3x_met"] = bool(short) and min(r["vs_layerfit"] for r in short) >= 3.0
        model["short_limits"] = [{k: r.get(k) for k in ("limit_bytes", "vs_layerfit", "read_vs_layerfit")} for r in short]
        for x, r in zip(model["short_limits"], short, strict=True):
            # The most layerfit could be at this budget: its bytes at the disk's best
            # measured rate (or its preloaded compute), against the peer's step; and the
            # most any reader holding the same budget could be: it reads at least what it
            # does not hold of what a step needs (pass_bytes), at the same rate.
            ours = next(o for o in ok if o["config"] == "layerfit" and o["limit_bytes"] == r["limit_bytes"])
            x["ceiling"] = r["step_s"] / ours["bound_s"] if ours.get("bound_s") else None
            if model.get("pass_bytes") is not None:
                held = ours["budget_bytes"] - model["resident_bytes"]
                least = max(max(model["pass_bytes"] - held, 0) / bandwidth, model["preloaded_step_s"] or 0.0)
                x["any_reader_ceiling"] = r["step_s"] / least if least else None
                x["layerfit_over_any_reader_bound"] = ours["step_s"] / least if least else None
        reachable = [x for x in model["short_limits"] if (x.get("any_reader_ceiling") or 0) >= 3.0]
        model["target_3x_met_where_reachable"] = all(x["vs_layerfit"] >= 3.0 for x in reachable)
        model["file_pages_per_step_bytes"] = max(
            (r["file_pages_per_step_bytes"] for r in ok if r["config"].startswith("layerfit")), default=None)
        model["vs_sweep"] = [against_sweep(model["rows"], limit) for limit in model["limits_bytes"]]
        ratios = [x["ratio"] for x in model["vs_sweep"] if x["best_budget_bytes"] is not None]
        model["sweep_goal_met"] = bool(ratios) and all(x is not None and x <= GOAL_VS_SWEEP for x in ratios)


def against_sweep(rows: list[dict[str, Any]], limit: int) -> dict[str, Any]:
    """At ``limit``: layerfit within the memory limit (its budget, its step) against the
    best hand-chosen budget (the fastest plain budget that completed), and their ratio
    (None where layerfit within the limit did not complete, or no plain budget did)."""
    ours = next(r for r in rows if r["config"] == "layerfit" and r["limit_bytes"] == limit)
    swept = [r for r in rows if r["config"] == "layerfit-budget" and r["limit_bytes"] == limit]
    done = [r for r in swept if r.get("returncode") == 0]
    best = min(done, key=lambda r: r["step_s"]) if done else None
    ran = ours.get("returncode") == 0
    return {
        "limit_bytes": limit, "budget_bytes": ours.get("budget_bytes"), "step_s": ours.get("step_s") if ran else None,
        "completed": ran, "error": None if ran else ours.get("error"), "oom_kills": ours.get("oom_kills"),
        "best_budget_bytes": best and best["budget_bytes"], "best_chosen_by": best and best["chosen_by"],
        "best_step_s": best and best["step_s"],
        "ratio": ours["step_s"] / best["step_s"] if ran and best else None,
        "first_s": ours.get("first_s") if ran else None, "best_first_s": best and best["first_s"],
        "best_first_read_bytes": best and best["first_read_bytes"],
        "budgets_completed": len(done), "budgets_failed": sum(1 for r in swept if r.get("returncode") != 0 and not r.get("not_run")),
        "budgets_not_run": sum(1 for r in swept if r.get("not_run")),
    }


def number(x: float | None) -> str:
    """A ratio for a table cell."""
    return "-" if x is None else f"{x:.2f}"


def markdown(data: dict[str, Any]) -> str:
    """The results as Markdown: the setting, then one table per model."""
    from reporting import mb

    bw = ", ".join(f"{b['bytes_per_s'] / 1e6:.0f} MB/s ({b['chunk_bytes'] >> 20} MiB reads, {b['when']})"
                   for b in data["bandwidth"])
    lc = data["llamacpp"]
    lines = [
        "# layerfit against `torch.load(mmap=True)` (and llama.cpp) at the same memory limits",
        "",
        "Each row is one fresh child process in its own memory cgroup at the limit (page cache counted, dropped "
        "before each child). *mmap*: `torch.load(mmap=True, weights_only=True)` + `load_state_dict(assign=True)` "
        "into a skeleton with its parameters on meta; *layerfit*: `engine.load(prepared, memory_limit=limit)`, "
        "pipeline auto"
        f"{' (the read-ahead across passes on)' if data.get('read_ahead') else ', with `read_ahead=False`'}: "
        "layerfit measures its own footprint and spends what the limit leaves on weights; *layerfit-budget*: "
        "`engine.load(prepared, budget=B)` at a hand-chosen budget B, in the same cgroup; "
        "*llamacpp*: llama-cpp-python on an f32 GGUF of the same weights, its mmap loading. "
        f"Decoders: a {PROMPT}-token prompt (the first, cold pass), then {data['steps']} cached steps of one token; "
        f"the CNN ({CNN}, {CNN_SHAPE[-1]} px): a cold pass, then {data['cnn_passes']} more. "
        "*step* is the median of the steps after the first pass. Each configuration ran "
        f"{data['rounds']} times at each limit (mmap's, layerfit's and the plain budgets' alternating); a row is its run "
        "with the fastest "
        "step, the JSON has every run."
        + (" The children import a private copy of torch: the bench's own process maps the installed one, and a "
           "library page another process maps is never paged out of a child nor left out of its footprint, where a "
           "board running layerfit alone shares none." if data.get("private_torch") else ""),
        "",
        "**Budgets**: the layerfit row's budget is the one `memory_limit` chose inside the cgroup of the limit (the "
        "engine runs its folder's example call twice at its minimum budget, measures the process beside its weights "
        "— anonymous memory, mapped file pages, a pass's activations, KV cache reserved, headroom — and spends the "
        "rest). *layerfit-budget* rows are plain budgets at the same limit, each chosen by: *memory limit* (the "
        f"budget the layerfit row chose, run plainly), *F rule* (the earlier runs' rule: limit − F_anon − "
        f"{FILE_ROOM / 1e6:.0f} MB, with F_anon a child's peak anonymous memory beside its weights at the minimum "
        f"budget, no limit), and *sweep* ({data['sweep']} budgets evenly above the minimum budget up to the limit "
        "less the smallest footprint measured, F_anon, and at most the weights). The plain budgets run in ascending "
        "order; once one is killed for memory or stalls (past "
        f"{SWEEP_TIMEOUT_FACTOR}× the slowest peer child's time, {SWEEP_TIMEOUT_MIN} s at least), the larger ones do "
        "not run in that round (a row says so). The best hand-chosen budget is the fastest plain budget that "
        f"completed; goal: layerfit within the limit at most {GOAL_VS_SWEEP}× its step. "
        "Limits run from layerfit's own need (its minimum weight budget + its footprint F, both as a child within "
        f"a roomy memory limit (the weights + {ROOMY / 1e9:.0f} GB) reported them) to the weights + F, each "
        f"{NEED_MARGIN - 1:.0%} above (the measure varies by a few MB from one process to the next); the model "
        f"*fits* a limit where the mmap peer's steps read less than {FITS_READ_SHARE:.0%} of its weights from the "
        "disk. A child killed for memory is a row saying so. *disk read per step* is "
        "what the child read from the disk (`/proc/self/io`), library pages read again included; *layerfit read "
        "per step* is what the engine read (its timeline, one more traced step).",
        "",
        "Disk read bandwidth with O_DIRECT (the largest prepared weights file read whole into a pre-faulted buffer, "
        f"at the start and at the end of the run): {bw}. *bound*: max(bytes layerfit read in a step ÷ the highest "
        "of these, the step's time with every weight preloaded, from the row that ran `preload`); *÷ bound at the "
        "minute's rate*: the same with the rate of the model's own weights file read whole (8 MiB reads) just before "
        "the child ran (the disk's rate moves from minute to minute on this machine).",
        "",
        "llama.cpp: " + (f"llama-cpp-python {lc['llama_cpp_python']}, gguf {lc['gguf']}, run in its own virtual "
                         "environment." if lc["available"] else lc["note"]),
    ]
    for name, model in data["models"].items():
        run = model["footprint_run"]
        target = "met" if model["target_3x_met"] else "not met"
        where = "; ".join(f"{mb(x['limit_bytes'])} MB: {number(x['vs_layerfit'])}× (mmap read "
                          f"{number(x['read_vs_layerfit'])}× layerfit's bytes; the most this budget allows: "
                          f"{number(x.get('ceiling'))}×, any reader: {number(x.get('any_reader_ceiling'))}×)"
                          for x in model["short_limits"])
        reachable = [x for x in model["short_limits"] if (x.get("any_reader_ceiling") or 0) >= 3.0]
        missed = [x for x in reachable if x["vs_layerfit"] < 3.0]
        verdict = (
            "no limit where it does not fit lets any reader reach 3×" if not reachable else
            "met at every limit where any reader could reach it" if not missed else
            "not met at " + ", ".join(
                f"{mb(x['limit_bytes'])} MB (layerfit {number(x['layerfit_over_any_reader_bound'])}× that bound)"
                for x in missed)
        ) if "pass_bytes" in model else None
        lines += [
            "",
            f"## {name}: {mb(model['weights_bytes'])} MB of weights, {model['units']} units, largest "
            f"{mb(model['largest_unit_bytes'])} MB; layerfit's minimum budget {mb(model['minimum_weight_bytes'])} MB, "
            f"F = {mb(model['footprint_bytes'])} MB (within a limit of {mb(run['memory_limit_bytes'])} MB: "
            f"{run['footprint_describe']}); F_anon = {mb(model['anon_footprint_bytes'])} MB; a layerfit step touched "
            f"at most {mb(model['file_pages_per_step_bytes'])} MB of file pages",
            "",
            f"layerfit within the limit against the best hand-chosen budget (goal: at most {GOAL_VS_SWEEP}×): "
            f"{'met' if model['sweep_goal_met'] else 'not met'}.",
            "",
            "The first pass is beside the step: a plain budget runs without the page-out of the libraries "
            "memory_limit does, and one near the edge of the limit reads its library pages again and again "
            "before its steps settle (*first pass read*: what the disk gave it).",
            "",
            "| limit (MB) | memory_limit's budget (MB) | its step (ms) | best hand-chosen budget (MB) | chosen by | "
            "its step (ms) | memory_limit ÷ best | first pass (s): memory_limit / best | best's first pass read (MB) "
            "| plain budgets completed / failed / not run |",
            "|---:|---:|---:|---:|---|---:|---:|---|---:|---|",
            *(f"| {mb(x['limit_bytes'])} | {mb(x['budget_bytes'])} | "
              + (f"{x['step_s'] * 1e3:.1f}" if x["completed"] else "killed by the OOM killer" if x.get("oom_kills")
                 else f"failed: {x['error']}")
              + f" | {mb(x['best_budget_bytes'])} | {x['best_chosen_by'] or '-'} | "
              + ("-" if x["best_step_s"] is None else f"{x['best_step_s'] * 1e3:.1f}")
              + f" | {number(x['ratio'])} | "
              + ("-" if x["first_s"] is None or x["best_first_s"] is None else f"{x['first_s']:.2f} / {x['best_first_s']:.2f}")
              + f" | {mb(x['best_first_read_bytes'])}"
              + f" | {x['budgets_completed']} / {x['budgets_failed']} / {x['budgets_not_run']} |"
              for x in model["vs_sweep"]),
            "",
            f"Target (layerfit ≥ 3× faster per step than mmap at every limit where the model does not fit): {target}. "
            f"mmap's step ÷ layerfit's where it does not fit: {where}. *The most this budget allows* is mmap's "
            "step over layerfit's bound (its bytes read at the disk's best measured rate): layerfit's reader does "
            "no better at that budget. *Any reader* is mmap's step over the least time of any reader holding the "
            "same budget: what a step needs of the streamed weights (every unit but the embedding's rows, a "
            "token's share of routed experts) less the budget beside the resident tensors, read at the disk's "
            "best measured rate, and no less than the step preloaded."
            + (f" Where any reader could reach 3×: {verdict}." if verdict else "")
            + (f" {model['gguf_note']}" if model.get("gguf_note") else ""),
            "",
            "| limit (MB) | weights ÷ (limit − F) | configuration | budget (MB) | chosen by | ran | load (s) | first pass "
            "(ms) | step (ms) | step ÷ layerfit's | disk read per step (MB) | layerfit read per step (MB) | step ÷ "
            "bound | ÷ bound at the minute's rate | cgroup peak (MB) | anonymous peak (MB) | load average | "
            "outputs equal |",
            "|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        order = {"mmap": 0, "layerfit": 1, "layerfit-budget": 2, "llamacpp": 3}
        for r in sorted(model["rows"], key=lambda r: (r["limit_bytes"], order[r["config"]], r.get("budget_bytes") or 0)):
            room = r["limit_bytes"] - model["footprint_bytes"]
            head = (f"| {mb(r['limit_bytes'])} | {model['weights_bytes'] / room if room > 0 else math.inf:.2f} "
                    f"| {r['config']} | {mb(r['budget_bytes'])} | "
                    f"{r.get('chosen_by') or ('memory limit' if r['config'] == 'layerfit' else '-')} |")
            if r.get("returncode") != 0:
                why = ("killed by the OOM killer" if r.get("oom_kills") else "not run" if r.get("not_run")
                       else f"failed: {r.get('error')}")
                lines.append(f"{head} {why} | | | | | | | | | {mb(r.get('cgroup_peak_bytes'))} | | "
                             f"{r['load_average_1m']:.1f} | |")
                continue
            equal = "yes" if r["outputs_equal"] else "no"
            if r["config"] == "llamacpp":
                equal = (f"no: max abs diff {r['max_abs_diff']:.1e} (logits up to {r['reference_max_abs']:.1f}), "
                         f"argmax {'equal' if r['argmax_equal'] else 'differs'}")
            lines.append(
                f"{head} {r.get('policy', '-')} | {r['load_s']:.1f} | {r['first_s'] * 1e3:.0f} | "
                f"{r['step_s'] * 1e3:.1f} | {number(r.get('vs_layerfit'))} | {mb(r['step_read_bytes'])} | "
                f"{mb(r.get('engine_read_per_step_bytes'))} | {number(r.get('step_over_bound'))} | "
                f"{number(r.get('step_over_minute_bound'))} | "
                f"{mb(r['cgroup_peak_bytes'])} | {mb(r['anon_peak_bytes'])} | {r['load_average_1m']:.1f} | {equal} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    p.add_argument("--models", default=f"{','.join(DEFAULT_MODELS)},{CNN}",
                   help=f"of {', '.join([*DECODERS, CNN])}")
    p.add_argument("--limits", type=int, default=5, help="memory limits per model (at least 2)")
    p.add_argument("--steps", type=int, default=8, help=f"cached decode steps (below {GENERATED})")
    p.add_argument("--cnn-passes", type=int, default=4, help="passes of the CNN after its first")
    p.add_argument("--sweep", type=int, default=SWEEP,
                   help="hand-chosen budgets spread at each limit, beside the memory limit's and the F rule's (0: those two)")
    p.add_argument("--rounds", type=int, default=2, help="runs of each configuration at each limit; the fastest is shown")
    p.add_argument("--llamacpp-python", type=Path, default=LLAMACPP_PYTHON,
                   help="the interpreter of a virtual environment with llama-cpp-python and gguf")
    p.add_argument("--output", default="vs_mmap")
    p.add_argument("--no-read-ahead", action="store_true",
                   help="layerfit without the read-ahead across passes (read_ahead=False; write to another --output)")
    p.add_argument("--system-torch", action="store_true",
                   help="children import the installed torch, whose library pages this process shares (they are "
                   "then never paged out of the children, and a memory limit's footprint counts them)")
    p.add_argument("--markdown-only", action="store_true",
                   help="write the Markdown again from the JSON of an earlier run (its summaries recomputed)")
    args = p.parse_args(argv)
    if args.child:
        from memory_limits import AnonPeak

        sampler = AnonPeak()
        side, rest = args.child[0], args.child[1:]
        if side == "gguf":
            result = child_gguf(Path(rest[0]))
        else:
            name, work, passes, options = rest[0], Path(rest[1]), int(rest[2]), rest[3:]
            if side.startswith("layerfit"):  # options: budget=N, memory-limit=N, no-read-ahead
                given = dict(o.partition("=")[::2] for o in options)
                result = child_layerfit(
                    name, work, passes, int(given["budget"]) if "budget" in given else None,
                    read_ahead="no-read-ahead" not in given,
                    memory_limit=int(given["memory-limit"]) if "memory-limit" in given else None)
            else:
                result = {"mmap": child_mmap, "llamacpp": child_llamacpp}[side](name, work, passes)
        print(json.dumps({**result, "anon_peak_bytes": sampler.peak_now()}))
        return 0
    if not 1 <= args.steps < GENERATED or args.limits < 2 or args.cnn_passes < 1 or args.rounds < 1 or args.sweep < 0:
        p.error(f"--steps must be 1..{GENERATED - 1}, --limits at least 2, --cnn-passes and --rounds at least 1, "
                "--sweep at least 0")
    sys.path.insert(0, str(BENCH))
    from reporting import RESULTS, write_results

    if args.markdown_only:
        data = json.loads((RESULTS / f"{args.output}.json").read_text())
        if "sweep" not in data:
            p.error(f"{args.output}.json predates layerfit's memory-limit rows (its layerfit ran at B = limit - F): "
                    "write its Markdown with the bench of its commit (git log bench/results)")
        for name, model in data["models"].items():  # a run before pass_bytes was recorded
            model.setdefault("pass_bytes", prepared(name, CACHE / name)["pass_bytes"])
        derive(data)
        js, md = write_results(args.output, data, markdown(data))
        print(f"wrote {js} and {md} from the measurements in {js}")
        return 0

    t_start = time.perf_counter()
    names = args.models.split(",")
    unknown = [n for n in names if n not in DECODERS and n != CNN]
    if unknown:
        p.error(f"unknown models {unknown}: use {', '.join([*DECODERS, CNN])}")
    llamacpp = llamacpp_status(args.llamacpp_python)
    print("llama.cpp:", llamacpp, flush=True)
    copy = None
    if not args.system_torch:  # this process maps torch's libraries: the children map a copy
        from memory_limits import private_torch

        CACHE.mkdir(parents=True, exist_ok=True)
        copy = private_torch(CACHE)
        os.environ["PYTHONPATH"] = os.pathsep.join([str(copy), *filter(None, [os.environ.get("PYTHONPATH")])])
    try:
        return run_all(args, names, llamacpp, t_start)
    finally:
        if copy is not None:
            shutil.rmtree(copy, ignore_errors=True)


def run_all(args: argparse.Namespace, names: list[str], llamacpp: dict[str, Any], t_start: float) -> int:
    """Every model at its limits, the disk's rate before and after; the results written."""
    from reporting import machine, write_results
    from storage import direct_read_once

    data: dict[str, Any] = {"machine": machine(), "steps": args.steps, "cnn_passes": args.cnn_passes, "rounds": args.rounds,
                            "sweep": args.sweep, "private_torch": not args.system_torch,
                            "read_ahead": not args.no_read_ahead,
                            "read_ahead_kb": read_ahead_kb(CACHE),
                            "prompt_tokens": PROMPT, "llamacpp": llamacpp, "bandwidth": [], "models": {}}
    infos = {name: prepared(name, CACHE / name) for name in names}
    largest = max(names, key=lambda n: infos[n]["weights_bytes"])
    weights_file = CACHE / largest / "prepared" / "weights.safetensors"
    data["bandwidth"] += [{**direct_read_once(weights_file, c), "when": "start"} for c in BANDWIDTH_CHUNKS]
    for name in names:
        data["models"][name] = run_model(name, infos[name], args, llamacpp)
    data["bandwidth"] += [{**direct_read_once(weights_file, c), "when": "end"} for c in BANDWIDTH_CHUNKS]
    derive(data)
    data["wall_s"] = time.perf_counter() - t_start
    js, md = write_results(args.output, data, markdown(data))
    print(f"wrote {js} and {md} in {data['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
