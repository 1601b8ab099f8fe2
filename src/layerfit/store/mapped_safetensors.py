"""Safetensors checkpoints read in place: every tensor a view of the memory-mapped file.

A Hugging Face folder's weights (``model.safetensors``, or shards listed by
``model.safetensors.index.json``) are opened here without reading their data: each
tensor is a zero-copy view of a private (copy-on-write) mapping of its file, so the
kernel brings its pages in when the model touches them and may drop them again under
memory pressure. That is what lets ``prepare`` handle a model larger than memory.

Every header is checked before anything is mapped: a truncated or corrupt file, a
header whose sizes or offsets lie about the data, an index naming a shard that is not
there or a tensor its shard does not hold — each is one :class:`CheckpointError` line.
Nothing is unpickled: only safetensors files are read.

Every file of the folder is opened through :class:`~.folder_files.FolderFiles`.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from layerfit import strict_json
from layerfit.errors import CheckpointError, InputError
from layerfit.store.folder_files import FolderFiles, LinkOutOfFolderError

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
MAX_HEADER = 100 * 2**20  # the safetensors library's own limit

# safetensors' dtype names → torch dtypes layerfit stores (fp8 and friends are refused).
_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors header: where its bytes lie in its file."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute file offset of its first byte
    nbytes: int


class MappedFile:
    """One safetensors file of a folder: its checked header, and its tensors as views of
    a mapping of the very file whose header was checked (opened once)."""

    def __init__(self, files: FolderFiles, name: str) -> None:
        self.path = files.folder / name
        with _as_checkpoint_error():
            fd = files.open(name)
        try:
            st = os.fstat(fd)
            self.mode = stat.S_IMODE(st.st_mode)
            with os.fdopen(os.dup(fd), "rb") as fh:
                self.entries = read_header(self.path, fh, st.st_size)
            # Private: a model that writes to a weight gets its own page, never the file.
            self._map = mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            raise CheckpointError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        finally:
            os.close(fd)

    def tensor(self, name: str) -> torch.Tensor:
        """``name`` as a view of the file's pages (nothing read until it is touched)."""
        entry = self.entries[name]
        if entry.nbytes == 0:
            return torch.empty(entry.shape, dtype=entry.dtype)
        flat = torch.frombuffer(self._map, dtype=entry.dtype, count=math.prod(entry.shape), offset=entry.start)
        return flat.view(entry.shape)


def read_header(path: Path, fh: Any, size: int) -> dict[str, TensorEntry]:
    """The tensors of the safetensors file ``fh`` of ``size`` bytes (named ``path``), every
    claim of its header checked against the file: a one-line :class:`CheckpointError` for
    anything that does not hold."""
    try:
        head = fh.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path} is not a safetensors file: it is only {size} bytes long")
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER or 8 + length > size:
            raise CheckpointError(
                f"{path} is truncated or not a safetensors file (its header claims {length:,} bytes; "
                f"the file has {size:,})"
            )
        raw = fh.read(length)
    except OSError as exc:
        raise CheckpointError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        header = strict_json.parse(raw, str(path), MAX_HEADER)
    except strict_json.JSONTextError:
        raise CheckpointError(f"{path} is corrupt: its header is not JSON") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} is corrupt: its header is not a JSON object")
    data_start, data_size = 8 + length, size - 8 - length
    entries: dict[str, TensorEntry] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        entries[name] = _entry(path, name, info, data_start, data_size)
    spans = sorted((e.start, e.start + e.nbytes, e.name) for e in entries.values() if e.nbytes)
    for (_, end, first), (start, _, second) in zip(spans, spans[1:], strict=False):
        if start < end:
            raise CheckpointError(f"{path} is corrupt: tensors {first} and {second} overlap")
    return entries


def _entry(path: Path, name: str, info: object, data_start: int, data_size: int) -> TensorEntry:
    """One header entry, checked: a dtype layerfit reads, a shape, offsets inside the file
    that hold exactly the bytes the shape needs."""
    where = f"{path}: tensor {name}"
    if not isinstance(info, dict):
        raise CheckpointError(f"{where} has no valid header entry")
    dtype = _DTYPES.get(info.get("dtype"))  # type: ignore[arg-type]
    if dtype is None:
        raise CheckpointError(
            f"{where} has dtype {info.get('dtype')!r}, which layerfit does not read ({', '.join(_DTYPES)})"
        )
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise CheckpointError(f"{where} has no valid shape ({shape!r})")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        and 0 <= offsets[0] <= offsets[1]
    ):
        raise CheckpointError(f"{where} has no valid data offsets ({offsets!r})")
    begin, end = offsets
    needed = math.prod(shape) * dtype.itemsize
    if end - begin != needed:
        raise CheckpointError(
            f"{where}: its header claims {end - begin:,} bytes, but shape {shape} of {info['dtype']} "
            f"needs {needed:,} (the header lies about its size)"
        )
    if end > data_size:
        raise CheckpointError(
            f"{path} is truncated: tensor {name} ends at byte {data_start + end:,} and the file has "
            f"{data_start + data_size:,}"
        )
    return TensorEntry(name, dtype, tuple(shape), data_start + begin, needed)


class Checkpoint:
    """A folder's weights: one ``model.safetensors`` or the shards of its index."""

    def __init__(self, folder: Path, follow_links_out: bool = False) -> None:
        self.folder = folder
        self.files: list[MappedFile] = []
        self._where: dict[str, MappedFile] = {}
        source = FolderFiles(folder, follow_links_out)
        index = folder / INDEX
        if index.is_file():
            shards = _read_index(source)
            for shard, names in shards.items():
                mapped = MappedFile(source, shard)
                absent = sorted(set(names) - set(mapped.entries))
                if absent:
                    raise CheckpointError(
                        f"{INDEX} places {absent[0]}{f' (and {len(absent) - 1} more)' if len(absent) > 1 else ''} "
                        f"in {shard}, which does not hold it"
                    )
                self.files.append(mapped)
                for name in names:
                    self._where[name] = mapped
        elif (folder / SINGLE).is_file():
            mapped = MappedFile(source, SINGLE)
            self.files.append(mapped)
            self._where = dict.fromkeys(mapped.entries, mapped)
        else:
            pickled = sorted(p.name for p in folder.glob("*") if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
            raise CheckpointError(
                f"{folder} holds no {SINGLE} and no {INDEX}"
                + (
                    f" (only {', '.join(pickled[:3])}: layerfit reads safetensors, never pickle; convert "
                    "with transformers' save_pretrained(..., safe_serialization=True))"
                    if pickled else ""
                )
            )

    def names(self) -> list[str]:
        return list(self._where)

    def entry(self, name: str) -> TensorEntry:
        return self._where[name].entries[name]

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor as a view of its file's mapping."""
        for name, mapped in self._where.items():
            yield name, mapped.tensor(name)

    @property
    def mode(self) -> int:
        """The permission bits every weights file allows (a prepared copy gets no more)."""
        bits = 0o7777
        for mapped in self.files:
            bits &= mapped.mode
        return bits

    @property
    def elements(self) -> int:
        """How many numbers the weights hold, every tensor counted."""
        return sum(math.prod(self.entry(n).shape) for n in self._where)

    @property
    def nbytes(self) -> int:
        return sum(self.entry(n).nbytes for n in self._where)

    def stored_dtype(self) -> torch.dtype | None:
        """The floating dtype holding most of the weights' bytes (None: no floating tensor)."""
        by_dtype: dict[torch.dtype, int] = {}
        for name in self._where:
            e = self.entry(name)
            if e.dtype.is_floating_point:
                by_dtype[e.dtype] = by_dtype.get(e.dtype, 0) + e.nbytes
        return max(by_dtype, key=by_dtype.__getitem__) if by_dtype else None


@contextlib.contextmanager
def _as_checkpoint_error() -> Iterator[None]:
    """A folder file that cannot be read, as the checkpoint's :class:`CheckpointError`; a
    link out of the folder stays a :class:`LinkOutOfFolderError` (its own refusal)."""
    try:
        yield
    except LinkOutOfFolderError:
        raise
    except InputError as exc:
        raise CheckpointError(str(exc)) from None


def _read_index(files: FolderFiles) -> dict[str, list[str]]:
    """Shard file name → the tensor names the folder's index places in it; every shard a
    plain file name in the folder that exists."""
    index = files.folder / INDEX
    with _as_checkpoint_error():
        data = files.json(INDEX)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index} has no weight_map naming the shards")
    shards: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or Path(shard).name != shard or not shard.endswith(".safetensors"):
            raise CheckpointError(f"{index} places {name} in {shard!r}, which is not a .safetensors file name in the folder")
        shards.setdefault(shard, []).append(name)
    missing = sorted(s for s in shards if not (index.parent / s).is_file())
    if missing:
        raise CheckpointError(f"{index} names shard {missing[0]}, which is not in {index.parent}")
    return shards
