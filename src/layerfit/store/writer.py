"""Write a prepared model: ``prepare(MODEL, DIR)``.

Weights enter from the module itself or from a safetensors checkpoint (never pickle):
the model is captured (:mod:`layerfit.capture`), and its tensors packed in execution
order, each unit one aligned, checksummed segment (:mod:`.manifest`). The directory is
written under a temporary name and renamed into place, so a failure at any point
leaves nothing behind, and an existing directory is replaced only with ``force``.

Everything ``prepare`` does beside the output (the lock, the marked temporary folders,
signals, the rename that never replaces, what a killed run left) follows the rules of
:mod:`.output_folder`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import struct
import warnings
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from layerfit.capture import capture
from layerfit.capture.graph import ModelGraph
from layerfit.errors import CheckpointError, InputError, OutputPathError, UnknownModelError
from layerfit.sizes import align_up, format_bytes
from layerfit.store import int4_form
from layerfit.store.examples import example_call, example_input  # noqa: F401 (re-exported)
from layerfit.store.gguf_blocks import StoredBlocks
from layerfit.store.gguf_folder import gguf_path, is_gguf, load_gguf, save_files
from layerfit.store.hf_folder import (
    CONFIG,
    PREFIX,
    Example,
    HFOptions,
    LoadedModel,
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
    storage_order,
)
from layerfit.store.model_spec import ModelSpec, resolve
from layerfit.store.output_folder import (
    StoppedBySignal,
    check_output_dir,
    free_space,
    make_temporary,
    output_lock,
    remove_stale_temporaries,
    replace_dir,
    signalled,
    stopped_by_signals,
)
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


def _module(model: nn.Module, place: str) -> nn.Module:
    """The module that holds ``place`` ("module.attr")."""
    module_name = place.rpartition(".")[0]
    return model.get_submodule(module_name) if module_name else model


def _lookup(model: nn.Module, place: str) -> torch.Tensor:
    module, attr = _module(model, place), place.rpartition(".")[2]
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
                "dtype": lay.safetensors_dtype,
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


def _groups(model: nn.Module, graph: ModelGraph, blocks: dict[int, StoredBlocks] | None = None) -> list:
    """(index, name, type, items, d, f) of each segment; a tensor ``blocks`` holds (by
    ``id``) is stored as its GGML blocks, a linear layer's Q4 weight re-expressed for the
    int4 kernel (:mod:`.int4_form`)."""
    blocks = blocks or {}

    def item(t: torch.Tensor, lay: TensorLayout) -> tuple[torch.Tensor, TensorLayout]:
        stored = blocks.get(id(t))
        if stored is None:
            return _stored(t, lay)
        data, encoding = stored.data, stored.encoding
        rows = int4_form.form_rows()
        linear = all(
            isinstance(_module(model, place), nn.Linear) and place.rpartition(".")[2] == "weight" for place in lay.places
        )
        if linear and not encoding.transposed and int4_form.eligible(encoding.ggml, lay.shape, rows):
            data, encoding = int4_form.to_form(data, encoding.ggml, lay.shape, rows), replace(encoding, int4_rows=rows)
        return data, replace(lay, nbytes=data.numel(), encoding=encoding)

    groups = []
    if graph.resident:
        items = []
        for r in graph.resident:
            t = _lookup(model, r.places[0])
            items.append(item(t, TensorLayout(r.name, r.kind, r.dtype, r.shape, 0, r.nbytes, r.places)))
        groups.append((-1, "<resident>", "resident", items, len(items), 0))
    for u in graph.units:
        items = []
        for p in u.params:
            place = f"{u.name}.{p.attr}" if u.name else p.attr
            t = _lookup(model, place)
            items.append(item(t, TensorLayout(p.name, p.kind, p.dtype, p.shape, 0, p.nbytes, (place,))))
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
    if is_gguf(model):
        if checkpoint is not None or input_shape is not None or module is not None:
            raise InputError("a GGUF file brings its weights and its model derives its input: leave out "
                             "--checkpoint and --input-shape (--seq-len sets the input's length)")
        return _prepare_gguf(gguf_path(str(model)), out, hf or HFOptions(), example, force, seed, progress)
    if is_hf(model):
        if checkpoint is not None or input_shape is not None or module is not None:
            raise InputError("a Hugging Face folder brings its weights and derives its input: leave out "
                             "--checkpoint and --input-shape (--seq-len sets the input's length)")
        return _prepare_hf(Path(str(model)[len(PREFIX):]), out, hf or HFOptions(), example, force, seed, progress)
    spec = _resolve(model) if isinstance(model, str) else model
    check_output_dir(out, force)
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
    check_output_dir(out, force)
    _check_seed(seed)
    loaded = load_model(folder, options, free_space(out))
    try:  # the prepared files come from the config and the weights: they get no wider bits
        mode = loaded.checkpoint.mode & stat.S_IMODE((folder / CONFIG).stat().st_mode)
    except OSError:
        mode = 0o600
    return _prepare_loaded(
        folder, loaded, out, options, example, seed, progress, lambda tmp: copy_files(folder, tmp, options.follow_symlinks_out),
        mode, force,
    )


def _prepare_gguf(
    path: Path, out: Path, options: HFOptions, example: Any, force: bool, seed: int, progress: Progress | None
) -> Manifest:
    """``prepare("gguf:FILE", out)``: transformers builds the model from the file, each
    weight made of the file's rows stored as those rows' blocks (:mod:`.gguf_folder`), the
    config and tokenizer transformers reads from it written beside them."""
    check_output_dir(out, force)
    _check_seed(seed)
    gguf = load_gguf(path, options, free_space(out))
    return _prepare_loaded(
        path, gguf.loaded, out, options, example, seed, progress, lambda tmp: save_files(gguf, tmp), gguf.mode, force,
        gguf.blocks,
    )


def _prepare_loaded(
    folder: Path, loaded: LoadedModel, out: Path, options: HFOptions, example: Any, seed: int,
    progress: Progress | None, copy: Callable[[Path], tuple[str, ...]], mode: int, force: bool,
    blocks: dict[int, StoredBlocks] | None = None,
) -> Manifest:
    """Capture a model transformers built from ``folder`` (or a GGUF file) and pack it."""
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
    return _pack(out, loaded.module, graph, fields, progress, copy, mode, force=force, blocks=blocks)


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
    blocks: dict[int, StoredBlocks] | None = None,
) -> Manifest:
    """Write ``module``'s weights as ``graph`` places them, and the manifest of ``fields``,
    into a temporary folder renamed to ``out`` when complete; nothing is kept on failure
    or on a signal that stops the process. ``mode`` bounds who may read the written files
    (the bits of the files they come from; the owner keeps write). See the module
    rules of :mod:`.output_folder` for the lock."""
    try:
        with stopped_by_signals():
            return _pack_locked(out, module, graph, fields, progress, copy, mode, force, blocks)
    except StoppedBySignal as stopped:
        signum = stopped.signum
    raise signalled(signum)


def _pack_locked(
    out: Path,
    module: nn.Module,
    graph: ModelGraph,
    fields: dict[str, Any],
    progress: Progress | None,
    copy: Callable[[Path], tuple[str, ...]] | None,
    mode: int,
    force: bool,
    blocks: dict[int, StoredBlocks] | None,
) -> Manifest:
    """:func:`_pack`'s work, under the output's lock."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(f"cannot create {out}: {exc.strerror or exc} (choose another directory)") from exc
    with output_lock(out):
        remove_stale_temporaries(out)
        try:
            tmp = make_temporary(out, "tmp")
            os.chmod(tmp, 0o777 & ~current_umask())  # made private to its owner until marked
        except OSError as exc:
            raise OutputPathError(f"cannot create {out}: {exc.strerror or exc} (choose another directory)") from exc
        try:
            segments = _write_weights(tmp / WEIGHTS, _groups(module, graph, blocks), progress)
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
            replace_dir(tmp, out, force)
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
