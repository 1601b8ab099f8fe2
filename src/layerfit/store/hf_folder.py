"""A Hugging Face model folder as published: its config, its class, its weights in place.

``layerfit prepare hf:PATH`` reads a local folder holding ``config.json`` and
``model.safetensors`` (or sharded ``*.safetensors`` with their index). The model is
built by transformers itself — ``from_pretrained`` with the folder's tensors given as
views of the memory-mapped files (:mod:`.mapped_safetensors`) — so whatever
transformers accepts (renamed keys, fused experts, tied weights, non-persistent buffers
made by the module, unused tensors) gives the weights transformers gives, and no
weight is copied into memory: the kernel pages each in when the capture pass touches it.

The class is transformers' own, named by the config (``--class`` picks another head);
a manifest of such a model names that class, never a user's module, and holds its
config as data, from which the engine rebuilds its skeleton on the meta device. No code a
file names is run: the config is read without ``trust_remote_code``, the class is
looked up among transformers' model classes only, and the attention implementation is
one of transformers' built-in ones (:data:`~.manifest.BUILT_IN_ATTENTION`), never a Hub kernel.

What the folder holds is data from someone else, checked before it is used:

- every file is opened through :class:`~.folder_files.FolderFiles`: one that is a
  link out of the folder is refused unless ``HFOptions.follow_symlinks_out``; the JSON
  files are read by :func:`layerfit.strict_json.parse` (one line for any breakage) and
  transformers reads a private copy of exactly the bytes checked;
- the model the config describes is counted before it is built (:func:`.model_size.check_size`):
  one that needs far more parameters than the weights hold, or more than the output's
  disk (or, converting the dtype, memory) has room for, is refused in one line;
- copied files keep at most their source's permission bits.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from layerfit.errors import CheckpointError, InputError, ManifestError, UnknownModelError
from layerfit.store.examples import example_input
from layerfit.store.folder_files import FolderFiles
from layerfit.store.manifest import DTYPES, HF_CONFIG, check_attention
from layerfit.store.mapped_safetensors import Checkpoint
from layerfit.store.model_size import check_size
from layerfit.store.transformers_calls import dtype_keyword, quiet_transformers

PREFIX = "hf:"
CONFIG = HF_CONFIG
GENERATION_CONFIG = "generation_config.json"
# Small files beside the weights that the prepared folder keeps: the tokenizer (every
# format transformers reads), the generation config and a processor's settings.
COPIED = (
    CONFIG,
    GENERATION_CONFIG,
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "source.spm",
    "target.spm",
    "chat_template.jinja",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
    "normalizer.json",
)
DEFAULT_SEQ_LEN = 32


@dataclass(frozen=True)
class HFOptions:
    """How to build a Hugging Face folder's model for ``prepare``."""

    class_name: str | None = None  # transformers class; None: the config's architecture
    seq_len: int = DEFAULT_SEQ_LEN  # tokens of the derived example input
    dtype: str | None = None  # None: as stored
    # measure the passes at other batches and lengths so requests may have any shape
    # (:mod:`layerfit.store.shape_samples`: about 12 passes more while preparing)
    variable_shapes: bool = True
    # read files that are links to places outside the folder (off: such a link is refused,
    # so a folder cannot make prepare copy, say, the system's password file)
    follow_symlinks_out: bool = False


@dataclass(frozen=True)
class Example:
    """A derived example call: its arguments and each integer input's value range."""

    value: Any  # a tensor (one positional input) or a dict of keyword arguments
    ranges: dict[str, tuple[int, int]]  # input name ("" for the positional one) → [low, high)
    # (input name, axis, symbol) of each axis a request may size otherwise: "batch",
    # "sequence", "decoder_sequence" (see :mod:`layerfit.store.variable_shapes`)
    axes: tuple[tuple[str, int, str], ...] = ()
    limits: dict[str, int] = field(default_factory=dict)  # a length symbol's most positions


def is_hf(name: object) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


GGUF = ".gguf"
MAX_CONFIG_BYTES = 16 * 2**20  # a config.json of a real model is a few kB, a processor's at most a few hundred


def gguf_hint(path: Path) -> str | None:
    """What to type for a GGUF file, or a folder holding one and no ``config.json``,
    named where a Hugging Face folder was expected; None for anything else."""
    if path.is_dir() and not (path / CONFIG).is_file():
        found = sorted(p.name for p in path.glob(f"*{GGUF}"))
        if not found:
            return None
        file = path / found[0]
    elif path.suffix.lower() == GGUF:
        file = path
    else:
        return None
    return (
        f"{path} is {'a folder of ' if file != path else ''}GGUF ({file.name}): prepare it with "
        f"`layerfit prepare gguf:{file} -o OUT` (needs pip install 'layerfit[gguf]')"
    )


@contextlib.contextmanager
def checked_copy(files: FolderFiles, names: tuple[str, ...]) -> Iterator[tuple[Path, dict[str, Any]]]:
    """A private folder holding the folder's JSON files ``names`` (those present) as
    read and checked once (inside the folder, strict JSON of sane size and depth,
    built-in attention only), and what each holds: transformers reads these bytes,
    never the folder's files, which may have changed (or become links) since."""
    with tempfile.TemporaryDirectory(prefix="layerfit-config-") as tmp:
        read: dict[str, Any] = {}
        for name in names:
            if (files.folder / name).exists() or (files.folder / name).is_symlink():
                read[name] = files.json(name, MAX_CONFIG_BYTES)
                _check_attention_fields(read[name], files.folder / name)
                (Path(tmp) / name).write_text(json.dumps(read[name]))
        yield Path(tmp), read


def _check_attention_fields(data: Any, path: Path) -> None:
    """Refuse a config (or sub-config) naming an attention implementation that is not
    built into transformers: with the ``kernels`` package, a Hub name loads code."""
    stack = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("attn_implementation", "_attn_implementation") and value is not None:
                    try:
                        check_attention(value)
                    except ValueError as exc:
                        raise InputError(f"{path}: {exc}") from None
                stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)


def read_config(folder: Path, files: FolderFiles | None = None) -> Any:
    """The folder's ``config.json`` as transformers reads it (never running its code),
    from the bytes :func:`checked_copy` checked."""
    if not folder.is_dir():
        hint = gguf_hint(folder)
        if hint:
            raise InputError(hint)
        raise InputError(f"{folder} is not a folder: hf: takes a local Hugging Face model folder")
    if not ((folder / CONFIG).exists() or (folder / CONFIG).is_symlink()):
        raise InputError(gguf_hint(folder) or f"{folder} holds no {CONFIG}: it is not a Hugging Face model folder")
    files = files or FolderFiles(folder)
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    with checked_copy(files, (CONFIG,)) as (copy, read):
        data = read[CONFIG]
        if not isinstance(data, dict):
            raise InputError(f"{folder / CONFIG} does not hold a JSON object")
        try:
            with quiet_transformers():
                config = AutoConfig.from_pretrained(str(copy), local_files_only=True, trust_remote_code=False)
            config._name_or_path = str(folder)  # the folder, not the private copy, as transformers would say
            return config
        except (ValueError, KeyError, OSError, TypeError, AttributeError) as exc:
            model_type = data.get("model_type")
            if isinstance(model_type, str) and model_type not in CONFIG_MAPPING_NAMES:
                close = difflib.get_close_matches(model_type, list(CONFIG_MAPPING_NAMES), n=3, cutoff=0.6)
                raise UnknownModelError(
                    f"{folder}: transformers does not know the architecture {model_type!r}"
                    + (f" (close: {', '.join(close)})" if close else "")
                    + "; layerfit runs no code from the folder (no trust_remote_code)"
                ) from None
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            raise InputError(f"{folder / CONFIG} cannot be read: {first.replace(str(copy), str(folder))}") from None


def model_class(name: str) -> type[nn.Module]:
    """transformers' model class ``name`` (a ``PreTrainedModel`` subclass), or one line
    naming close matches: a name from a file never reaches anything else."""
    import transformers
    from transformers import PreTrainedModel

    candidate = None
    if name.isidentifier() and not name.startswith("_"):
        try:
            candidate = getattr(transformers, name)
        except (AttributeError, ImportError, RuntimeError):
            candidate = None
    if isinstance(candidate, type) and issubclass(candidate, PreTrainedModel) and candidate is not PreTrainedModel:
        return candidate
    known = [n for n in dir(transformers) if n[:1].isupper() and ("For" in n or n.endswith("Model"))]
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    raise UnknownModelError(
        f"transformers has no model class {name!r}" + (f" (close: {', '.join(close)})" if close else "")
    )


def class_name_of(config: Any, chosen: str | None) -> str:
    """The class to build: ``chosen``, else the config's first architecture, else the
    base model of its type."""
    if chosen:
        return chosen
    architectures = getattr(config, "architectures", None) or []
    if architectures and isinstance(architectures[0], str):
        return architectures[0]
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    base = MODEL_MAPPING_NAMES.get(config.model_type)
    if isinstance(base, str):
        return base
    raise InputError(f"the config names no architecture: pass --class, e.g. {config.model_type.title()}ForCausalLM")


@dataclass
class LoadedModel:
    """A folder's model built by transformers with its weights in place."""

    module: nn.Module
    class_name: str
    dtype: str
    checkpoint: Checkpoint
    unused: list[str]

    @property
    def spec(self) -> dict[str, Any]:
        """The manifest's ``model``: transformers' class and what rebuilds it the same way
        (its config and generation settings as data, never code)."""
        config = self.module.config
        kwargs: dict[str, Any] = {"config": config.to_dict(), "dtype": self.dtype}
        attn = getattr(config, "_attn_implementation", None)
        if isinstance(attn, str):
            kwargs["attn_implementation"] = attn
        generation = getattr(self.module, "generation_config", None)
        if generation is not None and _generates(self.module):
            kwargs["generation_config"] = generation.to_dict()
        return {"source": "hf", "name": self.class_name, "kwargs": kwargs}


def load_model(folder: Path, options: HFOptions, free_disk: int | None = None) -> LoadedModel:
    """The folder's model as transformers' ``from_pretrained`` builds it, each weight a view
    of its checkpoint file; missing weights are an error naming them, unused checkpoint
    tensors a warning naming them. Before anything is built, :func:`check_size` holds the
    config's model against the weights present and ``free_disk`` (the output's room)."""
    files = FolderFiles(folder, options.follow_symlinks_out)
    config = read_config(folder, files)
    name = class_name_of(config, options.class_name)
    cls = model_class(name)
    checkpoint = Checkpoint(folder, options.follow_symlinks_out)
    if options.dtype is not None:
        if options.dtype not in DTYPES or not DTYPES[options.dtype].is_floating_point:
            floats = [n for n, d in DTYPES.items() if d.is_floating_point]
            raise InputError(f"--dtype {options.dtype!r} is not a floating dtype: use one of {', '.join(floats)}")
        dtype = DTYPES[options.dtype]
    else:
        dtype = checkpoint.stored_dtype() or torch.float32
    check_size(folder, config, cls, checkpoint, dtype, free_disk)
    attention = getattr(config, "_attn_implementation", None)
    if isinstance(attention, str):
        _check_flash_fallback(attention)
    state = dict(checkpoint.tensors())
    try:
        with quiet_transformers(), checked_copy(files, (GENERATION_CONFIG,)) as (settings, _):
            # No name: the weights are the state dict (transformers refuses both). Sizes
            # that do not match are reported, not raised: transformers' error points at a
            # table it logged, which is silenced; the report below names each tensor.
            module, info = cls.from_pretrained(
                None, config=config, state_dict=state, local_files_only=True,
                output_loading_info=True, ignore_mismatched_sizes=True, **{dtype_keyword(): dtype},
            )
            if (settings / GENERATION_CONFIG).is_file() and _generates(module):
                from transformers import GenerationConfig

                module.generation_config = GenerationConfig.from_pretrained(str(settings), local_files_only=True)
    except (RuntimeError, ValueError, KeyError, OSError, TypeError, AttributeError) as exc:
        raise CheckpointError(
            f"transformers cannot build {name} from {folder}: {str(exc).strip().splitlines()[0][:300]}"
        ) from None
    del state
    missing = sorted(info.get("missing_keys") or ())
    mismatched = [f"{k} {tuple(a)} (model: {tuple(b)})" for k, a, b in sorted(info.get("mismatched_keys") or ())]
    if missing or mismatched:
        problems = []
        if missing:
            problems.append(f"missing weights: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
        if mismatched:
            problems.append(f"wrong shapes: {', '.join(mismatched[:5])}")
        hint = " (is --class the head this checkpoint was trained with?)" if options.class_name else ""
        raise CheckpointError(f"{folder} does not hold every weight of {name}: {'; '.join(problems)}{hint}")
    unused = sorted(info.get("unexpected_keys") or ())
    module.eval()
    return LoadedModel(module, name, str(dtype).removeprefix("torch."), checkpoint, unused)


def derive_example(module: nn.Module, seq_len: int, seed: int) -> Example:
    """An input the model accepts, derived from its config: a decoder's token ids of
    ``seq_len``; an encoder's ids, attention mask and token types; an encoder-decoder's
    encoder input (ids, or audio features of its length) and decoder ids."""
    config = module.config
    stated = positions_of(config, "max_target_positions" if getattr(config, "is_encoder_decoder", False) else None)
    limit = stated[1] if stated else None
    if seq_len < 1 or (limit is not None and seq_len > limit):
        raise InputError(f"--seq-len {seq_len} is outside 1..{limit or 'any'} (the model's positions)")
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if vocab < 1:
        raise InputError(f"{type(module).__name__}'s config has no vocab_size: give an example input (--example)")
    accepted = set(inspect.signature(module.forward).parameters)
    ranges: dict[str, tuple[int, int]] = {}
    axes: list[tuple[str, int, str]] = []
    encoder = positions_of(config)
    limits = {"sequence": encoder[1]} if encoder else {}
    if limit is not None:
        limits["decoder_sequence" if getattr(config, "is_encoder_decoder", False) else "sequence"] = limit

    def ids(name: str, k: int, low: int, high: int, length: str = "sequence") -> torch.Tensor:
        ranges[name] = (low, high)
        axes.extend([(name, 0, "batch"), (name, 1, length)])
        return example_input((1, seq_len), "int64", seed + k, low=low, high=high)

    def example(value: Any) -> Example:
        used = {symbol for _, _, symbol in axes}
        return Example(value, ranges, tuple(axes), {s: n for s, n in limits.items() if s in used})

    if getattr(config, "is_encoder_decoder", False):
        call: dict[str, torch.Tensor] = {}
        if getattr(module, "main_input_name", "input_ids") == "input_features":
            frames = 2 * int(config.max_source_positions)
            dtype = str(next(module.parameters()).dtype).removeprefix("torch.")
            call["input_features"] = example_input((1, int(config.num_mel_bins), frames), dtype, seed)
            axes.append(("input_features", 0, "batch"))  # its frames are fixed by the model
        else:
            call["input_ids"] = ids("input_ids", 0, 0, vocab)
        call["decoder_input_ids"] = ids("decoder_input_ids", 1, 0, vocab, "decoder_sequence")
        return example(call)
    if _generates(module):  # a decoder: its ids, positionally
        return example(ids("", 0, 0, vocab))
    call = {"input_ids": ids("input_ids", 0, 0, vocab)}
    if "attention_mask" in accepted:
        call["attention_mask"] = ids("attention_mask", 1, 1, 2)  # attend to every token
    types = int(getattr(config, "type_vocab_size", 0) or 0)
    if "token_type_ids" in accepted and types > 0:
        call["token_type_ids"] = ids("token_type_ids", 2, 0, types)
    return example(call)


def _generates(module: nn.Module) -> bool:
    can = getattr(module, "can_generate", None)
    try:
        return bool(can()) if callable(can) else False
    except Exception:  # a model's own check may raise on an unusual config
        return False


POSITION_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx", "max_sequence_length", "seq_length")
"""Where a Hugging Face config states how many positions the model has, by family."""


def positions_of(config: Any, first: str | None = None) -> tuple[str, int] | None:
    """``(field, positions)``: the first of ``first`` and :data:`POSITION_FIELDS` that the
    (text) config states as a whole number, named as its config.json does (GPT-2's
    ``max_position_embeddings`` is an alias of ``n_positions``); None where it states
    none (relative positions: no limit)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    aliases = getattr(text, "attribute_map", {})
    for name in ((first,) if first else ()) + POSITION_FIELDS:
        value = getattr(text, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return aliases.get(name, name), value
    return None


def copy_files(folder: Path, into: Path, follow_links_out: bool = False) -> tuple[str, ...]:
    """Copy the folder's config, tokenizer and generation settings into ``into``; the
    names copied. A link inside the folder (a Hub cache's snapshot links to its blobs)
    gives its content; one out of the folder is refused unless ``follow_links_out``.
    Each copy gets at most its source's permission bits (and the umask's): a file only
    its owner may read stays so."""
    files = FolderFiles(folder, follow_links_out)
    copied = []
    for name in COPIED:
        source = folder / name
        if not (source.exists() or source.is_symlink()):
            continue
        fd = files.open(name)
        try:
            mode = stat.S_IMODE(os.fstat(fd).st_mode) & 0o666  # never executable, never wider
            with os.fdopen(os.dup(fd), "rb") as src, open(
                os.open(into / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb"
            ) as dst:
                while chunk := src.read(2**20):
                    dst.write(chunk)
        finally:
            os.close(fd)
        copied.append(name)
    return tuple(copied)


def build_model(
    name: str,
    config: dict[str, Any],
    dtype: str = "float32",
    attn_implementation: str | None = None,
    generation_config: dict[str, Any] | None = None,
) -> nn.Module:
    """A prepared model's transformers class rebuilt from the config its manifest holds
    (on the caller's device: the engine builds it on meta, and the store binds the
    weights), with the generation settings it was prepared with."""
    from transformers import AutoConfig, GenerationConfig

    cls = model_class(name)
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise InputError("the manifest's config has no model_type: prepare the model again")
    if dtype not in DTYPES:
        raise InputError(f"the manifest's dtype {dtype!r} is not one layerfit stores: prepare the model again")
    fields = {k: v for k, v in config.items() if k != "model_type"}
    options: dict[str, Any] = {dtype_keyword(): DTYPES[dtype]}
    _check_attention_fields(config, Path("the manifest's config"))
    if attn_implementation is not None:
        try:
            check_attention(attn_implementation)
        except ValueError as exc:
            raise ManifestError(f"the manifest's model: {exc}") from None
        _check_flash_fallback(attn_implementation)
        options["attn_implementation"] = attn_implementation
    try:
        with quiet_transformers():
            model = cls._from_config(AutoConfig.for_model(config["model_type"], **fields), **options)
            if isinstance(generation_config, dict) and _generates(model):
                settings = GenerationConfig.from_dict(generation_config)
                if settings._from_model_config and not hasattr(settings, "_original_object_hash"):
                    # transformers 4.x marks a config made from the model's by this hash
                    # (from_model_config sets it, from_dict does not) and reads it in generate
                    settings._original_object_hash = hash(settings)
                model.generation_config = settings
    except Exception as exc:  # transformers' own checks of a config: any of its errors
        import transformers

        first = (str(exc).strip().splitlines() or [""])[0][:160]
        raise ManifestError(
            f"transformers {transformers.__version__} cannot build {name} from the manifest's "
            f"{config['model_type']!r} config ({type(exc).__name__}: {first}): the manifest was edited or written "
            "with another transformers version; prepare the model again from its Hugging Face folder (prepare hf:FOLDER)"
        ) from None
    return model


def _check_flash_fallback(attention: str) -> None:
    """Refuse ``flash_attention_N`` where its own package is missing and the ``kernels``
    package is installed: transformers would then fetch and run a Hub kernel in its place."""
    import importlib.util

    if not attention.startswith("flash_attention_") or importlib.util.find_spec("kernels") is None:
        return
    from transformers.modeling_flash_attention_utils import FLASH_ATTENTION_COMPATIBILITY_MATRIX

    version = attention.removeprefix("flash_attention_")
    entry = FLASH_ATTENTION_COMPATIBILITY_MATRIX.get(int(version)) if version.isdigit() else None
    if entry is None or not entry["general_availability_check"]():
        raise InputError(
            f"attention {attention!r} needs its own package here (transformers would load a Hub kernel in its "
            "place, which layerfit never does): install it, or prepare the model with the default attention"
        )
