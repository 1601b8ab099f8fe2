"""Capture a network's structure: ``capture(model, example_input) -> ModelGraph``.

Units come from one plain forward pass with hooks on every module (so they are right
for any model); activation ops and tensors come from torch.fx where the model traces
and from leaf-module hooks where it does not.
"""

from __future__ import annotations

import logging
import sys
import types
from typing import Any

import torch
from torch import nn

from layerfit.capture.activations import _flat_tensors, output_names, trace_fx, trace_hooks
from layerfit.capture.allocations import PassAllocations
from layerfit.capture.graph import (
    ModelGraph,
    OpRecord,
    ParamSpec,
    ResidentTensor,
    TensorRecord,
    UnitInfo,
)
from layerfit.capture.units import StateGuard, UnitRecorder, dtype_name
from layerfit.errors import CaptureError, LayerfitError

__all__ = [
    "ModelGraph",
    "OpRecord",
    "ParamSpec",
    "ResidentTensor",
    "TensorRecord",
    "UnitInfo",
    "capture",
    "split_input",
]

log = logging.getLogger(__name__)


def split_input(example_input: Any) -> tuple[tuple, dict]:
    """Positional and keyword arguments for ``model(...)`` from a tensor, tuple or dict."""
    if isinstance(example_input, torch.Tensor):
        return (example_input,), {}
    if isinstance(example_input, tuple):
        return example_input, {}
    if isinstance(example_input, list):
        return tuple(example_input), {}
    if isinstance(example_input, dict):
        return (), dict(example_input)
    raise CaptureError(
        f"example input must be a tensor, a tuple of tensors or a dict of keyword "
        f"arguments, not {type(example_input).__name__}"
    )


def _describe(args: tuple, kwargs: dict) -> str:
    """``float32 (1, 3, 224, 224)`` for each tensor of the example input."""
    tensors = _flat_tensors((args, kwargs))
    return ", ".join(f"{dtype_name(t.dtype)} {tuple(t.shape)}" for t in tensors) or "no tensors"


def capture(model: nn.Module, example_input: Any, *, method: str = "auto") -> ModelGraph:
    """Units, ops and activation tensors of ``model`` run on ``example_input``.

    ``method`` is ``auto`` (fx, falling back to hooks), ``fx`` or ``hooks``.
    """
    if method not in ("auto", "fx", "hooks"):
        raise CaptureError(f"unknown capture method {method!r}: use auto, fx or hooks")
    args, kwargs = split_input(example_input)
    _check_modules(model)
    was_training = model.training
    model.eval()
    try:
        # Every pass runs under a StateGuard: what the forward pass writes to the model's
        # weights (a counter, a cache) is undone after it, so each pass, and the weights
        # ``prepare`` packs, start from the model as it was given.
        recorder = UnitRecorder(model)
        guard = StateGuard(model)
        # the most bytes of tensors eager PyTorch holds at once, the inputs included
        allocations = PassAllocations(weights=[*model.parameters(), *model.buffers()], inputs=(args, kwargs))
        try:
            with recorder, guard, torch.no_grad(), allocations:
                output = model(*args, **kwargs)
        except LayerfitError:
            raise
        except Exception as exc:  # the model's own code may raise anything
            raise CaptureError(
                f"{type(model).__name__} fails on the example input ({_describe(args, kwargs)}): "
                f"{type(exc).__name__}: {exc}. Give an input shape and dtype the model accepts "
                "(layerfit prepare --input-shape, --input-dtype)"
            ) from exc
        _check_plain_reads(recorder.plain_reads)
        units, resident, unused = recorder.build(guard.written)
        ops = tensors = None
        used = method
        if method in ("auto", "fx") and not kwargs:
            try:
                with StateGuard(model):
                    ops, tensors = trace_fx(model, args, kwargs)
                used = "fx"
            except Exception as exc:  # fx raises many kinds of errors on untraceable code
                if method == "fx":
                    raise CaptureError(f"torch.fx cannot trace {type(model).__name__}: {exc}") from exc
                log.info("fx tracing failed (%s); falling back to module hooks", exc)
        if ops is None:
            with StateGuard(model):
                ops, tensors = trace_hooks(model, args, kwargs)
            used = "hooks"
    finally:
        model.train(was_training)
    first = _flat_tensors((args, kwargs))
    return ModelGraph(
        model_type=type(model).__name__,
        input_shape=tuple(first[0].shape) if first else (),
        input_dtype=dtype_name(first[0].dtype) if first else "float32",
        method=used,
        units=units,
        ops=ops,
        tensors=tensors,
        resident=resident,
        unused=unused,
        output_shapes=[tuple(t.shape) for t in _flat_tensors(output)],
        output_names=_unique(output_names(output)),
        pass_peak_bytes=allocations.peak,
    )


def _unique(names: list[str]) -> list[str]:
    """``names`` if no two are equal (a dict's keys never are), else none: the server
    then numbers the outputs itself."""
    return names if len(set(names)) == len(names) else []


def _check_modules(model: nn.Module) -> None:
    """Refuse modules the engine cannot hook or bind weights to: TorchScript, and weights
    held in packed or quantized form, which are neither stored nor streamed (packed
    weights would be silently left out; the skeleton could not be rebuilt on meta)."""
    for name, module in model.named_modules():
        where = f"submodule {name}" if name else "the model"
        if isinstance(module, torch.jit.ScriptModule):
            raise CaptureError(
                f"{where} is a TorchScript module (torch.jit.script or trace), which takes no "
                "hooks and keeps its weights inside TorchScript: layerfit cannot stream it; "
                "prepare the eager (unscripted) module"
            )
        packed = [a for a, v in vars(module).items() if isinstance(v, torch.ScriptObject)]
        quantized = [a for a, t in [*module._parameters.items(), *module._buffers.items()] if t is not None and t.is_quantized]
        if packed or quantized:
            raise CaptureError(
                f"{where} ({type(module).__name__}) keeps its weights "
                + (f"packed in {packed[0]!r} (a TorchScript object)" if packed else f"quantized in {quantized[0]!r}")
                + ", not as plain parameters or buffers, so layerfit can neither store nor stream "
                "them: prepare the model before quantization (float32, float16 or bfloat16 weights)"
            )


def _check_plain_reads(plain_reads: dict[str, str]) -> None:
    """Refuse a forward pass that reads a tensor held in a plain attribute: only
    parameters and buffers are stored, so the engine's skeleton, built on device meta,
    would hold an empty meta tensor there."""
    if plain_reads:
        place, op = next(iter(plain_reads.items()))
        attr = place.rpartition(".")[2]
        raise CaptureError(
            f"the forward pass reads tensor attribute {place} (by {op}), which is neither a "
            "parameter nor a buffer, so layerfit cannot store it: register it with "
            f"register_buffer({attr!r}, tensor, persistent=False)"
            + (f" (and {len(plain_reads) - 1} more)" if len(plain_reads) > 1 else "")
        )


class _CallableModule(types.ModuleType):
    """Lets ``layerfit.capture(model, x)`` call :func:`capture` on the package itself."""

    def __call__(self, model: nn.Module, example_input: Any, *, method: str = "auto") -> ModelGraph:
        return capture(model, example_input, method=method)


sys.modules[__name__].__class__ = _CallableModule
