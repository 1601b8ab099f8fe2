"""Write a prepared model: ``prepare(MODEL, DIR)``.

Weights enter from the module itself or from a safetensors checkpoint (never pickle).
The directory is written under a temporary name and renamed into place, so a failure
at any point leaves nothing behind, and an existing directory is replaced only with
``force``.

What ``prepare`` does beside the output, and the rules it keeps there:

- one run at a time per output: a lock file ``.OUT.layerfit-lock`` held with ``flock``
  for the whole write (a second run refuses in one line), and whether ``OUT`` may be
  replaced is decided again at the rename, under that lock (an ``OUT`` that appeared
  meanwhile is replaced only with ``force``; the rename itself never replaces);
- every temporary folder it makes (``.OUT.layerfit-DIGEST.tmp``, and the ``.old`` one an
  existing output is moved into) holds, written first, a marker with a random token
  whose digest is the name's: only a folder proven so, owned by this user, is ever
  removed, found by listing the parent and comparing names as strings (never a glob
  built from the output's name);
- SIGTERM, SIGINT or SIGHUP (unless ignored) while it writes removes the temporary
  folder and the lock, then the signal takes its usual course; one SIGKILL left is removed by the next ``prepare`` of
  that output, and reported (with its size and how to remove it) by ``prepare`` of
  another output in that folder and by ``layerfit verify``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import stat
import struct
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from layerfit.capture import capture
from layerfit.capture.graph import ModelGraph
from layerfit.errors import (
    CheckpointError,
    InputError,
    LayerfitError,
    OutputExistsError,
    OutputPathError,
    UnknownModelError,
)
from layerfit.sizes import format_bytes
from layerfit.store.examples import example_call, example_input  # noqa: F401 (re-exported)
from layerfit.store.hf_folder import (
    CONFIG,
    PREFIX,
    Example,
    HFOptions,
    copy_files,
    derive_example,
    gguf_hint,
    is_hf,
    load_model,
)
from layerfit.store.manifest import (
    ALIGN,
    DTYPES,
    MANIFEST,
    SAFETENSORS_DTYPES,
    TENSOR_ALIGN,
    WEIGHTS,
    Manifest,
    Segment,
    TensorLayout,
    align_up,
    storage_order,
)
from layerfit.store.model_spec import ModelSpec, resolve
from layerfit.store.outputs import current_umask
from layerfit.store.shape_samples import measure_shapes

Progress = Callable[[int, int], None]


def _state_by_id(model: nn.Module) -> dict[int, torch.Tensor]:
    out = {}
    for _, module in model.named_modules(remove_duplicate=False):
        for t in list(module._parameters.values()) + list(module._buffers.values()):
            if t is not None:
                out[id(t)] = t
    return out


def _lookup(model: nn.Module, place: str) -> torch.Tensor:
    module_name, _, attr = place.rpartition(".")
    module = model.get_submodule(module_name) if module_name else model
    t = module._parameters.get(attr)
    if t is None:
        t = module._buffers.get(attr)
    return t


def load_checkpoint(
    model: nn.Module, path: str | Path, graph_places: dict[str, list[str]], unused: Iterable[str] = ()
) -> None:
    """Copy tensors from a safetensors checkpoint into ``model``, checking every name.

    ``graph_places`` maps each stored tensor name to every "module.attr" it is bound at;
    a checkpoint may carry a tied tensor under any of them. ``unused`` names tensors of
    modules that never run: the model has them but does not store them, so a checkpoint
    (a full ``state_dict``) may carry them and they are skipped.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if path.suffix != ".safetensors":
        raise CheckpointError(f"{path}: only .safetensors checkpoints are read (never pickle)")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
    missing, wrong, used = [], [], set()
    for name, places in graph_places.items():
        key = next((p for p in [name, *places] if p in tensors), None)
        target = _lookup(model, places[0] if places else name)
        if key is None:
            missing.append(name)
            continue
        used.add(key)
        if tuple(tensors[key].shape) != tuple(target.shape):
            wrong.append(f"{key} {tuple(tensors[key].shape)} (model: {tuple(target.shape)})")
            continue
        with torch.no_grad():
            target.copy_(tensors[key].to(target.dtype))
    unexpected = sorted(set(tensors) - used - set(unused))
    problems = []
    if missing:
        problems.append(f"missing tensors: {', '.join(missing[:10])}" + (" ..." if len(missing) > 10 else ""))
    if wrong:
        problems.append(f"wrong shapes: {', '.join(wrong[:10])}" + (" ..." if len(wrong) > 10 else ""))
    if unexpected:
        problems.append(
            f"tensors the model does not have: {', '.join(unexpected[:10])}"
            + (" ..." if len(unexpected) > 10 else "")
        )
    if problems:
        raise CheckpointError(f"checkpoint {path} does not match the model: " + "; ".join(problems))


def _layout(items: list[tuple[torch.Tensor, TensorLayout]], start: int) -> tuple[int, list]:
    """Offsets of tensors packed at TENSOR_ALIGN; returns (payload end, placed items)."""
    placed, pos = [], 0
    for tensor, lay in items:
        pos = align_up(pos, TENSOR_ALIGN)
        placed.append((tensor, lay, pos))
        pos += lay.nbytes
    return pos, placed


def _write_weights(
    path: Path, groups: list[tuple[int, str, str, list[tuple[torch.Tensor, TensorLayout]], int, int]],
    progress: Progress | None,
) -> list[Segment]:
    """Write the safetensors file; ``groups`` are (index, name, type, tensors, d, f)."""
    # First pass: offsets relative to the data section, each segment ALIGN-aligned.
    plans, pos = [], 0
    for index, name, mtype, items, d, f in groups:
        payload, placed = _layout(items, 0)
        nbytes = max(align_up(payload, ALIGN), ALIGN)
        plans.append((index, name, mtype, placed, payload, nbytes, pos, d, f))
        pos += nbytes
    data_size = pos
    header: dict[str, Any] = {"__metadata__": {"format": "pt", "layerfit": "prepared-v1"}}
    pad = 0

    def add_pad(begin: int, end: int) -> None:
        nonlocal pad
        if end > begin:
            header[f"__pad_{pad}"] = {"dtype": "U8", "shape": [end - begin], "data_offsets": [begin, end]}
            pad += 1

    for _, _, _, placed, _, nbytes, seg_start, _, _ in plans:
        cursor = seg_start
        for _tensor, lay, off in placed:
            add_pad(cursor, seg_start + off)
            header[lay.name] = {
                "dtype": SAFETENSORS_DTYPES[lay.dtype],
                "shape": list(lay.storage_shape),
                "data_offsets": [seg_start + off, seg_start + off + lay.nbytes],
            }
            cursor = seg_start + off + lay.nbytes
        add_pad(cursor, seg_start + nbytes)
    raw = json.dumps(header, separators=(",", ":")).encode()
    data_start = align_up(8 + len(raw), ALIGN)
    raw += b" " * (data_start - 8 - len(raw))  # safetensors allows trailing spaces

    segments = []
    done = 0
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for index, name, mtype, placed, payload, nbytes, seg_start, d, f in plans:
            # Straight from each tensor's memory to the file and the hash: no copy of the
            # segment is made, so preparing needs little more than the model itself
            # (a copy of vgg16's 411 MB fc6 and its bytes once doubled the peak).
            digest, cursor = hashlib.sha256(), 0
            for tensor, lay, off in placed:
                _write_hashed(fh, digest, bytes(off - cursor))
                flat = tensor.detach().contiguous().reshape(-1).cpu().view(torch.uint8)
                _write_hashed(fh, digest, memoryview(flat.numpy()))
                cursor = off + lay.nbytes
            _write_hashed(fh, digest, bytes(nbytes - cursor))
            segments.append(
                Segment(
                    index=index,
                    name=name,
                    module_type=mtype,
                    offset=data_start + seg_start,
                    nbytes=nbytes,
                    payload_bytes=payload,
                    sha256=digest.hexdigest(),
                    tensors=tuple(TensorLayout(**{**lay.__dict__, "offset": off}) for _, lay, off in placed),
                    d=d,
                    f=f,
                )
            )
            done += nbytes
            if progress:
                progress(done, data_size)
        fh.flush()
        os.fsync(fh.fileno())
    return segments


def _write_hashed(fh: Any, digest: Any, data: bytes | memoryview) -> None:
    """Write ``data`` to ``fh`` (all of it) and add it to ``digest``."""
    if len(data):
        fh.write(data)
        digest.update(data)


def _stored(t: torch.Tensor, lay: TensorLayout) -> tuple[torch.Tensor, TensorLayout]:
    """``t`` as its bytes are stored, and its layout: a tensor in another dense layout than
    row-major (channels-last, transposed) keeps it, in memory order with its strides, so
    the engine binds it as the model holds it; any other is stored row-major."""
    if t.is_contiguous() or t.numel() == 0:
        return t, lay
    order = storage_order(tuple(t.shape), tuple(t.stride()))
    if order is None:  # gaps or overlaps: row-major, the same values
        return t, lay
    return t.permute(order), TensorLayout(**{**lay.__dict__, "stride": tuple(t.stride())})


def _groups(model: nn.Module, graph: ModelGraph) -> list:
    groups = []
    if graph.resident:
        items = []
        for r in graph.resident:
            t = _lookup(model, r.places[0])
            items.append(_stored(t, TensorLayout(r.name, r.kind, r.dtype, r.shape, 0, r.nbytes, r.places)))
        groups.append((-1, "<resident>", "resident", items, len(items), 0))
    for u in graph.units:
        items = []
        for p in u.params:
            place = f"{u.name}.{p.attr}" if u.name else p.attr
            t = _lookup(model, place)
            items.append(_stored(t, TensorLayout(p.name, p.kind, p.dtype, p.shape, 0, p.nbytes, (place,))))
        groups.append((u.index, u.name, u.module_type, items, u.d, u.f))
    return groups


def prepare(
    model: str | ModelSpec,
    out_dir: str | Path,
    *,
    input_shape: tuple[int, ...] | None = None,
    input_dtype: str = "float32",
    checkpoint: str | Path | None = None,
    force: bool = False,
    seed: int = 0,
    progress: Progress | None = None,
    module: nn.Module | None = None,
    example: Any = None,
    hf: HFOptions | None = None,
) -> Manifest:
    """Build, capture and pack ``model`` into ``out_dir``; returns the manifest.

    ``module``, when given, is the already-built model whose weights are packed (it must
    come from the same factory and arguments, which rebuild its skeleton later);
    otherwise the spec builds it (seeded zoo weights, or the factory's own).
    ``example``, when given, is the capture's input instead of a seeded one of
    ``input_shape``: a tensor, a tuple of tensors or a dict of keyword arguments, for a
    model that needs more than one input (an encoder-decoder's ``input_features`` and
    ``decoder_input_ids``); the manifest records its first tensor's shape and dtype.
    ``model`` ``"hf:FOLDER"`` is a local Hugging Face folder as published
    (:mod:`layerfit.store.hf_folder`; ``hf`` says which class, input length and dtype).
    """
    out = Path(out_dir)
    if is_hf(model):
        if checkpoint is not None or input_shape is not None or module is not None:
            raise InputError("a Hugging Face folder brings its weights and derives its input: leave out "
                             "--checkpoint and --input-shape (--seq-len sets the input's length)")
        return _prepare_hf(Path(str(model)[len(PREFIX):]), out, hf or HFOptions(), example, force, seed, progress)
    spec = _resolve(model) if isinstance(model, str) else model
    _check_output_dir(out, force)
    _check_seed(seed)
    if example is not None:
        shape, input_dtype = _first_tensor(example)
    else:
        shape = tuple(input_shape or spec.input_shape or ())
    if not shape:
        raise InputError(f"{spec.name} has no default input shape: pass --input-shape, e.g. 1,3,224,224")
    was_training = module.training if module is not None else False
    module = (module if module is not None else spec.build(seed=seed)).eval()
    try:
        x = example if example is not None else example_input(shape, input_dtype, seed)
        graph = capture(module, x)
        _check_dtypes(graph)
        if checkpoint is not None:
            places: dict[str, list[str]] = {}
            for r in graph.resident:
                places[r.name] = list(r.places)
            for u in graph.units:
                for p in u.params:
                    places.setdefault(p.name, []).append(f"{u.name}.{p.attr}" if u.name else p.attr)
            load_checkpoint(module, checkpoint, places, graph.unused)
        fields = {"model": spec.to_dict(), "seed": seed, "input_shape": shape, "input_dtype": input_dtype,
                  "input_keywords": _keywords(example)}
        return _pack(out, module, graph, fields, progress, force=force)
    finally:
        module.train(was_training)


def _resolve(model: str) -> ModelSpec:
    """The spec ``model`` names; a name that is no model but a path says what it is (a
    GGUF file, a Hugging Face folder given without ``hf:``)."""
    try:
        return resolve(model)
    except UnknownModelError:
        path = Path(model)
        hint = gguf_hint(path)
        if hint:
            raise InputError(hint) from None
        if path.is_dir() and (path / CONFIG).is_file():
            raise InputError(
                f"{model} is a Hugging Face model folder: name it hf:{model} (`layerfit prepare hf:{model} -o OUT`)"
            ) from None
        raise


def _prepare_hf(
    folder: Path, out: Path, options: HFOptions, example: Any, force: bool, seed: int, progress: Progress | None
) -> Manifest:
    """``prepare("hf:FOLDER", out)``: transformers builds the model with every weight a view
    of the folder's files, the capture pass pages each in as it runs, and the writer
    copies each from the page cache to the prepared file; the folder's config, tokenizer
    and generation settings are copied beside it."""
    _check_output_dir(out, force)
    _check_seed(seed)
    loaded = load_model(folder, options, _free_space(out))
    derived = Example(example, {}) if example is not None else derive_example(loaded.module, options.seq_len, seed)
    shape, input_dtype = _first_tensor(derived.value)
    graph = capture(loaded.module, derived.value)
    _check_dtypes(graph)
    if loaded.unused:
        names = loaded.unused
        warnings.warn(
            f"{folder}: {loaded.class_name} does not use {len(names)} checkpoint tensor{'s' * (len(names) > 1)}, "
            f"left out: {', '.join(names[:6])}{' ...' if len(names) > 6 else ''}",
            stacklevel=3,
        )
    variable = None
    if derived.axes and options.variable_shapes:  # a derived text input: measure its passes at other shapes too
        variable = measure_shapes(loaded.module, derived.value, derived.axes, derived.ranges, derived.limits, seed)
    fields = {
        "model": loaded.spec, "seed": seed, "input_shape": shape, "input_dtype": input_dtype,
        "input_keywords": _keywords(derived.value),
        "input_ranges": tuple((name, low, high) for name, (low, high) in derived.ranges.items()),
        "variable_shapes": variable,
    }
    try:  # the prepared files come from the config and the weights: they get no wider bits
        mode = loaded.checkpoint.mode & stat.S_IMODE((folder / CONFIG).stat().st_mode)
    except OSError:
        mode = 0o600
    return _pack(out, loaded.module, graph, fields, progress,
                 lambda tmp: copy_files(folder, tmp, options.follow_symlinks_out), mode, force=force)


def _free_space(out: Path) -> int | None:
    """Free bytes on the file system ``out`` will be written to (its nearest existing folder)."""
    for folder in (out.absolute().parent, *out.absolute().parent.parents):
        if folder.is_dir():
            try:
                return shutil.disk_usage(folder).free
            except OSError:
                return None
    return None


def _check_seed(seed: object) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not -(2**63) <= seed < 2**64:
        raise InputError(f"seed {seed!r} is not a 64-bit integer: use a whole number such as 0 or 1234")


def _pack(
    out: Path,
    module: nn.Module,
    graph: ModelGraph,
    fields: dict[str, Any],
    progress: Progress | None,
    copy: Callable[[Path], tuple[str, ...]] | None = None,
    mode: int = 0o666,
    *,
    force: bool = False,
) -> Manifest:
    """Write ``module``'s weights as ``graph`` places them, and the manifest of ``fields``,
    into a temporary folder renamed to ``out`` when complete; nothing is kept on failure
    or on a signal that stops the process. ``mode`` bounds who may read the written files
    (the bits of the files they come from; the owner keeps write). See the module
    docstring for the lock."""
    try:
        with _stopped_by_signals():
            return _pack_locked(out, module, graph, fields, progress, copy, mode, force)
    except _Stopped as stopped:
        signum = stopped.signum
    raise _signalled(signum)


def _pack_locked(
    out: Path,
    module: nn.Module,
    graph: ModelGraph,
    fields: dict[str, Any],
    progress: Progress | None,
    copy: Callable[[Path], tuple[str, ...]] | None,
    mode: int,
    force: bool,
) -> Manifest:
    """:func:`_pack`'s work, under the output's lock."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(f"cannot create {out}: {exc.strerror or exc} (choose another directory)") from exc
    with _output_lock(out):
        _remove_stale_temporaries(out)
        try:
            tmp = make_temporary(out, "tmp")
            os.chmod(tmp, 0o777 & ~current_umask())  # made private to its owner until marked
        except OSError as exc:
            raise OutputPathError(f"cannot create {out}: {exc.strerror or exc} (choose another directory)") from exc
        try:
            segments = _write_weights(tmp / WEIGHTS, _groups(module, graph), progress)
            resident = segments[0] if graph.resident else None
            units = tuple(segments[1:] if graph.resident else segments)
            files = copy(tmp) if copy is not None else ()
            manifest = Manifest(
                **fields,
                weights_file=WEIGHTS,
                weights_size=(tmp / WEIGHTS).stat().st_size,
                resident=resident,
                units=units,
                graph=graph,
                files=files,
            )
            (tmp / MANIFEST).write_text(json.dumps(manifest.to_dict(), indent=1))
            for name in (WEIGHTS, MANIFEST):  # readable by no more users than the sources; the owner may write
                os.chmod(tmp / name, 0o666 & ~current_umask() & (mode | 0o200))
            _replace_dir(tmp, out, force)
        except OSError as exc:  # disk full, quota, I/O error: one line, and nothing kept
            shutil.rmtree(tmp, ignore_errors=True)
            free = shutil.disk_usage(out.parent).free
            raise OutputPathError(
                f"cannot write {out}: {exc.strerror or exc} ({format_bytes(free)} free on its file system); "
                "nothing was kept"
            ) from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return manifest


def _keywords(example: Any) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    """(name, shape, dtype) of each tensor of an example of keyword arguments; none when
    one has a dtype :func:`example_input` cannot make (then the default call is the
    first tensor alone)."""
    if not isinstance(example, dict):
        return ()
    keywords = tuple(
        (str(name), tuple(value.shape), str(value.dtype).removeprefix("torch."))
        for name, value in example.items()
        if isinstance(value, torch.Tensor)
    )
    return keywords if all(dtype in DTYPES for _, _, dtype in keywords) else ()


def _first_tensor(example: Any) -> tuple[tuple[int, ...], str]:
    """Shape and dtype name of an example input's first tensor (what the manifest keeps)."""
    values = example.values() if isinstance(example, dict) else example if isinstance(example, (tuple, list)) else [example]
    for value in values:
        if isinstance(value, torch.Tensor):
            name = str(value.dtype).removeprefix("torch.")
            if name not in DTYPES:
                raise InputError(f"the example's first tensor has dtype {name}: use one of {', '.join(DTYPES)}")
            return tuple(value.shape), name
    raise InputError(
        "the example input holds no tensor: give a tensor, a tuple of tensors or a dict of keyword "
        "arguments with at least one tensor"
    )


def _check_dtypes(graph: ModelGraph) -> None:
    """Refuse, before anything is written, a tensor of a dtype the store cannot hold
    (complex, float8, quantized): one line naming it and the dtypes it can."""
    specs = [(r.name, r.dtype) for r in graph.resident] + [(p.name, p.dtype) for u in graph.units for p in u.params]
    for name, dtype in specs:
        if dtype not in SAFETENSORS_DTYPES:
            raise InputError(
                f"tensor {name} has dtype {dtype}, which layerfit cannot store (it stores "
                f"{', '.join(SAFETENSORS_DTYPES)}): convert it before prepare, or keep it out of the model's "
                "parameters and buffers"
            )


def _check_output_dir(out: Path, force: bool) -> None:
    """Raise unless ``out`` may become the prepared model: it does not exist, or ``force``
    is given and it is a prepared model (or an empty directory) — never a file, a link,
    the working directory or a folder holding anything else, which ``--force`` would
    otherwise delete."""
    if not (out.exists() or out.is_symlink()):
        ancestor = next((a for a in out.absolute().parents if a.exists()), None)
        if ancestor is not None and not ancestor.is_dir():
            raise OutputPathError(f"cannot create {out}: {ancestor} is a file, not a folder")
        return
    if not force:
        raise OutputExistsError(f"{out} already exists: choose another directory or pass --force")
    refuse = f"{out} is not a prepared model, so --force leaves it alone: choose another directory"
    if out.is_symlink() or not out.is_dir():
        raise OutputExistsError(f"{refuse} (it is {'a link' if out.is_symlink() else 'a file'})")
    here = Path.cwd().resolve()
    if out.resolve() == here or out.resolve() in here.parents:
        raise OutputExistsError(f"{refuse} (it is or holds the working directory)")
    try:
        entries = set(os.listdir(out))
    except OSError as exc:
        raise OutputExistsError(f"{out} cannot be listed ({exc.strerror or exc}): choose another directory") from exc
    ours = {MANIFEST, WEIGHTS, MARKER, *_copied_files(out / MANIFEST)}
    if entries and (MANIFEST not in entries or entries - ours):
        foreign = sorted(entries - ours) or [f"no {MANIFEST}"]
        raise OutputExistsError(f"{refuse} (it holds {', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''})")


def _copied_files(manifest: Path) -> set[str]:
    """The files a prepared folder's manifest says prepare copied (none if unreadable)."""
    try:
        files = json.loads(manifest.read_text()).get("files", [])
    except (OSError, ValueError, UnicodeDecodeError, RecursionError, AttributeError):
        return set()
    return {f for f in files if isinstance(f, str) and Path(f).name == f} if isinstance(files, list) else set()


MARKER = ".layerfit-prepare"
"""Written first into every temporary folder ``prepare`` makes: a random token (whose
digest the folder's name carries), the writer's process id and the output's name."""
LOCK = ".layerfit-lock"  # ".OUT" + LOCK beside the output: held with flock while prepare writes OUT
_DIGEST = 16  # hex digits of the token's SHA-256 in a temporary folder's name
_TAIL = re.compile(rf"\.layerfit-([0-9a-f]{{{_DIGEST}}})\.(tmp|old)")
_TAIL_LENGTH = len(".layerfit-") + _DIGEST + len(".tmp")


class OutputBusyError(OutputExistsError):
    """Another ``prepare`` is writing the same output now."""


class PrepareStoppedError(LayerfitError):
    """A ``prepare`` stopped by a signal whose handler did not end the process."""


@dataclass(frozen=True)
class Temporary:
    """A temporary folder proven to be one ``prepare`` made (see :func:`proven_temporary`)."""

    path: Path
    output: str  # the name of the output it was made for, beside it
    pid: int  # the process that made it

    @property
    def size(self) -> int:
        """Bytes of the files in it (links not followed)."""
        total = 0
        for root, _, names in os.walk(self.path):
            for name in names:
                with contextlib.suppress(OSError):
                    st = os.lstat(os.path.join(root, name))
                    total += st.st_size if stat.S_ISREG(st.st_mode) else 0
        return total


def make_temporary(out: Path, kind: str) -> Path:
    """A new folder ``.OUT.layerfit-DIGEST.KIND`` beside ``out``, private, whose marker
    (written before anything else) proves it ours: :func:`proven_temporary` reads it."""
    while True:
        token = secrets.token_hex(16)
        path = out.parent / f".{out.name}.layerfit-{hashlib.sha256(token.encode()).hexdigest()[:_DIGEST]}.{kind}"
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        break
    try:
        fd = os.open(path / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"token": token, "pid": os.getpid(), "output": out.name}, fh)
    except BaseException:  # never leave a folder that cannot be proven ours
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path


def proven_temporary(parent: Path, name: str) -> Temporary | None:
    """The temporary folder ``name`` in ``parent`` if ``prepare`` made it, else None: a
    folder (not a link) owned by this user, named ``.OUT.layerfit-DIGEST.tmp|old`` (the
    fixed tail matched, ``OUT`` taken as a plain string), holding a marker that is a
    regular file of this user whose token's digest is ``DIGEST`` and whose output is ``OUT``."""
    match = _TAIL.fullmatch(name[-_TAIL_LENGTH:])
    if not name.startswith(".") or len(name) <= _TAIL_LENGTH + 1 or match is None:
        return None
    output, path = name[1:-_TAIL_LENGTH], parent / name
    try:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return None
        fd = os.open(path / MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            mst = os.fstat(fd)
            if not stat.S_ISREG(mst.st_mode) or mst.st_uid != os.getuid() or mst.st_size > 4096:
                return None
            data = json.loads(os.read(fd, 4096))
        finally:
            os.close(fd)
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    token, pid = data.get("token"), data.get("pid")
    if not isinstance(token, str) or not isinstance(pid, int) or data.get("output") != output:
        return None
    if hashlib.sha256(token.encode()).hexdigest()[:_DIGEST] != match.group(1):
        return None
    return Temporary(path, output, pid)


def stale_temporaries(parent: Path) -> list[Temporary]:
    """The temporary folders in ``parent`` that ``prepare`` made and whose writer is gone
    (killed with SIGKILL, or the machine lost power): only folders proven ours."""
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return []
    found = (proven_temporary(parent, name) for name in names)
    return [t for t in found if t is not None and _gone(t.pid)]


def stale_warning(t: Temporary) -> str:
    """One line naming a stale temporary folder, its size and how to remove it."""
    return (
        f"{t.path} ({format_bytes(t.size)}) was left by a prepare of {t.output} that was killed: remove it with "
        f"`rm -r {shlex.quote(str(t.path))}`, or prepare {t.output} again"
    )


def _remove_stale_temporaries(out: Path) -> None:
    """With ``out``'s lock held: remove the temporary folders an interrupted ``prepare``
    of ``out`` left (no live writer can own one: it would hold the lock), with a warning
    naming what was freed; warn of those left for other outputs in the same folder."""
    try:
        names = sorted(os.listdir(out.parent))
    except OSError:
        return
    for name in names:
        t = proven_temporary(out.parent, name)
        if t is None:
            continue
        if t.output == out.name:
            size = t.size
            shutil.rmtree(t.path, ignore_errors=True)
            warnings.warn(f"removed {name} ({format_bytes(size)}), left in {out.parent} by an interrupted prepare",
                          stacklevel=4)
        elif _gone(t.pid):
            warnings.warn(stale_warning(t), stacklevel=4)


def _gone(pid: int) -> bool:
    """Whether process ``pid`` (a temporary folder's writer) no longer runs; this
    process's own folders are in use (another thread writes another output)."""
    return pid != os.getpid() and not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def _output_lock(out: Path) -> Iterator[None]:
    """Hold ``.OUT.layerfit-lock`` beside ``out`` (flock, exclusive) for the block; a
    second ``prepare`` of ``out`` refuses in one line. The file is removed on release."""
    path = out.parent / f".{out.name}{LOCK}"
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise OutputPathError(f"cannot create {out}: {exc.strerror or exc} (choose another directory)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise OutputPathError(f"cannot lock {path}: {exc.strerror or exc}") from None
            raise OutputBusyError(
                f"another prepare (process {holder}) is writing {out} now: wait for it to finish, or choose "
                "another directory"
            ) from None
        with contextlib.suppress(OSError):  # the holder before us removed it as we opened it: again
            if os.path.samestat(os.fstat(fd), os.lstat(path)):
                break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)


class _Stopped(BaseException):
    """Raised in the main thread by a signal that stops ``prepare`` while it writes."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """While the block writes: SIGTERM, SIGINT or SIGHUP raises inside it (so its cleanup
    runs: the temporary folder and the lock are removed), then the handler that was
    there before gets the signal (the default one ends the process as the signal does).
    A second signal during the cleanup is ignored. Only in the main thread (where
    Python runs handlers); elsewhere the block runs as it is. The caller catches
    :class:`_Stopped` and raises :func:`_signalled` outside its except block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}
    stopping: list[int] = []

    def stop(signum: int, frame: Any) -> None:
        if not stopping:
            stopping.append(signum)
            raise _Stopped(signum)

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        previous.clear()

    for signum in STOP_SIGNALS:
        if signal.getsignal(signum) == signal.SIG_IGN:  # ignored (nohup): it stays ignored
            continue
        with contextlib.suppress(OSError, ValueError):
            previous[signum] = signal.signal(signum, stop)
    try:
        yield
    finally:
        restore()


def _signalled(signum: int) -> PrepareStoppedError:
    """Give ``signum`` to the handler that was there before ``prepare`` (the default ends
    the process as the signal does; Python's SIGINT handler raises KeyboardInterrupt);
    the error to raise where that handler returns. Called outside any except block, so
    what the handler raises carries nothing of ``prepare``'s."""
    signal.raise_signal(signum)
    return PrepareStoppedError(f"prepare was stopped by {signal.Signals(signum).name}: nothing was kept")


def _rename_noreplace(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst`` only if ``dst`` does not exist, atomically where the
    kernel can (renameat2 RENAME_NOREPLACE; a plain rename would replace an empty folder)."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        at_fdcwd, noreplace = -100, 1
        if renameat2(at_fdcwd, os.fsencode(src), at_fdcwd, os.fsencode(dst), noreplace) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL):
            raise OSError(err, os.strerror(err), str(dst))
    if dst.exists() or dst.is_symlink():  # no renameat2 here: checked, then renamed
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
    os.rename(src, dst)


def _replace_dir(tmp: Path, out: Path, force: bool) -> None:
    """Move ``tmp`` to ``out``, with the output's lock held: whether ``out`` may be
    replaced is checked again here (it may have appeared while ``tmp`` was written), an
    existing one is moved into a marked ``.old`` folder first, and the rename never
    replaces what it finds."""
    _check_output_dir(out, force)
    trash = None
    if out.exists() or out.is_symlink():
        trash = make_temporary(out, "old")
        os.rename(out, trash / "old")
    try:
        _rename_noreplace(tmp, out)
    except FileExistsError:
        raise OutputExistsError(
            f"{out} appeared while prepare was writing it: it was left as it is and nothing was kept "
            "(pass --force to replace it)"
        ) from None
    with contextlib.suppress(OSError):
        os.unlink(out / MARKER)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)
    fd = os.open(out.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
