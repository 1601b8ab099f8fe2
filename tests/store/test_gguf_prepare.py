"""``prepare gguf:FILE``: a GGUF file stored as its blocks, run bit-equal to transformers' GGUF model.

The oracle is ``AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)``: layerfit
dequantizes each streamed weight from the blocks it stored to exactly the values that
loader gives, so logits and greedy tokens are equal to the bit. Files are written in the
test (:mod:`tests.gguf_models`), tiny, one per architecture and type.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gguf_models as G  # noqa: E402

import layerfit  # noqa: E402
from layerfit.cli import main  # noqa: E402
from layerfit.errors import InputError, LayerfitError, ManifestError  # noqa: E402
from layerfit.store import prepare  # noqa: E402
from layerfit.store.hf_folder import HFOptions  # noqa: E402
from layerfit.store.manifest import read_manifest  # noqa: E402

FIXED = HFOptions(variable_shapes=False, seq_len=8)


def _prepared(tmp_path: Path, arch: str, kind: str) -> tuple[Path, Path]:
    gguf = G.write_gguf(arch, tmp_path / f"{arch}.{kind}.gguf", ggml_type=kind)
    out = tmp_path / "prepared"
    prepare(f"gguf:{gguf}", out, hf=FIXED)
    return gguf, out


def _ids(vocab: int, length: int = 12) -> torch.Tensor:
    return torch.randint(3, vocab, (1, length), generator=torch.Generator().manual_seed(0))


def _check_equal(gguf: Path, out: Path, budget: str = "50%") -> None:
    reference, _ = G.load_gguf(gguf)
    ids = _ids(reference.config.vocab_size)
    with layerfit.from_pretrained(out, budget=budget, dequantize=True) as model, torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
        ours = model.generate(ids, max_new_tokens=6, do_sample=False)
        theirs = reference.generate(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(ours, theirs)


def _stored_ratio(gguf: Path, out: Path) -> float:
    """The prepared tensors' bytes over the GGUF file's. Alignment padding (up to a page
    a unit) is left out: it is a large share of a tiny test model, none of a real one."""
    manifest = read_manifest(out)
    segments = ((manifest.resident,) if manifest.resident else ()) + manifest.units
    return sum(s.payload_bytes for s in segments) / gguf.stat().st_size


@pytest.mark.parametrize("arch", G.ARCHS)
def test_each_architecture_prepares_as_blocks_and_runs_bit_equal(tmp_path: Path, arch: str):
    gguf, out = _prepared(tmp_path, arch, "Q4_K")
    manifest = read_manifest(out)
    assert manifest.quantized
    assert _stored_ratio(gguf, out) <= 1.3
    _check_equal(gguf, out)


@pytest.mark.parametrize("kind", G.GGML_TYPES)
def test_each_type_prepares_as_blocks_and_runs_bit_equal(tmp_path: Path, kind: str):
    gguf, out = _prepared(tmp_path, "llama", kind)
    encodings = {t.encoding.ggml for s in read_manifest(out).segments for t in s.tensors if t.encoding}
    assert encodings == (set() if kind == "F32" else {kind})
    if kind != "F32":  # an F32 file is stored as transformers makes it: as large as the file
        assert _stored_ratio(gguf, out) <= 1.3
    _check_equal(gguf, out, budget="30%")


@pytest.mark.compat  # the gguf extra's range: transformers' GGUF loader and gguf on each leg's wheel
def test_both_modes_on_each_installed_wheel(tmp_path: Path):
    """Bit-equal dequantized, and packed close to it (int4 where the torch has the CPU
    kernels, 2.6 on; bf16 below)."""
    gguf, out = _prepared(tmp_path, "llama", "Q4_0")
    _check_equal(gguf, out)
    ids = _ids(400)
    with layerfit.from_pretrained(out, dequantize=True) as exact, layerfit.from_pretrained(out) as packed, \
            torch.no_grad():
        want, got = exact(ids).logits, packed(ids).logits
    assert (got - want).abs().max() <= 0.02 * (want.max() - want.min())


def test_the_prepared_folder_carries_the_files_tokenizer_and_config(tmp_path: Path):
    gguf, out = _prepared(tmp_path, "llama", "Q8_0")
    _, tokenizer = G.load_gguf(gguf)
    with layerfit.from_pretrained(out) as model:
        assert model.tokenizer("hello world").input_ids == tokenizer("hello world").input_ids
        assert model.config.num_hidden_layers == json.loads((out / "config.json").read_text())["num_hidden_layers"]


def test_from_pretrained_prepares_a_gguf_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LAYERFIT_CACHE", str(tmp_path / "cache"))
    gguf = G.write_gguf("qwen2", tmp_path / "m.gguf", ggml_type="Q4_0")
    with layerfit.from_pretrained(gguf, budget="40%", hf=FIXED) as first:
        directory = first.directory
    with layerfit.from_pretrained(str(gguf), hf=FIXED) as second:
        assert second.directory == directory
        assert read_manifest(directory).quantized


def test_the_command_line_prepares_and_generates(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    gguf = G.write_gguf("llama", tmp_path / "m.gguf", ggml_type="Q4_1")
    out = tmp_path / "prepared"
    assert main(["prepare", f"gguf:{gguf}", "-o", str(out), "--fixed-shape", "--seq-len", "8", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["weights_bytes"] <= 1.3 * gguf.stat().st_size
    capsys.readouterr()
    assert main(["generate", str(out), "--prompt", "hello", "--max-new-tokens", "4", "--json", "--dequantize"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["new_tokens"] >= 1 and "read_bytes_per_token" in report


@pytest.mark.parametrize("dequantize", [True, False])
def test_a_bound_quantized_unit_counts_the_bytes_binding_makes(tmp_path: Path, dequantize: bool):
    """Dequantized, a streamed unit's values are made beside the read buffer and counted
    while bound; packed, a streamed unit makes nothing: its Q4 weights are views of the
    buffer, and a weight computed in bf16 (Q8_0 here) stays blocks, dequantized by rows in
    each product, with the bits the held weight gives."""
    from layerfit.engine.int4_packed import BlockRows

    _, out = _prepared(tmp_path, "llama", "Q8_0")
    ids = _ids(400)
    seen: list[object] = []
    with layerfit.from_pretrained(out, budget="30%", pipeline="sync", dequantize=dequantize) as model, \
            torch.no_grad():
        head = model.engine.model.lm_head
        head.register_forward_pre_hook(lambda module, args: seen.append(getattr(module.weight, "operand", None)))
        streamed = model(ids).logits
        assert (model.engine.binder.peak_bytes > 0) == dequantize
    assert isinstance(seen[0], BlockRows) != dequantize
    with layerfit.from_pretrained(out, budget="100%", dequantize=dequantize) as model, torch.no_grad():
        assert torch.equal(model(ids).logits, streamed)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q4_K", "Q8_0", "Q6_K"])
def test_packed_runs_close_to_the_dequantized_model(tmp_path: Path, kind: str):
    """The default: linear layers on int4 (Q4 types) or bf16 kernels. Its tolerance (the
    bf16 product's, :mod:`layerfit.engine.int4_packed`): logits within 2 % of their range
    and the same greedy tokens on this tiny model."""
    _, out = _prepared(tmp_path, "llama", kind)
    ids = _ids(400)
    with layerfit.from_pretrained(out, budget="40%", dequantize=True) as exact, torch.no_grad():
        want = exact(ids).logits
        want_tokens = exact.generate(ids, max_new_tokens=8, do_sample=False)
    with layerfit.from_pretrained(out, budget="40%") as packed, torch.no_grad():
        got = packed(ids).logits
        got_tokens = packed.generate(ids, max_new_tokens=8, do_sample=False)
    assert not torch.equal(got, want)  # it did run packed
    assert (got - want).abs().max() <= 0.02 * (want.max() - want.min())
    assert torch.equal(got_tokens, want_tokens)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_K"])
def test_q4_linear_weights_are_stored_for_the_int4_kernel_and_bound_as_they_lie(
    tmp_path: Path, kind: str, monkeypatch: pytest.MonkeyPatch
):
    """A linear layer's Q4 weight is stored re-expressed (:mod:`layerfit.store.int4_form`):
    bound packed on this CPU it is a view of the read buffer (no byte made); a folder
    prepared for another CPU's layout runs the same (its blocks rebuilt and packed here)."""
    from layerfit.engine.int4_packed import PackedInt4, PackedLinear, PackedWeight, cpu_block_rows

    if cpu_block_rows() is None:
        pytest.skip("this torch has no int4 packing op of a known layout")
    gguf, out = _prepared(tmp_path, "llama", kind)
    tensors = [t for u in read_manifest(out).units for t in u.tensors]
    assert {t.name for t in tensors if t.encoding and t.encoding.int4_rows} >= {
        t.name for t in tensors if t.name.endswith(("q_proj.weight", "gate_proj.weight", "down_proj.weight"))
    }
    ids = _ids(400)
    with layerfit.from_pretrained(out, budget="100%") as native, torch.no_grad():
        want = native(ids).logits
        weight = native.engine.model.model.layers[0].mlp.gate_proj.weight
        assert isinstance(weight, PackedWeight) and isinstance(weight.operand, PackedInt4)
        assert weight.operand.packed.untyped_storage().nbytes() > weight.operand.nbytes  # the read buffer's
        assert type(native.engine.model.model.layers[0].mlp.gate_proj) is PackedLinear  # calls the kernel itself
    monkeypatch.setattr("layerfit.store.int4_form.form_rows", lambda: 32 if cpu_block_rows() != 32 else 64)
    other = tmp_path / "other-layout"
    prepare(f"gguf:{gguf}", other, hf=FIXED)
    assert {t.encoding.int4_rows for u in read_manifest(other).units for t in u.tensors if t.encoding} - {0} != {
        cpu_block_rows()
    }
    with layerfit.from_pretrained(other, budget="100%") as foreign, torch.no_grad():
        assert torch.equal(foreign(ids).logits, want)


# --- bad input: one line naming the file, nothing written --------------------------------


def _refused(capsys: pytest.CaptureFixture[str], model: str, out: Path, *needles: str) -> str:
    capsys.readouterr()
    assert main(["prepare", model, "-o", str(out), "--fixed-shape"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
    return err


def _tiny_metadata(arch: str = "llama") -> dict:
    model = G.tiny_hf_model(arch)
    spec = G._ARCHS[arch]
    return {"general.architecture": spec.gguf_arch, **G.config_metadata(arch, model.config),
            **G.tokenizer_metadata(spec.tokenizer)}


def test_an_unsupported_type_is_refused_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    raw = torch.zeros(256 // 32 * 18, dtype=torch.uint8).numpy().reshape(1, -1)  # one IQ4_NL row of 256
    gguf = G.write_raw_gguf(tmp_path / "iq.gguf", {"token_embd.weight": (raw, "IQ4_NL")}, _tiny_metadata())
    _refused(capsys, f"gguf:{gguf}", tmp_path / "out", str(gguf), "IQ4_NL", "token_embd.weight")


def test_a_file_without_a_tokenizer_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    metadata = {k: v for k, v in _tiny_metadata().items() if not k.startswith("tokenizer.")}
    gguf = G.write_raw_gguf(tmp_path / "notok.gguf", {"x.weight": torch.zeros(2, 32).numpy()}, metadata)
    _refused(capsys, f"gguf:{gguf}", tmp_path / "out", str(gguf), "holds no tokenizer")


def test_an_architecture_transformers_cannot_build_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    metadata = {**_tiny_metadata(), "general.architecture": "rwkv7"}
    gguf = G.write_raw_gguf(tmp_path / "rwkv.gguf", {"x.weight": torch.zeros(2, 32).numpy()}, metadata)
    _refused(capsys, f"gguf:{gguf}", tmp_path / "out", str(gguf), "'rwkv7'", "does not build")


def test_a_truncated_file_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    gguf = G.write_gguf("llama", tmp_path / "m.gguf", ggml_type="Q8_0")
    data = gguf.read_bytes()
    gguf.write_bytes(data[: len(data) // 2])
    _refused(capsys, str(gguf), tmp_path / "out", str(gguf))


def test_a_manifest_whose_blocks_do_not_add_up_is_refused(tmp_path: Path):
    _, out = _prepared(tmp_path, "llama", "Q4_0")
    data = json.loads((out / "manifest.json").read_text())
    tensor = next(t for u in data["units"] for t in u["tensors"] if "encoding" in t)
    tensor["encoding"]["ggml"] = "Q8_0"  # the same bytes cannot be Q8_0 blocks of that shape
    (out / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="Q8_0"):
        read_manifest(out)
    tensor["encoding"]["ggml"] = "IQ2_XS"
    (out / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match="IQ2_XS"):
        read_manifest(out)


def test_an_older_format_version_with_blocks_is_refused(tmp_path: Path):
    _, out = _prepared(tmp_path, "llama", "Q4_0")
    data = json.loads((out / "manifest.json").read_text())
    assert data["version"] == 3
    data["version"] = 1
    (out / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(LayerfitError, match="version"):
        read_manifest(out)


def test_dtype_is_refused_for_a_gguf_file(tmp_path: Path):
    gguf = G.write_gguf("llama", tmp_path / "m.gguf", ggml_type="Q4_0")
    with pytest.raises(InputError, match="--dtype"):
        prepare(f"gguf:{gguf}", tmp_path / "out", hf=HFOptions(dtype="float16"))


def test_a_decoded_token_reads_the_streamed_units_quantized_bytes(tmp_path: Path):
    """Every unit streamed each token (sync in two buffers of the largest unit): what a decode
    step reads is the quantized bytes of those units as stored, not their floats."""
    _, out = _prepared(tmp_path, "qwen2", "Q4_0")
    manifest = read_manifest(out)
    streamed = sum(u.nbytes for u in manifest.units)
    assert streamed < sum(t.bound_nbytes for u in manifest.units for t in u.tensors) / 3  # blocks, not floats
    budget = manifest.resident_bytes + 2 * manifest.largest_unit_bytes  # sync: two buffers, nothing kept
    with layerfit.from_pretrained(out, budget=budget, pipeline="sync", gather_rows=False) as model, torch.no_grad():
        past = model(_ids(model.config.vocab_size, 4), use_cache=True).past_key_values
        steps = []
        for token in (5, 6, 7):
            before = model.engine.bytes_read
            past = model(torch.tensor([[token]]), past_key_values=past, use_cache=True).past_key_values
            steps.append(model.engine.bytes_read - before)
    assert steps == [pytest.approx(streamed, rel=0.05)] * 3


@pytest.mark.parametrize(("dequantize", "pipeline"), [(False, "sync"), (False, "async"), (True, "async")])
def test_a_verified_int4_unit_is_read_without_its_blocks_heads(tmp_path: Path, dequantize: bool, pipeline: str):
    """The int4 form stores the blocks' heads after the kernel's operands, for
    ``--dequantize`` (and a CPU of another layout) to rebuild the blocks from. Packed, the
    binding never reads them, so once a unit's first read has verified it whole, later passes
    read it only as far as its operands (in whole pages): fewer bytes, the same logits as
    every weight held (async: units read together split their request where one is read
    short; no read-ahead, which would count the next pass's first reads in this one).
    Dequantized, the heads are needed and every pass reads them."""
    from layerfit.engine.int4_packed import form_binds_views
    from layerfit.store.manifest import ALIGN

    _, out = _prepared(tmp_path, "llama", "Q4_1")
    manifest = read_manifest(out)
    forms = [t for u in manifest.units for t in u.tensors if t.encoding is not None and t.encoding.int4_rows]
    assert forms and all(form_binds_views(t.encoding.int4_rows) for t in forms)
    operands = [-(-(n * k // 2 + n * k // 32 * 4) // ALIGN) * ALIGN for t in forms for n, k in [t.shape]]
    heads = 0 if dequantize else sum(t.nbytes - o for t, o in zip(forms, operands, strict=True))
    assert dequantize or heads >= len(forms) * ALIGN
    whole = sum(u.nbytes for u in manifest.units)
    ids = _ids(400, 8)
    budget = manifest.resident_bytes + 2 * manifest.largest_unit_bytes  # every unit streamed
    with layerfit.from_pretrained(out, budget="100%", dequantize=dequantize) as model, torch.no_grad():
        want = model(ids).logits
    with layerfit.from_pretrained(out, budget=budget, pipeline=pipeline, gather_rows=False, read_ahead=False,
                                  dequantize=dequantize) as model, torch.no_grad():
        reads, logits = [], []
        for _ in range(3):
            before = model.engine.bytes_read
            logits.append(model(ids).logits)
            reads.append(model.engine.bytes_read - before)
            model.engine.trace = True  # its timeline's reads are the bytes read too
        traced = sum(e.nbytes for e in model.engine.last_timeline.events if e.stage == "read")
    assert reads == [whole, whole - heads, whole - heads] and traced == whole - heads
    assert all(torch.equal(x, want) for x in logits)


def _rows_product(kind: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The product a packed output layer of `kind` runs, part by part (Q8_0: blocks
    dequantized by rows; Q6_K: its form's stripes on the int4 kernel), set to go 32 rows a
    part (a stripe's rows are the form's: set before it is prepared); its name in
    :mod:`layerfit.engine.int4_packed`."""
    from layerfit.engine import int4_packed
    from layerfit.store import q6k_form

    monkeypatch.setattr(int4_packed, "ROWS_ELEMENTS", 32 * 256)
    monkeypatch.setattr(q6k_form, "STRIPE_ELEMENTS", 32 * 256)
    return "q6k_linear" if kind == "Q6_K" else "block_rows_linear"


def _operand_bytes(weight: object) -> int:
    return weight.form.numel() if hasattr(weight, "form") else weight.blocks.numel()


@pytest.mark.parametrize("kind", ["Q8_0", "Q6_K"])
def test_the_last_streamed_unit_gives_its_place_back_as_its_rows_are_used(tmp_path: Path, monkeypatch, kind: str):
    """Packed, an output layer streamed for a pass is multiplied a few rows at a time (Q8_0:
    blocks dequantized by rows; Q6_K: its form's stripes); as the last unit of the pass it
    gives each page of rows back once used, and the next pass's first units are read into
    them while it still runs (where otherwise nothing is read until it ends). The tokens are
    those of every weight held, also after a pass whose product failed midway with units
    read ahead into the pages it gave back."""
    from layerfit.engine import int4_packed

    name = _rows_product(kind, monkeypatch)  # many pages given back
    _, out = _prepared(tmp_path, "llama", kind)
    manifest = read_manifest(out)
    assert manifest.units[-1].name == "lm_head" and manifest.units[-1].nbytes == manifest.largest_unit_bytes
    ids = _ids(400, 4)
    with layerfit.from_pretrained(out, budget="100%") as model, torch.no_grad():
        want = model.generate(ids, max_new_tokens=6, do_sample=False)
    product, began = getattr(int4_packed, name), []
    head = manifest.units[-1].tensors[0].shape
    failing = {"at": None}

    def observed(x: torch.Tensor, weight: int4_packed.BlockRows | int4_packed.Q6KStripes) -> torch.Tensor:
        if weight.shape != head:  # (the layers' weights are multiplied by rows too)
            return product(x, weight)
        if len(began) == failing["at"]:
            failing["at"] = None
            weight.used(_operand_bytes(weight) // 2)  # half given back, read into, then it fails
            deadline = time.monotonic() + 10
            while not engine.stream.read_ahead.current.read and time.monotonic() < deadline:
                time.sleep(0.001)
            raise RuntimeError("the product failed midway")
        y = product(x, weight)
        began.append(engine.stream.read_ahead.current is not None)
        return y

    monkeypatch.setattr(int4_packed, name, observed)
    # A buffer of two heads: the head's first pages hold the rows the next prompt may look up
    # (this tiny table is nearly the head's size) before the next units fit.
    budget = manifest.resident_bytes + 2 * manifest.largest_unit_bytes
    with layerfit.from_pretrained(out, budget=budget, pipeline="async") as model, torch.no_grad():
        engine = model.engine
        assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), want)
        assert len(began) == 6 and all(began)
        assert engine.stream.reader.output.read_ahead_bytes > 0
        failing["at"] = len(began) + 2  # the third step's
        with pytest.raises(RuntimeError, match="failed midway"):
            model.generate(ids, max_new_tokens=6, do_sample=False)
        assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), want)


@pytest.mark.parametrize("kind", ["Q8_0", "Q6_K"])
def test_the_last_streamed_unit_is_multiplied_as_its_rows_are_read(tmp_path: Path, monkeypatch, kind: str):
    """Once verified, the pass's last streamed unit (the output layer, multiplied by rows:
    Q8_0 blocks or a Q6_K form's stripes) is handed to the kernels after its first part is
    read: its product starts while the rest is read, and multiplies no row before it has
    arrived (the rest of its place holds garbage until then). The tokens are those of every weight held; a read failing
    midway is raised in one line, and the next pass reads the unit again."""
    from layerfit.engine import int4_packed, reader, stream
    from layerfit.engine.unit_reader import UnitReader
    from layerfit.errors import ReadError

    name = _rows_product(kind, monkeypatch)
    monkeypatch.setattr(reader, "PART_BYTES", 4096)  # a page a part: the head comes in several
    _, out = _prepared(tmp_path, "llama", kind)
    manifest = read_manifest(out)
    head = manifest.units[-1]
    assert head.name == "lm_head" and head.nbytes > 3 * 4096
    ids = _ids(400, 4)
    with layerfit.from_pretrained(out, budget="100%") as model, torch.no_grad():
        want = model.generate(ids, max_new_tokens=6, do_sample=False)
    part, product = UnitReader.read_part, getattr(int4_packed, name)
    seen = {"parts": 0, "handed_early": 0, "fail_at": None}

    def slow_part(self: UnitReader, i: int, start: int, stop: int, into: memoryview) -> None:
        if start == 0:  # what is not read yet is garbage: a product that did not wait sees it
            into[stop : self.blocks[i].nbytes] = b"\xff" * (self.blocks[i].nbytes - stop)
        else:
            time.sleep(0.005)  # the kernels run meanwhile
        seen["parts"] += 1
        if seen["parts"] == seen["fail_at"]:
            raise ReadError("reading unit (lm_head) failed: the disk went away")
        part(self, i, start, stop, into)

    def observed(x: torch.Tensor, weight: int4_packed.BlockRows | int4_packed.Q6KStripes) -> torch.Tensor:
        if weight.shape == tuple(head.tensors[0].shape):
            seen["handed_early"] += weight.arrived is not None
        return product(x, weight)

    monkeypatch.setattr(UnitReader, "read_part", slow_part)
    monkeypatch.setattr(int4_packed, name, observed)
    budget = manifest.resident_bytes + 2 * manifest.largest_unit_bytes
    with layerfit.from_pretrained(out, budget=budget, pipeline="async") as model, torch.no_grad():
        assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), want)
        assert seen["parts"] >= 5 * 3 and seen["handed_early"] == 5  # every step but the first (verifying) read
        seen["fail_at"] = seen["parts"] + 2
        with pytest.raises(ReadError, match="the disk went away"):
            model.generate(ids, max_new_tokens=6, do_sample=False)
        assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), want)
        # Bound otherwise than its bindings predicted: its kernel waits for the whole unit.
        monkeypatch.setattr(stream, "_rows_operand", lambda bindings: None)
        early = seen["handed_early"]
        assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), want)
        assert seen["handed_early"] == early


def test_a_quantized_moe_reads_the_experts_its_router_chooses(tmp_path: Path):
    """Routed experts stored as blocks are read (and dequantized) by what the router
    chooses, as float experts are: bit-equal to transformers, fewer bytes than whole."""
    gguf, out = _prepared(tmp_path, "qwen3moe", "Q4_K")
    reference, _ = G.load_gguf(gguf)
    ids = _ids(reference.config.vocab_size, 4)
    with torch.no_grad():
        want = reference.generate(ids, max_new_tokens=6, do_sample=False)
    read = {}
    for routed in (True, False):
        with layerfit.from_pretrained(out, budget="60%", pipeline="async", dequantize=True, gather_rows=routed) as model:
            with torch.no_grad():
                assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False), want)
            read[routed] = model.engine.bytes_read
    assert read[True] < 0.8 * read[False]


def test_run_reports_the_bytes_a_pass_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    _, out = _prepared(tmp_path, "llama", "Q4_0")
    capsys.readouterr()
    assert main(["run", str(out), "--json", "--pipeline", "sync", "--budget", "60%"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["read_bytes_per_pass"] > 0
    assert report["read_bytes_per_token"] == pytest.approx(report["read_bytes_per_pass"] / 8)  # the 8 prepared ids


@pytest.mark.parametrize("dequantize", [True, False])
def test_under_a_memory_limit_what_held_units_make_counts_with_their_blocks(tmp_path: Path, dequantize: bool):
    """A GGUF model's units held for good make their values beside their stored blocks
    (4x them dequantized to float32): a memory limit leaves room for both (#55)."""
    from layerfit.engine.skeleton import segment_bindings
    from layerfit.memory_limit import process_memory

    _, out = _prepared(tmp_path, "llama", "Q4_0")
    manifest = read_manifest(out)
    # The first load in a process brings in what later ones reuse (its footprint measured
    # MBs more: room for every block and what they make, so the test failed when it ran
    # first); the second measures what the next load needs, to within tens of kB.
    for _ in range(2):
        probe = layerfit.load(out, dequantize=dequantize, memory_limit=process_memory().resident_bytes + 2**30)
        need = probe.footprint
        probe.close()
    # room for every block but not for what they make: held units' made bytes decide what fits
    limit = need.beside_weights_bytes + need.minimum_weight_bytes + manifest.total_bytes
    with layerfit.load(out, dequantize=dequantize, memory_limit=limit) as engine:
        footprint = engine.footprint
        engine(_ids(engine.model.config.vocab_size))
        assert engine.memory.weight_bytes <= footprint.weight_budget_bytes
        assert footprint.weight_budget_bytes + footprint.made_bytes + footprint.beside_weights_bytes == limit
        # the units held for good, with the values they make, fit what the limit left the weights
        # (a streamed unit's values are made and dropped one unit at a time, in the footprint)
        held = range(len(engine.blocks)) if engine.policy.resident else engine.kept_units
        made = sum(b.made_nbytes for i in held for seg in engine.blocks[i].segments
                   for b in segment_bindings(engine.model, seg, packed=not dequantize))
        assert engine.memory.weight_bytes + made <= footprint.weight_budget_bytes + footprint.made_bytes
        if dequantize:  # float32 values of a held Q4_0 weight: 7x its blocks, which all the blocks' room cannot hold
            assert footprint.made_bytes > 0
