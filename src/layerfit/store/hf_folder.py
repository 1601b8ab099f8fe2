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
file names is run: the config is read without ``trust_remote_code`` and the class is
looked up among transformers' model classes only.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from layerfit.errors import CheckpointError, InputError, UnknownModelError
from layerfit.store.examples import example_input
from layerfit.store.manifest import DTYPES
from layerfit.store.mapped_safetensors import Checkpoint

PREFIX = "hf:"
CONFIG = "config.json"
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


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' own loading chatter (missing/unexpected key reports, progress bars)
    silenced for the call: layerfit reports what matters in its own words."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def read_config(folder: Path) -> Any:
    """The folder's ``config.json`` as transformers reads it (never running its code)."""
    if not folder.is_dir():
        raise InputError(f"{folder} is not a folder: hf: takes a local Hugging Face model folder")
    if not (folder / CONFIG).is_file():
        raise InputError(f"{folder} holds no {CONFIG}: it is not a Hugging Face model folder")
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    try:
        with quiet_transformers():
            return AutoConfig.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except (ValueError, KeyError, OSError, TypeError) as exc:
        model_type = _model_type(folder / CONFIG)
        if model_type is not None and model_type not in CONFIG_MAPPING_NAMES:
            close = difflib.get_close_matches(model_type, list(CONFIG_MAPPING_NAMES), n=3, cutoff=0.6)
            raise UnknownModelError(
                f"{folder}: transformers does not know the architecture {model_type!r}"
                + (f" (close: {', '.join(close)})" if close else "")
                + "; layerfit runs no code from the folder (no trust_remote_code)"
            ) from None
        raise InputError(f"{folder / CONFIG} cannot be read: {str(exc).splitlines()[0][:200]}") from None


def _model_type(path: Path) -> str | None:
    import json

    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return None
    value = data.get("model_type") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


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


def dtype_keyword() -> str:
    """The name transformers' loaders take the dtype by (``torch_dtype`` before 4.56)."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


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


def load_model(folder: Path, options: HFOptions) -> LoadedModel:
    """The folder's model as transformers' ``from_pretrained`` builds it, each weight a view
    of its checkpoint file; missing weights are an error naming them, unused checkpoint
    tensors a warning naming them."""
    config = read_config(folder)
    name = class_name_of(config, options.class_name)
    cls = model_class(name)
    checkpoint = Checkpoint(folder)
    if options.dtype is not None:
        if options.dtype not in DTYPES or not DTYPES[options.dtype].is_floating_point:
            floats = [n for n, d in DTYPES.items() if d.is_floating_point]
            raise InputError(f"--dtype {options.dtype!r} is not a floating dtype: use one of {', '.join(floats)}")
        dtype = DTYPES[options.dtype]
    else:
        dtype = checkpoint.stored_dtype() or torch.float32
    state = dict(checkpoint.tensors())
    try:
        with quiet_transformers():
            # No name: the weights are the state dict (transformers refuses both). Sizes
            # that do not match are reported, not raised: transformers' error points at a
            # table it logged, which is silenced; the report below names each tensor.
            module, info = cls.from_pretrained(
                None, config=config, state_dict=state, local_files_only=True,
                output_loading_info=True, ignore_mismatched_sizes=True, **{dtype_keyword(): dtype},
            )
            if (folder / GENERATION_CONFIG).is_file() and _generates(module):
                from transformers import GenerationConfig

                module.generation_config = GenerationConfig.from_pretrained(str(folder), local_files_only=True)
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


def copy_files(folder: Path, into: Path) -> tuple[str, ...]:
    """Copy the folder's config, tokenizer and generation settings into ``into``; the
    names copied."""
    copied = []
    for name in COPIED:
        source = folder / name
        if source.is_file():  # a link too (a Hub cache's snapshot links to its blobs): its content
            shutil.copyfile(source, into / name)
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
    if isinstance(attn_implementation, str):
        options["attn_implementation"] = attn_implementation
    with quiet_transformers():
        model = cls._from_config(AutoConfig.for_model(config["model_type"], **fields), **options)
        if isinstance(generation_config, dict) and _generates(model):
            model.generation_config = GenerationConfig.from_dict(generation_config)
    return model
