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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from layerfit.capture.graph import ModelGraph
from layerfit.errors import ManifestError

FORMAT = "layerfit-prepared"
VERSION = 1
MANIFEST = "manifest.json"
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


def align_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class TensorLayout:
    """Where one tensor lies inside its segment and where it is bound in the model."""

    name: str
    kind: str  # param or buffer
    dtype: str
    shape: tuple[int, ...]
    offset: int  # from the segment's start
    nbytes: int
    places: tuple[str, ...]  # "module.attr" paths the tensor is bound to

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


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
                }
                for t in self.tensors
            ],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Segment:
        return cls(
            index=int(d["index"]),
            name=str(d["name"]),
            module_type=str(d["module_type"]),
            offset=int(d["offset"]),
            nbytes=int(d["nbytes"]),
            payload_bytes=int(d["payload_bytes"]),
            sha256=str(d["sha256"]),
            d=int(d.get("d", 0)),
            f=int(d.get("f", 0)),
            tensors=tuple(
                TensorLayout(
                    name=t["name"],
                    kind=t["kind"],
                    dtype=t["dtype"],
                    shape=tuple(int(x) for x in t["shape"]),
                    offset=int(t["offset"]),
                    nbytes=int(t["nbytes"]),
                    places=tuple(t["places"]),
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": self.model,
            "seed": self.seed,
            "input": {"shape": list(self.input_shape), "dtype": self.input_dtype},
            "weights": {"file": self.weights_file, "size": self.weights_size, "alignment": ALIGN},
            "resident": self.resident.to_dict() if self.resident else None,
            "units": [u.to_dict() for u in self.units],
            "graph": self.graph.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        if d.get("format") != FORMAT:
            raise ManifestError(f"not a layerfit prepared model (format {d.get('format')!r})")
        if d.get("version") != VERSION:
            raise ManifestError(
                f"prepared model has format version {d.get('version')!r}, this layerfit reads "
                f"version {VERSION}: prepare the model again with this version"
            )
        try:
            return cls(
                model=dict(d["model"]),
                seed=int(d.get("seed", 0)),
                input_shape=tuple(int(x) for x in d["input"]["shape"]),
                input_dtype=str(d["input"]["dtype"]),
                weights_file=str(d["weights"]["file"]),
                weights_size=int(d["weights"]["size"]),
                resident=Segment.from_dict(d["resident"]) if d.get("resident") else None,
                units=tuple(Segment.from_dict(u) for u in d["units"]),
                graph=ModelGraph.from_dict(d["graph"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"manifest is malformed ({type(exc).__name__}: {exc})") from exc


def read_manifest(directory: str | Path) -> Manifest:
    """Load and validate ``DIR/manifest.json``; a clear error if anything is off."""
    path = Path(directory) / MANIFEST
    if not Path(directory).is_dir():
        raise ManifestError(f"{directory} is not a directory (create one with `layerfit prepare`)")
    if not path.is_file():
        raise ManifestError(f"{path} is missing: {directory} is not a prepared model")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ManifestError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ManifestError(f"{path} does not hold a JSON object")
    manifest = Manifest.from_dict(data)
    name = Path(manifest.weights_file).name
    if name != manifest.weights_file:  # never follow a path out of the model folder
        raise ManifestError(f"weights file {manifest.weights_file!r} must be a plain file name")
    return manifest
