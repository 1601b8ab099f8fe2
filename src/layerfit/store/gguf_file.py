"""A GGUF file (llama.cpp's format for models as published) read without trusting it.

``read_gguf(path)`` parses a GGUF v2/v3 file's header: its metadata (keys to plain Python
values: int, float, bool, str and lists of them, nested lists included) and its tensor
infos (name, GGML type, shape in torch order, absolute offset, bytes). Tensor data is not
read: ``read_tensor_into`` and ``tensor_bytes`` copy a tensor's bytes, or any part of
them, when ``prepare`` wants them, opening the file for that read alone.

The file is someone else's, so nothing it claims is believed before it is checked: every
count and length against the bytes left in the file *before* anything is allocated (a
header claiming 2**60 keys or a 2**40-byte string fails at once, in a few kilobytes),
everything built in Python charged to one memory bound (``MAX_METADATA_MEMORY``), arrays
nested at most ``MAX_DEPTH`` deep, strings checked as UTF-8, keys and tensor names unique,
dimensions positive with their product below 2**63, rows whole blocks of their type,
the alignment a power of two, and every tensor aligned, inside the file and apart from
every other. Anything that does not hold is one :class:`~layerfit.errors.InputError` line
naming the file, what is wrong and what to do. The header is read in bounded windows
with ``os.pread``; the file is never mapped.

The ``gguf`` package is not used here: running a prepared model must not need it, and
its reader maps the whole file and believes its counts.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from layerfit.errors import InputError
from layerfit.store.ggml_types import BY_ID, SUPPORTED, GGMLType, describe_unknown, tensor_nbytes

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # v1 (2023) had 32-bit counts; llama.cpp reads it no more
DEFAULT_ALIGNMENT = 32
MAX_DEPTH = 8  # arrays of arrays, at most this deep
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_METADATA_MEMORY = 1 << 30  # the Python objects a header may make us build, estimated
CHUNK = 1 << 20  # the header is read in windows of this size

# Estimated bytes of the Python objects each value becomes (its list slot included):
# generous, so the bound holds for any file.
_SCALAR_COST = 48
_STRING_COST = 96  # plus the string's length in bytes
_ARRAY_COST = 72
_TENSOR_COST = 512  # a GGUFTensor, its shape and its place in the tuple, plus its name

_UINT32, _BOOL, _STRING, _ARRAY = 4, 7, 8, 9
# GGUF value type -> struct code (little-endian), bytes
_SCALARS: dict[int, tuple[str, int]] = {
    0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4),
    6: ("f", 4), 7: ("B", 1), 10: ("Q", 8), 11: ("q", 8), 12: ("d", 8),
}
_TYPE_NAMES = {
    0: "UINT8", 1: "INT8", 2: "UINT16", 3: "INT16", 4: "UINT32", 5: "INT32", 6: "FLOAT32", 7: "BOOL",
    8: "STRING", 9: "ARRAY", 10: "UINT64", 11: "INT64", 12: "FLOAT64",
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_AGAIN = "re-download it, or convert it again"


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file: ``shape`` in torch order (GGUF's dims reversed, so the
    last is the row, ``ne[0]``), its data at absolute byte ``offset``, ``nbytes`` long."""

    name: str
    ggml_type: GGMLType
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class GGUFFile:
    """A GGUF file's header, checked: metadata as Python values, tensors in file order.
    ``file_size`` and ``file_mtime_ns`` are the file's as its header was checked: a read
    of tensor data refuses a file that has changed since (re-downloaded, cut)."""

    path: Path
    version: int
    alignment: int
    data_offset: int
    metadata: dict[str, Any]
    tensors: tuple[GGUFTensor, ...]
    file_size: int = 0
    file_mtime_ns: int = 0

    def tensor(self, name: str) -> GGUFTensor:
        """The tensor called ``name`` (KeyError if the file has none)."""
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)


def unsupported_types(f: GGUFFile) -> dict[str, str]:
    """Each tensor whose type ``prepare`` does not convert, with its type's name, for
    ``prepare``'s one-line refusal."""
    return {t.name: t.ggml_type.name for t in f.tensors if t.ggml_type.name not in SUPPORTED}


def _shown(text: str, limit: int = 60) -> str:
    """A name from the file as it may be printed on one line: quoted, escaped, cut."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


class _Reader:
    """The header read forwards through a window of the file, every read bounded by the
    bytes the file has, every object built charged to the memory bound."""

    def __init__(self, fd: int, size: int, path: Path) -> None:
        self.fd, self.size, self.path = fd, size, path
        self.buf = b""
        self.base = 0  # file offset of buf[0]
        self.pos = 0  # file offset of the next byte to parse
        self.budget = MAX_METADATA_MEMORY

    def corrupt(self, what: str) -> InputError:
        return InputError(f"{self.path} is not a valid GGUF file: {what}; {_AGAIN}")

    def truncated(self, what: str) -> InputError:
        return InputError(f"{self.path} is truncated or corrupt: {what} (the file has {self.size:,} bytes); {_AGAIN}")

    def left(self) -> int:
        """Bytes of the file after the parse position."""
        return self.size - self.pos

    def window(self, n: int, what: str) -> int:
        """The index in ``buf`` of the parse position, with ``n`` bytes after it there."""
        i = self.pos - self.base
        if i + n <= len(self.buf):
            return i
        if n > self.size - self.pos:
            raise self.truncated(f"{what} needs {n:,} bytes at offset {self.pos:,}")
        want = min(max(n, CHUNK), self.size - self.pos)
        self.buf = _pread(self.fd, want, self.pos, self)
        self.base = self.pos
        return 0

    def charge(self, cost: int, what: str) -> None:
        """Count ``cost`` estimated bytes against the memory bound before building them."""
        self.budget -= cost
        if self.budget < 0:
            raise InputError(
                f"{self.path}: {what} would take more than {MAX_METADATA_MEMORY >> 20} MiB of memory to read "
                f"(is it a GGUF file as llama.cpp writes them?); {_AGAIN}"
            )

    def scalar(self, code: str, size: int, what: str) -> Any:
        i = self.window(size, what)
        (value,) = struct.unpack_from("<" + code, self.buf, i)
        self.pos += size
        return value

    def u32(self, what: str) -> int:
        i = self.window(4, what)
        self.pos += 4
        return _U32.unpack_from(self.buf, i)[0]  # type: ignore[no-any-return]

    def u64(self, what: str) -> int:
        i = self.window(8, what)
        self.pos += 8
        return _U64.unpack_from(self.buf, i)[0]  # type: ignore[no-any-return]

    def string(self, what: str) -> str:
        length = self.u64(what)
        if length > self.left():
            raise self.truncated(f"{what} claims {length:,} bytes at offset {self.pos:,}")
        self.charge(_STRING_COST + length, what)
        i = self.window(length, what)
        raw = self.buf[i : i + length]
        self.pos += length
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.corrupt(f"{what} is not UTF-8 text") from None


def _pread(fd: int, n: int, offset: int, r: _Reader) -> bytes:
    """Exactly ``n`` bytes at ``offset`` (a file that shrinks while read is truncated)."""
    parts, got = [], 0
    while got < n:
        part = os.pread(fd, min(n - got, 1 << 30), offset + got)
        if not part:
            raise r.truncated(f"it ended at byte {offset + got:,} while being read")
        parts.append(part)
        got += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def open_gguf(path: Path) -> tuple[int, os.stat_result]:
    """A descriptor of ``path`` and its status; one line if it is missing or no plain
    file (a FIFO is not waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputError(f"{path} does not exist (name a .gguf file)") from None
    except OSError as exc:
        raise InputError(f"cannot open {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise InputError(f"{path} is not a regular file (name a .gguf file)")
    return fd, st


def read_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """The checked header of the GGUF file at ``path``: a :class:`GGUFFile`, or one
    :class:`InputError` line saying what is wrong with the file and what to do."""
    path = Path(path)
    fd, st = open_gguf(path)
    r = _Reader(fd, st.st_size, path)
    try:
        version = _preamble(r)
        tensor_count = r.u64("the tensor count")
        kv_count = r.u64("the metadata count")
        metadata, alignment = _metadata(r, kv_count)
        infos = _tensor_infos(r, tensor_count)
        data_offset = -(-r.pos // alignment) * alignment
        tensors = _placed(r, infos, data_offset, alignment)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return GGUFFile(path, version, alignment, data_offset, metadata, tensors, st.st_size, st.st_mtime_ns)


def _preamble(r: _Reader) -> int:
    """The magic and the version: 2 or 3, little-endian."""
    head = b""
    if r.size >= 4:
        i = r.window(4, "the magic")
        head = r.buf[i : i + 4]
    if head != MAGIC:
        raise InputError(f"{r.path} is not a GGUF file (it begins {head!r}, not {MAGIC!r}): name a .gguf model file")
    r.pos = 4
    version = r.u32("the version")
    swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
    if version & 0xFFFF == 0 and swapped in (1, 2, 3):
        raise InputError(
            f"{r.path} is a big-endian GGUF file; layerfit reads little-endian ones: convert it with llama.cpp's "
            "gguf_convert_endian.py (or download the little-endian file)"
        )
    if version == 1:
        raise InputError(f"{r.path} is GGUF version 1, which llama.cpp no longer reads: convert the model again")
    if version not in VERSIONS:
        raise InputError(
            f"{r.path} is GGUF version {version}; layerfit reads versions 2 and 3: update layerfit, or convert "
            "the model again with llama.cpp"
        )
    return version


def _metadata(r: _Reader, count: int) -> tuple[dict[str, Any], int]:
    """``count`` key/value pairs, and the alignment they set (``general.alignment``, a
    UINT32 power of two; 32 without it)."""
    if count * 13 > r.left():  # a key is 8 bytes or more, its type 4, a value 1 or more
        raise r.truncated(f"its header claims {count:,} metadata keys")
    r.charge(count * _SCALAR_COST, "its metadata")
    metadata: dict[str, Any] = {}
    alignment = DEFAULT_ALIGNMENT
    for index in range(count):
        key = r.string(f"metadata key {index}")
        if key in metadata:
            raise r.corrupt(f"metadata key {_shown(key)} appears twice")
        vtype = r.u32(f"the type of metadata {_shown(key)}")
        metadata[key] = _value(r, vtype, key, 0)
        if key == "general.alignment":
            value = metadata[key]
            if vtype != _UINT32 or value <= 0 or value & (value - 1):
                raise r.corrupt(f"general.alignment is {value!r} of type {_TYPE_NAMES.get(vtype, vtype)}, "
                                "not a UINT32 power of two")
            alignment = value
    return metadata, alignment


def _value(r: _Reader, vtype: int, key: str, depth: int) -> Any:
    """One value of GGUF type ``vtype`` (of metadata ``key``, nested ``depth`` deep)."""
    what = f"metadata {_shown(key)}"
    scalar = _SCALARS.get(vtype)
    if scalar is not None:
        value = r.scalar(*scalar, what)
        if vtype == _BOOL:
            if value > 1:
                raise r.corrupt(f"{what} is a BOOL of byte {value}, neither 0 nor 1")
            return value == 1
        return value
    if vtype == _STRING:
        return r.string(what)
    if vtype == _ARRAY:
        if depth >= MAX_DEPTH:
            raise r.corrupt(f"{what} nests arrays more than {MAX_DEPTH} deep")
        etype = r.u32(f"the element type of {what}")
        count = r.u64(f"the length of {what}")
        return _array(r, etype, count, key, depth + 1)
    raise r.corrupt(f"{what} has value type {vtype}, which GGUF does not define")


def _array(r: _Reader, etype: int, count: int, key: str, depth: int) -> list[Any]:
    """``count`` values of type ``etype``: checked against the bytes left and charged to
    the memory bound before any is built; numbers unpacked at once, strings in a loop."""
    what = f"metadata {_shown(key)}"
    scalar = _SCALARS.get(etype)
    least = scalar[1] if scalar else 8 if etype == _STRING else 12 if etype == _ARRAY else 0
    if not least:
        raise r.corrupt(f"{what} is an array of value type {etype}, which GGUF does not define")
    if count * least > r.left():
        raise r.truncated(f"{what} claims {count:,} elements at offset {r.pos:,}")
    if scalar is not None:
        code, size = scalar
        r.charge(count * _SCALAR_COST, what)
        i = r.window(count * size, what)
        values = list(struct.unpack_from(f"<{count}{code}", r.buf, i))
        r.pos += count * size
        if etype == _BOOL:
            if any(v > 1 for v in values):
                raise r.corrupt(f"{what} holds a BOOL that is neither 0 nor 1")
            return [v == 1 for v in values]
        return values
    if etype == _STRING:
        r.charge(count * _STRING_COST, what)
        return _strings(r, count, what)
    if depth >= MAX_DEPTH:
        raise r.corrupt(f"{what} nests arrays more than {MAX_DEPTH} deep")
    r.charge(count * _ARRAY_COST, what)
    out = []
    for _ in range(count):
        inner = r.u32(f"the element type of {what}")
        out.append(_array(r, inner, r.u64(f"the length of {what}"), key, depth + 1))
    return out


def _strings(r: _Reader, count: int, what: str) -> list[str]:
    """``count`` strings (a vocabulary: 150k of them). This loop is most of a large
    header's parse time, so a string lying inside the window costs an unpack, a slice
    and a decode; only one that crosses the window's end takes the slow path, which
    charges the bytes decoded so far to the memory bound (at most a window's worth
    uncharged) and checks the length against the file before reading it."""
    out: list[str] = []
    append, unpack = out.append, _U64.unpack_from
    buf, base, end, pos = r.buf, r.base, len(r.buf), r.pos
    spent = 0  # string bytes decoded and not yet charged
    index = 0
    try:
        for index in range(count):
            i = pos - base
            if i + 8 > end:
                r.pos = pos
                i = r.window(8, f"string {index} of {what}")
                buf, base, end = r.buf, r.base, len(r.buf)
            (length,) = unpack(buf, i)
            i += 8
            j = i + length
            if j > end:
                r.pos = pos + 8
                if length > r.left():
                    raise r.truncated(f"string {index} of {what} claims {length:,} bytes at offset {r.pos:,}")
                r.charge(spent + length, what)
                spent = -length
                i = r.window(length, f"string {index} of {what}")
                buf, base, end = r.buf, r.base, len(r.buf)
                j = i + length
            append(buf[i:j].decode("utf-8"))
            spent += length
            pos += 8 + length
    except UnicodeDecodeError:
        raise r.corrupt(f"string {index} of {what} is not UTF-8 text") from None
    r.pos = pos
    r.charge(spent, what)
    return out


def _tensor_infos(r: _Reader, count: int) -> list[tuple[str, GGMLType, tuple[int, ...], int, int]]:
    """``count`` tensor infos: name, type, shape (torch order), offset in the data
    section, bytes; names unique, dimensions positive, rows whole blocks."""
    if count * 24 > r.left():  # a name of 8 bytes or more, dims count, type, offset
        raise r.truncated(f"its header claims {count:,} tensors")
    r.charge(count * _TENSOR_COST, "its tensor list")
    names: set[str] = set()
    infos = []
    for index in range(count):
        name = r.string(f"the name of tensor {index}")
        if name in names:
            raise r.corrupt(f"tensor {_shown(name)} appears twice")
        names.add(name)
        what = f"tensor {_shown(name)}"
        n_dims = r.u32(f"the dimension count of {what}")
        if n_dims > MAX_DIMS:
            raise r.corrupt(f"{what} has {n_dims:,} dimensions (GGUF allows at most {MAX_DIMS})")
        dims = [r.u64(f"the dimensions of {what}") for _ in range(n_dims)]
        if any(d == 0 or d >= 2**63 for d in dims):
            raise r.corrupt(f"{what} has dimensions {dims} (each must be at least 1 and below 2**63)")
        type_id = r.u32(f"the type of {what}")
        ggml = BY_ID.get(type_id)
        if ggml is None:
            raise InputError(
                f"{r.path}: {what} has tensor {describe_unknown(type_id)}: convert the model again with a current "
                "llama.cpp, or update layerfit"
            )
        offset = r.u64(f"the data offset of {what}")
        shape = tuple(reversed(dims))
        try:
            nbytes = tensor_nbytes(ggml, shape)
        except ValueError as exc:
            raise r.corrupt(f"{what} of {ggml.name}: {exc}") from None
        infos.append((name, ggml, shape, offset, nbytes))
    return infos


def _placed(
    r: _Reader, infos: list[tuple[str, GGMLType, tuple[int, ...], int, int]], data_offset: int, alignment: int
) -> tuple[GGUFTensor, ...]:
    """The tensors with absolute offsets: each aligned, inside the file, apart from the others."""
    tensors = []
    for name, ggml, shape, offset, nbytes in infos:
        what = f"tensor {_shown(name)}"
        if offset % alignment:
            raise r.corrupt(f"{what}'s data offset {offset:,} is not a multiple of the alignment {alignment}")
        start = data_offset + offset
        if start + nbytes > r.size:
            raise r.truncated(f"{what} ({nbytes:,} bytes at offset {start:,}) ends past the end of the file")
        tensors.append(GGUFTensor(name, ggml, shape, start, nbytes))
    spans = sorted(tensors, key=lambda t: t.offset)
    for first, second in zip(spans, spans[1:], strict=False):
        if second.offset < first.offset + first.nbytes:
            raise r.corrupt(f"tensors {_shown(first.name)} and {_shown(second.name)} overlap")
    return tuple(tensors)


def read_tensor_into(f: GGUFFile, t: GGUFTensor, out: bytearray | memoryview, start: int = 0) -> None:
    """Bytes ``[start, start + len(out))`` of ``t``'s data into ``out`` (a whole tensor, or
    one block-aligned piece of a large one at a time): the file opened for this read alone,
    and refused in one line if it is no longer the size its header was checked against."""
    view = memoryview(out).cast("B")
    if start < 0 or start + view.nbytes > t.nbytes:
        raise ValueError(f"bytes [{start}, {start + view.nbytes}) are not inside tensor {t.name}'s {t.nbytes}")
    fd, st = open_gguf(f.path)
    try:
        if (f.file_size and st.st_size != f.file_size) or (f.file_mtime_ns and st.st_mtime_ns != f.file_mtime_ns):
            raise InputError(
                f"{f.path} changed while being read (it had {f.file_size:,} bytes, now {st.st_size:,}, and was "
                "modified since its header was read): read it again"
            )
        with os.fdopen(fd, "rb", buffering=0, closefd=False) as fh:
            fh.seek(t.offset + start)
            got = 0
            while got < view.nbytes:
                n = fh.readinto(view[got:])
                if not n:
                    raise InputError(f"{f.path} is truncated: tensor {_shown(t.name)} ends past its end; {_AGAIN}")
                got += n
    except OSError as exc:
        raise InputError(f"cannot read {f.path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def tensor_bytes(f: GGUFFile, t: GGUFTensor) -> bytes:
    """``t``'s data as bytes (small tensors; copy large ones by parts with ``read_tensor_into``)."""
    out = bytearray(t.nbytes)
    read_tensor_into(f, t, out)
    return bytes(out)
