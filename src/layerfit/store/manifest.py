"""The prepared-model format on disk: a versioned manifest beside one weights file.

``DIR/manifest.json`` names the model factory and arguments, the input shape and dtype,
the capture, and for every *segment* (the resident tensors, then each unit in execution
order) its file offset, padded length, SHA-256 and tensor layout. ``DIR/weights.safetensors``
is a valid safetensors file whose data is laid out so that every segment starts on a
4096-byte boundary and is padded to one: a unit is one sequential direct-I/O read and
its tensors are zero-copy views into the read buffer. Padding is covered by ``__pad_*``
byte tensors because safetensors forbids holes.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from layerfit.capture.graph import ModelGraph
from layerfit.errors import ManifestError
from layerfit.store.variable_shapes import VariableShapes

FORMAT = "layerfit-prepared"
VERSION = 1  # row-major tensors only: what every layerfit reads
STRIDED_VERSION = 2  # some tensor has a ``stride``: an older layerfit must refuse it, not bind it row-major
QUANTIZED_VERSION = 3  # some tensor is stored as GGML blocks (an ``encoding``): an older layerfit must refuse it
VERSIONS = (VERSION, STRIDED_VERSION, QUANTIZED_VERSION)
MANIFEST = "manifest.json"
HF_CONFIG = "config.json"  # a Hugging Face folder's config: kept in a prepared one, alone in one as published
WEIGHTS = "weights.safetensors"
ALIGN = 4096  # segment alignment: direct I/O needs block-aligned offsets and lengths
TENSOR_ALIGN = 64  # tensor alignment inside a segment, as PyTorch's allocator gives

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
SAFETENSORS_DTYPES = {
    "float32": "F32",
    "float16": "F16",
    "bfloat16": "BF16",
    "float64": "F64",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
}


def storage_order(shape: tuple[int, ...], stride: tuple[int, ...]) -> list[int] | None:
    """The dimensions of a tensor from the outermost in memory to the innermost, where
    ``stride`` lays ``shape`` out densely (a permutation of row-major, as channels-last
    or a transposed weight); None where it leaves gaps or overlaps."""
    if len(shape) != len(stride):
        return None
    order = sorted(range(len(shape)), key=lambda d: (-stride[d], d))
    expected = 1
    for d in reversed(order):
        if shape[d] != 1 and stride[d] != expected:
            return None
        expected *= shape[d]
    return order


@dataclass(frozen=True)
class Encoding:
    """How a tensor stored as GGML quantization blocks (from a GGUF file) becomes the
    tensor the model holds: the blocks are rows of the tensor (of its transpose where
    ``transposed``: GGUF keeps a weight ``[out, in]`` that the model holds ``[in, out]``,
    GPT-2's ``Conv1D``), each row ``ggml``'s blocks along the last dimension. Where
    ``int4_rows`` is set, a linear layer's Q4_0/Q4_1/Q4_K or Q6_K weight is stored re-expressed
    for PyTorch's int4 kernel, its codes in the layout of that many rows per block
    (:mod:`layerfit.store.int4_form`, :mod:`layerfit.store.q6k_form`), from which the blocks
    are rebuilt byte for byte."""

    ggml: str  # the GGML type name (Q4_0, Q6_K, ...): :mod:`layerfit.store.ggml_types`
    transposed: bool = False
    int4_rows: int = 0  # 0: stored as the file's blocks

    def to_dict(self) -> dict[str, Any]:
        return {
            "ggml": self.ggml,
            **({"transposed": True} if self.transposed else {}),
            **({"int4_rows": self.int4_rows} if self.int4_rows else {}),
        }

    @classmethod
    def from_dict(cls, d: Any) -> Encoding:
        if (
            not isinstance(d, dict)
            or not set(d) <= {"ggml", "transposed", "int4_rows"}
            or not isinstance(d.get("ggml"), str)
            or not isinstance(d.get("transposed", False), bool)
            or type(d.get("int4_rows", 0)) is not int
        ):
            raise ValueError("a tensor's encoding is not {'ggml': NAME, 'transposed': BOOL, 'int4_rows': ROWS}")
        return cls(d["ggml"], d.get("transposed", False), d.get("int4_rows", 0))


@dataclass(frozen=True)
class TensorLayout:
    """Where one tensor lies inside its segment and where it is bound in the model.

    ``stride`` is None for a row-major tensor. A tensor the model holds in another dense
    layout (channels-last, a transposed weight) is stored in its memory order, with its
    strides, and bound with them: the same layout runs the same kernels, so the output
    is the model's to the bit. Its safetensors entry has the shape in memory order.
    """

    name: str
    kind: str  # param or buffer
    dtype: str
    shape: tuple[int, ...]
    offset: int  # from the segment's start
    nbytes: int
    places: tuple[str, ...]  # "module.attr" paths the tensor is bound to
    stride: tuple[int, ...] | None = None  # element strides of the bound view; None: row-major
    # stored as GGML blocks that become ``dtype`` ``shape`` when bound; None: stored as bound
    encoding: Encoding | None = None

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def block_shape(self) -> tuple[int, ...]:
        """The shape whose rows the GGML blocks encode (the transpose's where the encoding says)."""
        if self.encoding is not None and self.encoding.transposed:
            return self.shape[:-2] + (self.shape[-1], self.shape[-2])
        return self.shape

    @property
    def bound_nbytes(self) -> int:
        """The bytes the tensor occupies bound (its ``dtype``), which a quantized one's
        stored bytes (``nbytes``) are not."""
        return math.prod(self.shape) * DTYPES[self.dtype].itemsize

    @property
    def safetensors_dtype(self) -> str:
        """The dtype of the stored bytes in the weights file's header (bytes for GGML blocks)."""
        return "U8" if self.encoding is not None else SAFETENSORS_DTYPES[self.dtype]

    @property
    def storage_shape(self) -> tuple[int, ...]:
        """The shape of the bytes as stored (in memory order); a quantized tensor's bytes
        are one row of uint8."""
        if self.encoding is not None:
            return (self.nbytes,)
        if self.stride is None:
            return self.shape
        order = storage_order(self.shape, self.stride) or range(len(self.shape))
        return tuple(self.shape[d] for d in order)


@dataclass(frozen=True)
class Segment:
    """A contiguous, aligned byte range of the weights file read in one go."""

    index: int  # -1 for the resident segment, else the unit index
    name: str  # module name of the unit, "<resident>" for the resident segment
    module_type: str
    offset: int  # absolute file offset, a multiple of ALIGN
    nbytes: int  # padded length, a multiple of ALIGN
    payload_bytes: int  # bytes of tensor data (the paper's s)
    sha256: str
    tensors: tuple[TensorLayout, ...]
    d: int = 0
    f: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "module_type": self.module_type,
            "offset": self.offset,
            "nbytes": self.nbytes,
            "payload_bytes": self.payload_bytes,
            "sha256": self.sha256,
            "d": self.d,
            "f": self.f,
            "tensors": [
                {
                    "name": t.name,
                    "kind": t.kind,
                    "dtype": t.dtype,
                    "shape": list(t.shape),
                    "offset": t.offset,
                    "nbytes": t.nbytes,
                    "places": list(t.places),
                    **({"stride": list(t.stride)} if t.stride is not None else {}),
                    **({"encoding": t.encoding.to_dict()} if t.encoding is not None else {}),
                }
                for t in self.tensors
            ],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Segment:
        return cls(
            index=_whole(d["index"]),
            name=_text(d["name"]),
            module_type=_text(d["module_type"]),
            offset=_whole(d["offset"]),
            nbytes=_whole(d["nbytes"]),
            payload_bytes=_whole(d["payload_bytes"]),
            sha256=_text(d["sha256"]),
            d=_whole(d.get("d", 0)),
            f=_whole(d.get("f", 0)),
            tensors=tuple(
                TensorLayout(
                    name=_text(t["name"]),
                    kind=_text(t["kind"]),
                    dtype=_text(t["dtype"]),
                    shape=tuple(_whole(x) for x in t["shape"]),
                    offset=_whole(t["offset"]),
                    nbytes=_whole(t["nbytes"]),
                    places=tuple(_text(p) for p in t["places"]),
                    stride=tuple(_whole(x) for x in t["stride"]) if t.get("stride") is not None else None,
                    encoding=Encoding.from_dict(t["encoding"]) if t.get("encoding") is not None else None,
                )
                for t in d["tensors"]
            ),
        )


@dataclass(frozen=True)
class Manifest:
    """Everything needed to rebuild, verify and stream a prepared model."""

    model: dict[str, Any]  # {"source", "name", "kwargs"}
    input_shape: tuple[int, ...]
    input_dtype: str
    weights_file: str
    weights_size: int
    resident: Segment | None
    units: tuple[Segment, ...]
    graph: ModelGraph
    seed: int = 0
    # A model prepared from an example of keyword arguments: each tensor's (name, shape,
    # dtype), so the default input (``layerfit run``) is a call of them all.
    input_keywords: tuple[tuple[str, tuple[int, ...], str], ...] = ()
    # The integer inputs' value ranges [low, high) by name ("" for the one positional
    # input) where the model needs them (token types, a vocabulary); else [0, 32).
    input_ranges: tuple[tuple[str, int, int], ...] = ()
    # Files prepare copied beside the weights (a Hugging Face folder's config, tokenizer,
    # generation config): plain names in the folder.
    files: tuple[str, ...] = ()
    # A text model's axes that a request may size otherwise (batch, lengths) and its
    # passes measured at several shapes (:mod:`layerfit.store.variable_shapes`).
    variable_shapes: VariableShapes | None = None

    def input_range(self, name: str = "") -> tuple[int, int]:
        """[low, high) of integer input ``name`` in the default call."""
        return next(((low, high) for n, low, high in self.input_ranges if n == name), (0, 32))

    @property
    def segments(self) -> tuple[Segment, ...]:
        return ((self.resident,) if self.resident else ()) + self.units

    @property
    def largest_unit_bytes(self) -> int:
        return max((u.nbytes for u in self.units), default=0)

    @property
    def resident_bytes(self) -> int:
        return self.resident.nbytes if self.resident else 0

    @property
    def total_bytes(self) -> int:
        return sum(s.nbytes for s in self.segments)

    def _strided(self) -> bool:
        return any(t.stride is not None for seg in self.segments for t in seg.tensors)

    @property
    def quantized(self) -> bool:
        """Whether some tensor is stored as GGML blocks (a model prepared from a GGUF file)."""
        return any(t.encoding is not None for seg in self.segments for t in seg.tensors)

    def _version(self) -> int:
        return QUANTIZED_VERSION if self.quantized else STRIDED_VERSION if self._strided() else VERSION

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": self._version(),
            "model": self.model,
            "seed": self.seed,
            "input": {
                "shape": list(self.input_shape),
                "dtype": self.input_dtype,
                **({"keywords": [
                    {"name": n, "shape": list(shape), "dtype": dtype} for n, shape, dtype in self.input_keywords
                ]} if self.input_keywords else {}),
                **({"ranges": {n: [low, high] for n, low, high in self.input_ranges}} if self.input_ranges else {}),
                **({"variable": self.variable_shapes.to_dict()} if self.variable_shapes else {}),
            },
            **({"files": list(self.files)} if self.files else {}),
            "weights": {"file": self.weights_file, "size": self.weights_size, "alignment": ALIGN},
            "resident": self.resident.to_dict() if self.resident else None,
            "units": [u.to_dict() for u in self.units],
            "graph": self.graph.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        if d.get("format") != FORMAT:
            raise ManifestError(f"not a layerfit prepared model (format {d.get('format')!r})")
        if d.get("version") not in VERSIONS:
            raise ManifestError(
                f"prepared model has format version {d.get('version')!r}, this layerfit reads "
                f"versions {' and '.join(map(str, VERSIONS))}: prepare the model again with this version"
            )
        if not isinstance(d.get("graph"), dict):
            raise ManifestError("manifest is malformed (its graph is not a JSON object): prepare the model again")
        try:
            manifest = cls(
                model=_model(d["model"]),
                seed=_whole(d.get("seed", 0)),
                input_shape=tuple(_whole(x) for x in d["input"]["shape"]),
                input_dtype=str(d["input"]["dtype"]),
                weights_file=str(d["weights"]["file"]),
                weights_size=_whole(d["weights"]["size"]),
                resident=Segment.from_dict(d["resident"]) if d.get("resident") else None,
                units=tuple(Segment.from_dict(u) for u in d["units"]),
                graph=ModelGraph.from_dict(d["graph"]),
                input_keywords=tuple(
                    (str(k["name"]), tuple(_whole(x) for x in k["shape"]), str(k["dtype"]))
                    for k in d["input"].get("keywords", ())
                ),
                input_ranges=tuple(
                    (_text(n), _whole(r[0]), _whole(r[1])) for n, r in dict(d["input"].get("ranges", {})).items()
                ),
                files=tuple(_file_name(f) for f in d.get("files", ())),
                variable_shapes=VariableShapes.from_dict(d["input"]["variable"]) if "variable" in d["input"] else None,
            )
            if any(low >= high for _, low, high in manifest.input_ranges):
                raise ValueError("an input range is empty")
            if any(dtype not in DTYPES for _, _, dtype in manifest.input_keywords):
                raise ValueError("an input keyword's dtype is not one layerfit makes inputs of")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ManifestError(
                f"manifest is malformed ({type(exc).__name__}: {exc}): prepare the model again"
            ) from exc
        if manifest._version() != d["version"]:
            raise ManifestError(
                f"manifest is malformed (format version {d['version']} does not match its tensors: tensor strides "
                f"need version {STRIDED_VERSION}, GGML blocks version {QUANTIZED_VERSION}, neither "
                f"{VERSION}): prepare the model again"
            )
        return manifest


def read_manifest(directory: str | Path) -> Manifest:
    """Load and validate ``DIR/manifest.json``; a clear error if anything is off.

    Beyond parsing, the manifest is checked for consistency (every value the engine
    trusts: offsets, lengths, tensor layouts, unit order, the capture) and, when the
    weights file is there, against the safetensors header of that file, so a manifest
    edited by hand is refused here rather than answered with wrong bytes.
    """
    path = Path(directory) / MANIFEST
    if not Path(directory).is_dir():
        raise ManifestError(f"{directory} is not a directory (create one with `layerfit prepare`)")
    try:
        data = json.loads(_read_regular(path, directory).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, or an integer of 5,000 digits
        raise ManifestError(f"{path} is not valid JSON: {str(exc)[:200]}") from None
    except RecursionError:
        raise ManifestError(f"{path} is not a manifest: its JSON is nested too deeply") from None
    except OSError as exc:
        raise ManifestError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if not isinstance(data, dict):
        raise ManifestError(f"{path} does not hold a JSON object")
    try:
        manifest = Manifest.from_dict(data)
    except ManifestError as exc:
        raise ManifestError(f"{path}: {exc}") from exc.__cause__
    if not isinstance(data["weights"].get("file"), str):
        raise ManifestError(f"{path} is malformed (weights file is not a name): prepare the model again")
    name = Path(manifest.weights_file).name
    if name != manifest.weights_file:  # never follow a path out of the model folder
        raise ManifestError(f"weights file {manifest.weights_file!r} must be a plain file name")
    try:
        check_manifest(manifest)
    except ManifestError as exc:
        raise ManifestError(f"{path} is inconsistent: {exc}; prepare the model again") from None
    check_weights_header(manifest, Path(directory) / manifest.weights_file)
    return manifest


def is_unprepared_hf_folder(directory: str | Path) -> bool:
    """Whether ``directory`` is a Hugging Face folder as published: a ``config.json`` and
    no ``manifest.json`` (of any kind: one that is not a regular file is refused for what
    it is), so ``prepare hf:`` is what to run on it."""
    return not os.path.lexists(Path(directory) / MANIFEST) and (Path(directory) / HF_CONFIG).is_file()


def unprepared_hint(directory: str | Path) -> str:
    """What to say of a Hugging Face folder given where a prepared model is expected:
    the one wording of ``run``, ``inspect``, ``layerfit.load`` and ``generate``."""
    return f"{directory} is a Hugging Face model folder, not a prepared model: run `layerfit prepare hf:{directory} -o OUT`"


def _read_regular(path: Path, directory: str | Path) -> bytes:
    """The bytes of ``path`` if it is a regular file (or a link to one). It is opened
    without blocking and checked after opening, so a FIFO of that name (which a blocking
    open would wait on for a writer forever), a socket, a device or a folder is refused
    for what it is, not reported missing, and cannot be swapped in between a check and
    the read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:  # a dangling link too
        if is_unprepared_hf_folder(directory):  # "not a prepared model" alone would leave the user there
            raise ManifestError(f"{path} is missing: {unprepared_hint(directory)}") from None
        raise ManifestError(f"{path} is missing: {directory} is not a prepared model") from None
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ManifestError(
            f"{path} is not a regular file but {_file_kind(mode)}: {directory} is not a prepared model "
            "(`layerfit prepare` writes manifest.json as a regular file)"
        )
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def _file_kind(mode: int) -> str:
    """What a file that is not a regular one is, in words."""
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return next((name for test, name in kinds if test(mode)), "not a file")


_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# The largest input a manifest may declare: more than any edge device holds, far less
# than a hand-edited shape such as [1e6, 3, 1e5, 1e5] asks for.
MAX_INPUT_BYTES = 2**40


def _check_variable_shapes(m: Manifest) -> None:
    """Every varying axis is an axis of a named input, of the size its symbol was prepared at."""
    shapes = dict((n, s) for n, s, _ in m.input_keywords) if m.input_keywords else {"": m.input_shape}
    v = m.variable_shapes
    prepared = dict(zip(v.symbols, v.prepared, strict=True))
    for name, axis, symbol in v.axes:
        if name not in shapes or axis >= len(shapes[name]) or shapes[name][axis] != prepared[symbol]:
            raise ManifestError(
                f"variable axis {axis} of input {name or 'input'!r} ({symbol}) is not an axis of the "
                "prepared input of that size: prepare the model again"
            )


def check_manifest(m: Manifest) -> None:
    """Raise :class:`ManifestError` naming the first value that cannot be what ``prepare``
    wrote: a shape or dtype out of range, a segment that is unaligned, overlaps another or
    lies past the end of the weights file, a tensor outside its segment or whose length
    does not match its shape, a place bound twice, units out of order or not the ones
    the capture recorded."""
    if not m.input_shape or any(d <= 0 for d in m.input_shape):
        raise ManifestError(f"input shape {list(m.input_shape)} has a dimension below 1")
    if m.input_dtype not in DTYPES:
        raise ManifestError(f"input dtype {m.input_dtype!r} is not one of {', '.join(DTYPES)}")
    for _, shape, dtype in [("", m.input_shape, m.input_dtype), *m.input_keywords]:
        if dtype not in DTYPES or any(d <= 0 for d in shape) or math.prod(shape) * DTYPES[dtype].itemsize > MAX_INPUT_BYTES:
            raise ManifestError(f"input shape {list(shape)} of {dtype} is not one prepare writes (over {MAX_INPUT_BYTES:,} bytes)")
    if m.variable_shapes is not None:
        _check_variable_shapes(m)
    g = m.graph
    if tuple(g.input_shape) != tuple(m.input_shape) or g.input_dtype != m.input_dtype:
        raise ManifestError(
            f"input {m.input_dtype} {list(m.input_shape)} differs from the captured input "
            f"{g.input_dtype} {list(g.input_shape)}"
        )
    if m.weights_size < 0:
        raise ManifestError(f"weights size {m.weights_size} is negative")
    if m.resident is not None and m.resident.index != -1:
        raise ManifestError(f"the resident segment has index {m.resident.index}, not -1")
    captured = [(u.index, u.name) for u in g.units]
    stored = [(u.index, u.name) for u in m.units]
    if stored != captured:
        raise ManifestError(
            "its units are not the captured ones in execution order "
            f"(stored {len(stored)}, captured {len(captured)}"
            + (f"; first difference at position {next(i for i, (a, b) in enumerate(zip(stored, captured, strict=False)) if a != b)}"
               if any(a != b for a, b in zip(stored, captured, strict=False)) else "")
            + ")"
        )
    stored_resident = sorted(t.name for t in (m.resident.tensors if m.resident else ()))
    if stored_resident != sorted(r.name for r in g.resident):
        raise ManifestError("its resident tensors are not the captured ones")
    end = 0
    places: dict[str, str] = {}
    names: set[str] = set()
    for seg in m.segments:
        what = "the resident segment" if seg.index < 0 else f"unit {seg.index} ({seg.name or '<root>'})"
        if seg.offset < end or seg.offset % ALIGN:
            raise ManifestError(
                f"{what} starts at offset {seg.offset}: segments start on {ALIGN}-byte boundaries, "
                "in order, after the previous one"
            )
        if seg.nbytes <= 0 or seg.nbytes % ALIGN or seg.offset + seg.nbytes > m.weights_size:
            raise ManifestError(
                f"{what} has length {seg.nbytes}: segment lengths are positive multiples of {ALIGN} "
                f"within the {m.weights_size}-byte weights file"
            )
        if not 0 <= seg.payload_bytes <= seg.nbytes:
            raise ManifestError(f"{what} has {seg.payload_bytes} payload bytes in a {seg.nbytes}-byte segment")
        if not _SHA256.match(seg.sha256):
            raise ManifestError(f"{what} has no valid SHA-256 ({seg.sha256[:20]!r})")
        end = seg.offset + seg.nbytes
        if not seg.tensors:
            raise ManifestError(f"{what} holds no tensors")
        for t in seg.tensors:
            _check_tensor(t, seg, what, places, names)


def _check_tensor(t: TensorLayout, seg: Segment, what: str, places: dict[str, str], names: set[str]) -> None:
    if t.name in names:
        raise ManifestError(f"tensor {t.name!r} is stored twice")
    names.add(t.name)
    if t.dtype not in DTYPES:
        raise ManifestError(f"tensor {t.name!r} in {what} has dtype {t.dtype!r}, not one of {', '.join(DTYPES)}")
    if t.kind not in ("param", "buffer"):
        raise ManifestError(f"tensor {t.name!r} in {what} has kind {t.kind!r}, not param or buffer")
    if any(d < 0 for d in t.shape):
        raise ManifestError(f"tensor {t.name!r} in {what} has a negative dimension in {list(t.shape)}")
    if t.stride is not None and storage_order(t.shape, t.stride) is None:
        raise ManifestError(
            f"tensor {t.name!r} in {what} has strides {list(t.stride)} that do not lay out "
            f"shape {list(t.shape)} densely"
        )
    if t.encoding is not None:
        _check_encoding(t, what)
        expected = t.nbytes
    else:
        expected = math.prod(t.shape) * DTYPES[t.dtype].itemsize
    if t.nbytes != expected:
        raise ManifestError(
            f"tensor {t.name!r} in {what} has {t.nbytes} bytes; {t.dtype} {list(t.shape)} needs {expected}"
        )
    if t.offset < 0 or t.offset + t.nbytes > seg.payload_bytes:
        raise ManifestError(
            f"tensor {t.name!r} in {what} lies at [{t.offset}, {t.offset + t.nbytes}), outside the "
            f"segment's {seg.payload_bytes} payload bytes"
        )
    if not t.places or not all(isinstance(p, str) and p for p in t.places):
        raise ManifestError(f"tensor {t.name!r} in {what} is bound nowhere (its places are {list(t.places)})")
    for place in t.places:
        if place in places:
            raise ManifestError(f"{place} is bound to both {places[place]!r} and {t.name!r}")
        places[place] = t.name


def _check_encoding(t: TensorLayout, what: str) -> None:
    """A quantized tensor: a type layerfit dequantizes, a floating dtype to bind, no
    strides, at least one dimension (two when transposed), rows a whole number of blocks,
    and exactly the bytes those blocks take."""
    from layerfit.store.ggml_types import SUPPORTED, ggml_type, tensor_nbytes

    enc = t.encoding
    assert enc is not None
    if enc.ggml not in SUPPORTED:
        raise ManifestError(f"tensor {t.name!r} in {what} is encoded as {enc.ggml!r}, not one of {', '.join(sorted(SUPPORTED))}")
    if not DTYPES[t.dtype].is_floating_point or t.stride is not None or len(t.shape) < 1 + enc.transposed:
        raise ManifestError(f"tensor {t.name!r} in {what} is quantized as a {t.dtype} {list(t.shape)} with strides {t.stride}")
    if enc.int4_rows:
        from layerfit.store.int4_form import BLOCK_ROWS, eligible, form_nbytes

        if enc.transposed or not eligible(enc.ggml, t.shape, enc.int4_rows):
            raise ManifestError(
                f"tensor {t.name!r} in {what}: a {enc.ggml} {list(t.shape)} weight cannot be stored for the int4 "
                f"kernel in blocks of {enc.int4_rows} rows (Q4_0/Q4_1/Q4_K [N, K], N a multiple of one of {BLOCK_ROWS}; "
                f"Q6_K [N, K], N at least that)"
            )
        expected = form_nbytes(enc.ggml, t.shape)
        if t.nbytes != expected:
            raise ManifestError(f"tensor {t.name!r} in {what} has {t.nbytes} bytes; its int4 form needs {expected}")
        return
    try:
        expected = tensor_nbytes(ggml_type(enc.ggml), t.block_shape)
    except ValueError as exc:
        raise ManifestError(f"tensor {t.name!r} in {what}: {exc}") from None
    if t.nbytes != expected:
        raise ManifestError(f"tensor {t.name!r} in {what} has {t.nbytes} bytes; {enc.ggml} {list(t.block_shape)} needs {expected}")


BUILT_IN_ATTENTION = ("eager", "sdpa", "flex_attention", "flash_attention_2", "flash_attention_3", "flash_attention_4")
"""The attention implementations a manifest (or a Hugging Face config) may name: those
built into transformers. Any other name, a Hub kernel's ``org/name`` above all, would
have transformers (with the ``kernels`` package) download and run that code."""


def check_attention(value: object) -> str:
    """``value`` if it names a built-in attention implementation; a ``ValueError`` (one
    line, listing them) for anything else."""
    if not isinstance(value, str) or value not in BUILT_IN_ATTENTION:
        raise ValueError(
            f"attention implementation {str(value)[:80]!r} is not one built into transformers "
            f"({', '.join(BUILT_IN_ATTENTION)}); layerfit never loads a Hub kernel a file names"
        )
    return value


def _model(value: Any) -> dict[str, Any]:
    """The manifest's ``model``: its source and name strings, its keyword arguments a
    mapping; a Hugging Face model's attention implementation (its own or its config's)
    a built-in one."""
    if not isinstance(value, dict) or not isinstance(value.get("kwargs", {}), dict):
        raise ValueError("model must be an object with source, name and kwargs")
    _text(value["source"])
    _text(value["name"])
    kwargs = value.get("kwargs", {}) if value.get("source") == "hf" else {}
    config = kwargs.get("config")
    for where in (kwargs, config if isinstance(config, dict) else {}):
        for key in ("attn_implementation", "_attn_implementation"):
            if where.get(key) is not None:
                check_attention(where[key])
    return dict(value)


def _file_name(value: Any) -> str:
    """``value`` if it is a plain file name (never a path out of the folder)."""
    if not isinstance(value, str) or Path(value).name != value or value in (".", "..", MANIFEST):
        raise ValueError(f"{value!r} is not a plain file name")
    return value


def _text(value: Any) -> str:
    """``value`` if it is a JSON string; a ``ValueError`` for anything else."""
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a string")
    return value


def _whole(value: Any) -> int:
    """``value`` if it is a JSON whole number of at most 63 bits; a ``ValueError`` for a
    fraction (an offset of ``12288.7``), a boolean, a string or a number past any file."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not a whole number")
    if abs(value) >= 2**63:
        raise ValueError("a number larger than any file or tensor")
    return value


def check_weights_header(m: Manifest, path: Path) -> None:
    """Raise unless the safetensors header of the weights file at ``path`` places every
    tensor of the manifest where the manifest does (dtype, shape, byte range).

    A missing or short file is left to :class:`~layerfit.store.reader.SegmentReader`,
    which names it; the header is covered by no segment checksum, so this is also what
    finds it damaged.
    """
    from layerfit.errors import CorruptStoreError

    if not path.is_file():  # missing, or a FIFO whose open would wait forever: the reader names it
        return
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(0)
            if size != m.weights_size or size < 8:
                return  # the reader reports a truncated or replaced file
            (length,) = struct.unpack("<Q", fh.read(8))
            if length > size - 8:
                raise CorruptStoreError(
                    f"weights file {path} has a header of {length} bytes in a {size}-byte file: "
                    "the file is corrupt (prepare the model again)"
                )
            raw = fh.read(length)
    except FileNotFoundError:
        return  # the reader names the missing file
    except OSError as exc:
        raise CorruptStoreError(f"cannot read weights file {path}: {exc.strerror or exc}") from exc
    try:
        header = json.loads(raw)
        if not isinstance(header, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptStoreError(
            f"weights file {path} has a corrupt safetensors header ({exc}): prepare the model again"
        ) from exc
    data_start = 8 + length
    stored = {t.name for seg in m.segments for t in seg.tensors}
    extra = sorted(k for k in header if k != "__metadata__" and not k.startswith("__pad_") and k not in stored)
    if extra:
        raise ManifestError(
            f"weights file {path} holds tensors the manifest does not ({', '.join(extra[:5])}"
            f"{' ...' if len(extra) > 5 else ''}): the manifest was edited or belongs to another "
            "model; prepare the model again"
        )
    for seg in m.segments:
        for t in seg.tensors:
            begin = seg.offset - data_start + t.offset
            want = {"dtype": t.safetensors_dtype, "shape": list(t.storage_shape), "data_offsets": [begin, begin + t.nbytes]}
            entry = header.get(t.name)
            got = {k: entry.get(k) for k in want} if isinstance(entry, dict) else None
            if got != want:
                raise ManifestError(
                    f"the manifest and weights file {path} disagree about tensor {t.name!r} "
                    f"(manifest {want}, file {got}): one of them was edited or replaced; prepare "
                    "the model again"
                )
