"""The GGUF reader: files ``gguf.GGUFWriter`` writes read back as ``gguf.GGUFReader`` sees
them (metadata of every value type, tensors of every type), and files made to break it
(truncated anywhere, bytes flipped, counts and lengths huge, offsets overlapping or past
the end) each either read as a valid file or refused in one InputError line, never
another exception, never more than a few MB of memory, always fast."""

from __future__ import annotations

import math
import os
import struct
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from layerfit.errors import InputError
from layerfit.store.ggml_types import BY_NAME, SUPPORTED, TYPES, GGMLType
from layerfit.store.gguf_file import (
    MAX_METADATA_MEMORY,
    GGUFFile,
    read_gguf,
    read_tensor_into,
    tensor_bytes,
    unsupported_types,
)

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter  # noqa: E402
from gguf.quants import quantize  # noqa: E402

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), database=None)
FEW_MB = 4 * 2**20


# --- files written by gguf -------------------------------------------------------------

SCALARS: list[tuple[str, Any, GGUFValueType]] = [
    ("v.uint8", 255, GGUFValueType.UINT8),
    ("v.int8", -128, GGUFValueType.INT8),
    ("v.uint16", 65535, GGUFValueType.UINT16),
    ("v.int16", -32768, GGUFValueType.INT16),
    ("v.uint32", 2**32 - 1, GGUFValueType.UINT32),
    ("v.int32", -(2**31), GGUFValueType.INT32),
    ("v.float32", 0.25, GGUFValueType.FLOAT32),
    ("v.uint64", 2**64 - 1, GGUFValueType.UINT64),
    ("v.int64", -(2**63), GGUFValueType.INT64),
    ("v.float64", 0.1, GGUFValueType.FLOAT64),
    ("v.bool", True, GGUFValueType.BOOL),
    ("v.false", False, GGUFValueType.BOOL),
    ("v.string", "héllo ✓ 𝄞", GGUFValueType.STRING),
    ("v.empty", "", GGUFValueType.STRING),
]
ARRAYS: list[tuple[str, list[Any], GGUFValueType]] = [
    ("a.uint8", [0, 1, 255], GGUFValueType.UINT8),
    ("a.int16", [-1, 2, -3], GGUFValueType.INT16),
    ("a.uint32", [1, 2**32 - 1], GGUFValueType.UINT32),
    ("a.int32", [-5, 7], GGUFValueType.INT32),
    ("a.float32", [0.5, -1.25, 3.0], GGUFValueType.FLOAT32),
    ("a.uint64", [2**64 - 1, 0], GGUFValueType.UINT64),
    ("a.int64", [-(2**63), 2**63 - 1], GGUFValueType.INT64),
    ("a.float64", [0.1, 1e300], GGUFValueType.FLOAT64),
    ("a.bool", [True, False, True], GGUFValueType.BOOL),
    ("a.string", ["a", "", "ü b", "<0x0A>"], GGUFValueType.STRING),
]
NESTED = ("a.nested", [[1, 2], [3], [4, 5, 6]])


def write_with_gguf(path: Path, tensors: list[tuple[str, np.ndarray, GGMLQuantizationType | None]],
                    alignment: int | None = None, nested: bool = True) -> Path:
    """A file as gguf writes one: every value type, the given tensors."""
    w = GGUFWriter(path, "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for key, value, vtype in SCALARS:
        w.add_key_value(key, value, vtype)
    for key, values, vtype in ARRAYS:
        w.add_key_value(key, values, GGUFValueType.ARRAY, sub_type=vtype)
    if nested:
        w.add_array(*NESTED)
    for name, data, raw in tensors:
        w.add_tensor(name, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tensor_data(t: GGMLType, rows: int, blocks: int, rng: np.random.Generator) -> tuple[np.ndarray, GGMLQuantizationType | None]:
    """``rows`` rows of ``blocks`` blocks of type ``t``: quantized by gguf where it can,
    random bytes in the type's layout otherwise."""
    q = GGMLQuantizationType(t.type_id)
    cols = blocks * t.block_elems
    floats = rng.standard_normal((rows, cols)).astype(np.float32)
    native = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
              "I32": np.int32, "I64": np.int64}
    if t.name in native:
        return floats.astype(native[t.name]), None
    try:
        return quantize(floats, q), q
    except (NotImplementedError, gguf.quants.QuantError):
        raw = rng.integers(0, 256, size=(rows, blocks * t.block_bytes), dtype=np.uint8)
        return raw, q


def flat(value: Any) -> Any:
    """A nested list flattened, as GGUFReader's contents() gives it."""
    if isinstance(value, list) and value and isinstance(value[0], list):
        return [x for v in value for x in flat(v)]
    return value


def assert_same_as_gguf(f: GGUFFile, path: Path) -> None:
    """Our reading of ``path`` equals gguf's own: keys, values, tensors, data."""
    reader = GGUFReader(path)
    fields = {k: v for k, v in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(f.metadata) == list(fields)
    for key, value in f.metadata.items():
        theirs = fields[key].contents()
        assert flat(value) == theirs or repr(flat(value)) == repr(theirs), key  # repr: NaN is NaN
    assert f.data_offset == reader.data_offset and f.alignment == reader.alignment
    assert [t.name for t in f.tensors] == [t.name for t in reader.tensors]
    for ours, theirs in zip(f.tensors, reader.tensors, strict=True):
        assert ours.ggml_type.type_id == int(theirs.tensor_type)
        assert ours.shape == tuple(reversed(theirs.shape.tolist()))
        assert ours.offset == theirs.data_offset and ours.nbytes == theirs.n_bytes
        assert tensor_bytes(f, ours) == theirs.data.tobytes()


def test_every_value_type_reads_as_gguf_reads_it(tmp_path: Path) -> None:
    path = write_with_gguf(tmp_path / "m.gguf", [])
    f = read_gguf(path)
    assert f.version == 3 and f.alignment == 32 and f.tensors == ()
    assert f.metadata["general.architecture"] == "llama"
    for key, value, _ in [*SCALARS, *ARRAYS]:
        assert f.metadata[key] == value and type(f.metadata[key]) is type(value), key
    assert f.metadata[NESTED[0]] == NESTED[1]
    assert_same_as_gguf(f, path)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_every_tensor_type_reads_as_gguf_reads_it(tmp_path: Path, t: GGMLType) -> None:
    rng = np.random.default_rng(t.type_id)
    first, raw = tensor_data(t, 3, 2, rng)
    second, _ = tensor_data(t, 1, 1, rng)
    path = write_with_gguf(tmp_path / "m.gguf", [("blk.0.w", first, raw), ("blk.0.b", second, raw)], nested=False)
    f = read_gguf(path)
    assert [x.shape for x in f.tensors] == [(3, 2 * t.block_elems), (1, t.block_elems)]
    assert all(x.ggml_type == t for x in f.tensors)
    assert_same_as_gguf(f, path)
    assert unsupported_types(f) == ({} if t.name in SUPPORTED else {"blk.0.w": t.name, "blk.0.b": t.name})


def test_a_custom_alignment_and_reading_by_parts(tmp_path: Path) -> None:
    data = np.arange(4 * 64, dtype=np.float32).reshape(4, 64)
    path = write_with_gguf(tmp_path / "m.gguf", [("a", data, None), ("b", data[:1], None)], alignment=256)
    f = read_gguf(path)
    assert f.alignment == 256 and f.data_offset % 256 == 0 and all(t.offset % 256 == 0 for t in f.tensors)
    assert_same_as_gguf(f, path)
    a = f.tensor("a")
    out = bytearray(a.nbytes)
    for start in range(0, a.nbytes, 256):  # one row at a time, into the caller's buffer
        read_tensor_into(f, a, memoryview(out)[start : start + 256], start)
    assert bytes(out) == data.tobytes()
    with pytest.raises(ValueError):
        read_tensor_into(f, a, bytearray(8), a.nbytes - 4)
    with pytest.raises(KeyError):
        f.tensor("c")


def test_a_file_of_unsupported_types_still_reads(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    iq, raw = tensor_data(BY_NAME["IQ2_XXS"], 2, 1, rng)
    ok, _ = tensor_data(BY_NAME["F16"], 2, 8, rng)
    path = write_with_gguf(tmp_path / "m.gguf", [("tok_embd", ok, None), ("blk.0.ffn", iq, raw)])
    f = read_gguf(path)
    assert unsupported_types(f) == {"blk.0.ffn": "IQ2_XXS"}
    assert f.tensor("blk.0.ffn").shape == (2, 256)


def test_a_file_changed_after_reading_is_refused(tmp_path: Path) -> None:
    data = np.ones((2, 32), dtype=np.float32)
    path = write_with_gguf(tmp_path / "m.gguf", [("a", data, None)])
    f = read_gguf(path)
    stamp = path.stat()
    path.write_bytes(path.read_bytes().replace(data.tobytes(), bytes(data.nbytes)))  # same size, other bytes
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 10**9))
    with pytest.raises(InputError, match="changed while being read"):
        tensor_bytes(f, f.tensors[0])
    with open(path, "r+b") as fh:
        fh.truncate(f.tensors[0].offset + 8)
    with pytest.raises(InputError, match="changed while being read"):
        tensor_bytes(f, f.tensors[0])


# --- files built by hand ---------------------------------------------------------------

def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return u64(len(raw)) + raw


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return s(key) + u32(vtype) + payload


def ti(name: str | bytes, dims: list[int], type_id: int, offset: int) -> bytes:
    """A tensor info: ``dims`` in GGUF order (innermost first)."""
    return s(name) + u32(len(dims)) + b"".join(u64(d) for d in dims) + u32(type_id) + u64(offset)


def build(kvs: list[bytes], tis: list[bytes], data: bytes = b"", version: int = 3, alignment: int = 32,
          counts: tuple[int, int] | None = None) -> bytes:
    """A GGUF file from raw parts (``counts`` overrides the tensor and key counts)."""
    n_tensors, n_kvs = counts if counts is not None else (len(tis), len(kvs))
    head = b"GGUF" + u32(version) + u64(n_tensors) + u64(n_kvs) + b"".join(kvs) + b"".join(tis)
    return head + b"\0" * (-len(head) % alignment) + data


ARCH = kv("general.architecture", 8, s("llama"))
F32_2x32 = ti("w", [32, 2], 0, 0)


def refused(tmp_path: Path, content: bytes, *words: str) -> str:
    """The one line ``content`` is refused with, checked to name the file and ``words``."""
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(InputError) as info:
        read_gguf(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message, message
    for word in words:
        assert word in message, (word, message)
    return message


def test_a_minimal_hand_built_file_reads(tmp_path: Path) -> None:
    path = tmp_path / "ok.gguf"
    path.write_bytes(build([ARCH], [F32_2x32], bytes(256), version=2))
    f = read_gguf(path)
    assert f.version == 2 and f.tensors[0].shape == (2, 32) and f.tensors[0].nbytes == 256
    assert f.metadata == {"general.architecture": "llama"}


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"", ["not a GGUF file"]),
        (b"GGML" + bytes(40), ["not a GGUF file"]),
        (build([ARCH], [], version=1), ["version 1"]),
        (build([ARCH], [], version=7), ["version 7"]),
        (b"GGUF" + struct.pack(">I", 3) + bytes(16), ["big-endian"]),
        (build([], [], counts=(0, 2**60)), ["truncated", "1,152,921,504,606,846,976 metadata keys"]),
        (build([], [], counts=(2**60, 0)), ["truncated", "tensors"]),
        (build([ARCH, kv("x", 8, u64(2**40) + b"abc")], []), ["truncated", "1,099,511,627,776 bytes"]),
        (build([u64(2**40) + b"k"], [], counts=(0, 1)), ["truncated", "metadata key 0"]),
        (build([kv("x", 9, u32(5) + u64(2**62))], []), ["truncated", "'x'", "elements"]),
        (build([kv("x", 9, u32(9) + u64(2**62))], []), ["truncated", "'x'"]),
        (build([kv("x", 9, (u32(9) + u64(1)) * 9 + u32(0) + u64(0))], []), ["nests arrays more than 8 deep"]),
        (build([kv("x", 13, b"")], []), ["value type 13"]),
        (build([kv("x", 9, u32(13) + u64(1))], []), ["array of value type 13"]),
        (build([kv(b"k\xff", 0, b"\0")], []), ["metadata key 0 is not UTF-8"]),
        (build([kv("x", 8, s(b"\xc3("))], []), ["'x' is not UTF-8"]),
        (build([kv("x", 9, u32(8) + u64(2) + s("a") + s(b"\xff"))], []), ["string 1 of metadata 'x'"]),
        (build([ARCH, ARCH], []), ["'general.architecture' appears twice"]),
        (build([kv("b", 7, b"\x02")], []), ["BOOL of byte 2"]),
        (build([kv("b", 9, u32(7) + u64(2) + b"\x01\x05")], []), ["BOOL that is neither"]),
        (build([kv("general.alignment", 4, u32(48))], []), ["general.alignment is 48"]),
        (build([kv("general.alignment", 4, u32(0))], []), ["general.alignment is 0"]),
        (build([kv("general.alignment", 10, u64(64))], []), ["of type UINT64"]),
        (build([kv("k\nnext line", 7, b"\x09")], []), ["'k\\nnext line'"]),
        (build([ARCH], [F32_2x32, F32_2x32], bytes(512)), ["tensor 'w' appears twice"]),
        (build([ARCH], [ti("w", [32, 0], 0, 0)], bytes(256)), ["dimensions [32, 0]"]),
        (build([ARCH], [ti("w", [2**63, 1], 0, 0)], bytes(256)), ["below 2**63"]),
        (build([ARCH], [ti("w", [2**32, 2**32], 0, 0)], bytes(256)), ["2**63"]),
        (build([ARCH], [ti("w", [1, 1, 1, 1, 1], 0, 0)], bytes(256)), ["5 dimensions"]),
        (build([ARCH], [ti("w", [2**32 - 1] * 4 + [1] * 10**4, 0, 0)], bytes(256)), ["10,004 dimensions"]),
        (build([ARCH], [ti("w", [48, 2], 2, 0)], bytes(256)), ["Q4_0", "whole number of Q4_0 blocks"]),
        (build([ARCH], [ti("w", [32, 2], 99, 0)], bytes(256)), ["type id 99", "update layerfit"]),
        (build([ARCH], [ti("w", [32, 2], 31, 0)], bytes(256)), ["type id 31 (Q4_0_4_4"]),
        (build([ARCH], [ti("w", [32, 2], 0, 16)], bytes(512)), ["offset 16 is not a multiple of the alignment 32"]),
        (build([ARCH], [F32_2x32], bytes(255)), ["truncated", "tensor 'w'"]),
        (build([ARCH], [ti("w", [32, 2], 0, 2**64 - 32)], bytes(256)), ["truncated", "tensor 'w'"]),
        (build([ARCH], [F32_2x32, ti("v", [8], 0, 224)], bytes(512)), ["tensors 'w' and 'v' overlap"]),
        (build([ARCH], [ti("v", [8], 0, 224), F32_2x32], bytes(512)), ["tensors 'w' and 'v' overlap"]),
    ],
    ids=[
        "empty", "other magic", "version 1", "version 7", "big-endian", "2**60 keys", "2**60 tensors",
        "2**40-byte string", "2**40-byte key", "2**62 numbers", "2**62 arrays", "deep nesting", "value type 13",
        "element type 13", "key not UTF-8", "value not UTF-8", "array string not UTF-8", "duplicate key",
        "bool 2", "bool array 5", "alignment 48", "alignment 0", "alignment uint64", "newline in key",
        "duplicate tensor", "zero dim", "dim 2**63", "2**64 elements", "5 dims", "10004 dims",
        "row not whole blocks", "unknown type", "removed type", "unaligned offset", "data cut", "offset past end",
        "overlap", "overlap other order",
    ],
)
def test_a_hostile_file_is_one_line(tmp_path: Path, content: bytes, words: list[str]) -> None:
    tracemalloc.start()
    try:
        refused(tmp_path, content, *words)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < FEW_MB


def test_a_header_past_the_memory_bound_is_refused_before_it_is_built(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import layerfit.store.gguf_file as module

    monkeypatch.setattr(module, "MAX_METADATA_MEMORY", 64 * 1024)
    tokens = [f"t{i}" for i in range(2000)]
    content = build([kv("tokens", 9, u32(8) + u64(len(tokens)) + b"".join(s(t) for t in tokens))], [])
    refused(tmp_path, content, "more than 0 MiB of memory")
    big = build([kv("s", 8, s("x" * 70_000))], [])
    refused(tmp_path, big, "more than 0 MiB")
    long_strings = build([kv("t", 9, u32(8) + u64(10) + s("y" * 10_000) * 10)], [])
    refused(tmp_path, long_strings, "more than 0 MiB")
    assert MAX_METADATA_MEMORY == 1 << 30


def test_what_is_not_a_gguf_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        read_gguf(tmp_path / "absent.gguf")
    with pytest.raises(InputError, match="not a regular file"):
        read_gguf(tmp_path)
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):  # refused, not waited on
        read_gguf(fifo)


# --- fuzzing ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, int, int]:
    """A small valid file of every value type and a few tensor types, its data offset and
    the end of its last tensor (only padding follows)."""
    rng = np.random.default_rng(1)
    tensors = []
    for name in ("F32", "Q8_0", "Q4_K", "IQ2_XS"):
        data, raw = tensor_data(BY_NAME[name], 2, 1, rng)
        tensors.append((f"t.{name}", data, raw))
    path = write_with_gguf(tmp_path_factory.mktemp("gguf") / "sample.gguf", tensors)
    f = read_gguf(path)
    return path.read_bytes(), f.data_offset, max(t.offset + t.nbytes for t in f.tensors)


def check(tmp_path: Path, content: bytes) -> GGUFFile | None:
    """``content`` read as a valid file, or refused in one line; few MB, no other exception."""
    path = tmp_path / "fuzzed.gguf"
    path.write_bytes(content)
    tracemalloc.start()
    try:
        f = read_gguf(path)
    except InputError as exc:
        message = str(exc)
        assert "\n" not in message and str(path) in message, message
        return None
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < FEW_MB, peak
    spans = sorted((t.offset, t.offset + t.nbytes) for t in f.tensors)
    assert all(f.data_offset <= a and b <= len(content) and (a - f.data_offset) % f.alignment == 0 for a, b in spans)
    assert all(b <= c for (_, b), (c, _) in zip(spans, spans[1:], strict=False))
    assert len({t.name for t in f.tensors}) == len(f.tensors)
    assert all(math.prod(t.shape) >= 1 for t in f.tensors)
    assert_same_as_gguf(f, path)  # what we accept, gguf reads the same way
    return f


@given(cut=st.integers(0, 10**6))
@FUZZ
def test_a_file_cut_anywhere_is_refused_in_one_line(tmp_path_factory, sample: tuple[bytes, int, int], cut: int) -> None:
    content, _, end = sample
    cut %= len(content)
    f = check(tmp_path_factory.mktemp("cut"), content[:cut])
    assert (f is None) == (cut < end), cut  # cut padding alone, and the file is whole


@given(flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=4))
@FUZZ
def test_bytes_flipped_in_the_header_are_read_or_refused(tmp_path_factory, sample: tuple[bytes, int, int],
                                                         flips: list[tuple[int, int]]) -> None:
    content, data_offset, _ = sample
    damaged = bytearray(content)
    for where, mask in flips:
        damaged[where % data_offset] ^= mask
    check(tmp_path_factory.mktemp("flip"), bytes(damaged))


HUGE = st.sampled_from([2**64 - 1, 2**63, 2**63 - 1, 2**62, 2**40, 2**32, 2**32 - 1, 2**31, 10**9, 4096, 33, 0])


@given(where=st.integers(0, 10**6), value=HUGE | st.integers(0, 2**64 - 1), width=st.sampled_from([4, 8]))
@FUZZ
def test_huge_counts_lengths_and_offsets_are_read_or_refused(tmp_path_factory, sample: tuple[bytes, int, int],
                                                             where: int, value: int, width: int) -> None:
    content, data_offset, _ = sample
    where %= data_offset - width
    damaged = bytearray(content)
    damaged[where : where + width] = (value % 2**(8 * width)).to_bytes(width, "little")
    check(tmp_path_factory.mktemp("huge"), bytes(damaged))


tensor_specs = st.lists(
    st.tuples(st.sampled_from(["F32", "F16", "Q8_0", "Q4_K", "Q6_K", "IQ1_S"]), st.integers(1, 3),
              st.integers(0, 40), st.integers(1, 2)),
    min_size=1, max_size=5,
)


@given(specs=tensor_specs, data_blocks=st.integers(0, 40), alignment=st.sampled_from([32, 64, 1, 4096]))
@FUZZ
def test_any_placement_of_tensors_is_read_or_refused(tmp_path_factory, specs, data_blocks: int, alignment: int) -> None:
    """Offsets anywhere (overlapping, unaligned, past the end): each accepted placement is
    exactly the one its infos state, and gguf agrees."""
    infos = [ti(f"t{i}", [BY_NAME[name].block_elems * blocks, rows], BY_NAME[name].type_id, slot * 32)
             for i, (name, rows, slot, blocks) in enumerate(specs)]
    kvs = [ARCH, kv("general.alignment", 4, u32(alignment))]
    f = check(tmp_path_factory.mktemp("place"), build(kvs, infos, bytes(data_blocks * 64), alignment=alignment))
    if f is not None:
        assert [t.offset - f.data_offset for t in f.tensors] == [slot * 32 for _, _, slot, _ in specs]


# --- a large vocabulary ------------------------------------------------------------------

def vocabulary_file(path: Path, n: int) -> Path:
    """A header like a 150k-token BPE model's: tokens, scores, token types, merges."""
    tokens = [f"tok{i}" if i % 7 else f"Ġwörd{i}✓" for i in range(n)]
    merges = [f"t{i} k{i}" for i in range(n)]
    kvs = [
        ARCH,
        kv("tokenizer.ggml.model", 8, s("gpt2")),
        kv("tokenizer.ggml.tokens", 9, u32(8) + u64(n) + b"".join(s(t) for t in tokens)),
        kv("tokenizer.ggml.scores", 9, u32(6) + u64(n) + np.linspace(-1, 0, n, dtype="<f4").tobytes()),
        kv("tokenizer.ggml.token_type", 9, u32(5) + u64(n) + np.ones(n, dtype="<i4").tobytes()),
        kv("tokenizer.ggml.merges", 9, u32(8) + u64(n) + b"".join(s(m) for m in merges)),
    ]
    path.write_bytes(build(kvs, [F32_2x32], bytes(256)))
    return path


def test_a_150k_token_vocabulary_reads_fast(tmp_path: Path) -> None:
    n = 150_000
    path = vocabulary_file(tmp_path / "vocab.gguf", n)
    best = math.inf
    for _ in range(3):
        begin = time.perf_counter()
        f = read_gguf(path)
        best = min(best, time.perf_counter() - begin)
    tokens = f.metadata["tokenizer.ggml.tokens"]
    assert len(tokens) == n and tokens[1] == "tok1" and tokens[7] == "Ġwörd7✓"
    assert f.metadata["tokenizer.ggml.merges"][-1] == f"t{n - 1} k{n - 1}"
    assert len(f.metadata["tokenizer.ggml.scores"]) == n and f.metadata["tokenizer.ggml.token_type"][0] == 1
    assert best < 2.0, best  # about 0.1 s on a quiet machine
