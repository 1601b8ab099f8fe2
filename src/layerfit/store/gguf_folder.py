"""A GGUF file as published (llama.cpp's format), built by transformers and stored as its blocks.

``layerfit prepare gguf:FILE -o DIR`` (or a path ending in ``.gguf``) reads the file's
header with layerfit's own bounded reader (:mod:`.gguf_file`) and refuses, in one line,
what it cannot prepare: a type it does not dequantize, an architecture transformers'
GGUF loader does not build, a file with no tokenizer. transformers then builds the
model, its config and its tokenizer from the file exactly as
``AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)`` does (``gguf_file=``
naming the descriptor layerfit checked, so the file read is the file checked), and
:func:`~.gguf_blocks.find_blocks` finds which of the file's blocks hold each weight, so
the prepared folder stores the quantized bytes, not transformers' float32 copy.

Building the model dequantizes every weight once, in memory: the size rule
(:func:`.model_size.check_size`) holds the config's model against the file's tensors and
the memory available before anything is built.
"""

from __future__ import annotations

import contextlib
import math
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from layerfit.errors import CheckpointError, InputError, UnknownModelError
from layerfit.sizes import format_bytes
from layerfit.store.gguf_blocks import StoredBlocks, find_blocks
from layerfit.store.gguf_file import GGUFFile, open_gguf, read_gguf, unsupported_types
from layerfit.store.hf_folder import HFOptions, LoadedModel, model_class
from layerfit.store.model_size import check_size
from layerfit.store.outputs import current_umask
from layerfit.store.transformers_calls import quiet_transformers

PREFIX = "gguf:"
SUFFIX = ".gguf"


def is_gguf(name: object) -> bool:
    """Whether ``name`` names a GGUF file: ``gguf:PATH``, or a path ending in ``.gguf``."""
    return isinstance(name, str) and (
        name.startswith(PREFIX) or (name.lower().endswith(SUFFIX) and not name.startswith("hf:"))
    )


def gguf_path(name: str) -> Path:
    return Path(name.removeprefix(PREFIX))


@dataclass
class LoadedGGUF:
    """A GGUF file's model built by transformers, and the blocks that hold its weights."""

    loaded: LoadedModel
    tokenizer: Any
    blocks: dict[int, StoredBlocks]  # id(weight) -> its blocks
    mode: int  # the file's permission bits: the prepared files get no wider ones


class _TensorsOfFile:
    """What the size rule reads of a checkpoint, for a GGUF file's tensors."""

    def __init__(self, gguf: GGUFFile, size: int) -> None:
        self.elements = sum(math.prod(t.shape) for t in gguf.tensors)
        self.nbytes = size
        self._names = [t.name for t in gguf.tensors]

    def names(self) -> list[str]:
        return self._names

    def stored_dtype(self) -> None:
        return None  # building the model dequantizes: check_size(converts=True) applies the memory rule


def load_gguf(path: Path, options: HFOptions, free_disk: int | None = None) -> LoadedGGUF:
    """The GGUF file's model as transformers builds it, its tokenizer, and its weights'
    blocks; one line for anything that stops it."""
    if options.dtype is not None:
        raise InputError("--dtype is for a Hugging Face folder: a GGUF file's weights are stored as its blocks")
    with _opened(path) as (proxy, size, mode):
        try:
            gguf = read_gguf(proxy)
        except InputError as exc:  # the reader names the descriptor: name the file
            raise InputError(str(exc).replace(str(proxy), str(path))) from None
        _check_file(path, gguf)
        config = _config(path, proxy)
        name = options.class_name or _causal_lm(config)
        cls = model_class(name)
        check_size(path, config, cls, _TensorsOfFile(gguf, size), torch.float32, None, described=str(path),
                   converts=True)
        writes = size * 5 // 4  # the blocks, Q4 weights re-expressed for the int4 kernel (at most 1.22x)
        if free_disk is not None and writes > free_disk:
            raise InputError(
                f"preparing {path} writes up to {format_bytes(writes)} and the output's file system has "
                f"{format_bytes(free_disk)} free: free some space or choose another output folder"
            )
        module, tokenizer = _build(path, proxy, cls, name)
        blocks = find_blocks(module, gguf)
    dtype = str(next(module.parameters()).dtype).removeprefix("torch.")
    return LoadedGGUF(LoadedModel(module, name, dtype, None, []), tokenizer, blocks, mode)  # type: ignore[arg-type]


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[tuple[Path, int, int]]:
    """The file opened once (a regular file, never a FIFO that would wait), as a path
    every reader opens that same file by: a link, in a private folder, to the descriptor
    (``/proc/self/fd/N``), named ``model.gguf`` because transformers tells a GGUF file by
    its suffix. A name swapped after the checks changes nothing."""
    fd, info = open_gguf(path)
    try:
        with tempfile.TemporaryDirectory(prefix="layerfit-gguf-") as private:
            proxy = Path(private) / "model.gguf"
            os.symlink(f"/proc/self/fd/{fd}", proxy)
            yield proxy, info.st_size, stat.S_IMODE(info.st_mode)
    finally:
        os.close(fd)


def _check_file(path: Path, gguf: GGUFFile) -> None:
    """Refuse what cannot be prepared before transformers reads anything."""
    unsupported = unsupported_types(gguf)
    if unsupported:
        tensor = next(iter(unsupported))
        kinds = sorted(set(unsupported.values()))
        raise InputError(
            f"{path} holds tensors of type {', '.join(kinds)} ({tensor}{' ...' if len(unsupported) > 1 else ''}), "
            "which layerfit does not read: use a file quantized as F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 "
            f"or Q2_K...Q6_K (llama.cpp's llama-quantize makes one from an F16 file)"
        )
    arch = gguf.metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise InputError(f"{path} names no architecture (general.architecture): it is not a model llama.cpp writes")
    if not _supported_architecture(arch):
        import transformers

        raise UnknownModelError(
            f"{path} is a {arch!r} model, which transformers {transformers.__version__}'s GGUF loader does not "
            "build: convert it to a Hugging Face folder another way, then `layerfit prepare hf:FOLDER`"
        )
    if not isinstance(gguf.metadata.get("tokenizer.ggml.model"), str) or "tokenizer.ggml.tokens" not in gguf.metadata:
        raise InputError(
            f"{path} holds no tokenizer (tokenizer.ggml.model and tokens): layerfit prepares GGUF files that carry "
            "theirs, as llama.cpp's converter writes them"
        )


def _supported_architecture(arch: str) -> bool:
    try:
        from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES
    except ImportError:  # pragma: no cover - every transformers with GGUF support has it
        return True
    names = {a.replace("-", "").replace("_", "") for a in GGUF_SUPPORTED_ARCHITECTURES}
    return arch.replace("-", "").replace("_", "") in names


def _first_line(exc: BaseException, path: Path, proxy: Path) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300].replace(str(proxy), str(path))


def _causal_lm(config: Any) -> str:
    """The class a GGUF file's model is: its type's causal language model (llama.cpp runs
    nothing else), as ``AutoModelForCausalLM`` picks it."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
    if not isinstance(name, str):
        raise UnknownModelError(f"transformers has no causal language model of type {config.model_type!r}: pass --class")
    return name


def _config(path: Path, proxy: Path) -> Any:
    from transformers import AutoConfig

    try:
        with quiet_transformers():
            return AutoConfig.from_pretrained(str(proxy.parent), gguf_file=proxy.name, local_files_only=True)
    except Exception as exc:  # transformers' reading of the metadata: any of its errors
        raise InputError(f"transformers cannot read {path}'s config: {_first_line(exc, path, proxy)}") from None


@contextlib.contextmanager
def _no_progress_bar() -> Iterator[None]:
    """transformers' GGUF loader draws its own tqdm bar, which its logging switch (in
    :func:`quiet_transformers`) does not reach: the loader's ``tqdm`` passes its iterable
    through for the call."""
    try:
        import transformers.modeling_gguf_pytorch_utils as loader
    except ImportError:  # pragma: no cover - every transformers with GGUF support has it
        yield
        return
    bar = getattr(loader, "tqdm", None)
    loader.tqdm = lambda iterable, *args, **kwargs: iterable
    try:
        yield
    finally:
        loader.tqdm = bar


def _build(path: Path, proxy: Path, cls: type, name: str) -> tuple[Any, Any]:
    """transformers' model (dequantized, its own dtype) and tokenizer of the file."""
    from transformers import AutoTokenizer

    try:
        with quiet_transformers(), _no_progress_bar():
            module, info = cls.from_pretrained(
                str(proxy.parent), gguf_file=proxy.name, local_files_only=True, output_loading_info=True
            )
    except Exception as exc:  # transformers' loading: any of its errors
        raise CheckpointError(f"transformers cannot build {name} from {path}: {_first_line(exc, path, proxy)}") from None
    missing = sorted(info.get("missing_keys") or ())
    if missing:  # transformers initialised them at random (a Mixtral-style llama file's experts, for one)
        raise CheckpointError(
            f"transformers builds {name} from {path} without {len(missing)} of its weights "
            f"({', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}): its GGUF loader does not read this "
            "file's layout of them, so the model would not be the file's"
        )
    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(str(proxy.parent), gguf_file=proxy.name, local_files_only=True)
    except Exception as exc:
        raise InputError(f"transformers cannot read {path}'s tokenizer: {_first_line(exc, path, proxy)}") from None
    module.eval()
    return module, tokenizer


def save_files(loaded: LoadedGGUF, into: Path) -> tuple[str, ...]:
    """The config, generation settings and tokenizer of a GGUF model written into
    ``into`` (a prepared folder keeps them as a Hugging Face folder's are copied); the
    names written."""
    before = set(os.listdir(into))
    module = loaded.loaded.module
    module.config.save_pretrained(str(into))
    generation = getattr(module, "generation_config", None)
    if generation is not None and module.can_generate():
        generation.save_pretrained(str(into))
    loaded.tokenizer.save_pretrained(str(into))
    written = sorted(set(os.listdir(into)) - before)
    for name in written:  # readable by no more users than the file; the owner may write
        os.chmod(into / name, 0o666 & ~current_umask() & (loaded.mode | 0o200))
    return tuple(written)


__all__ = ["LoadedGGUF", "PREFIX", "gguf_path", "is_gguf", "load_gguf", "save_files"]
