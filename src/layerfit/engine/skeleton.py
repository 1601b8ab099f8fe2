"""The model skeleton on the meta device and binding weights to it by reference.

The skeleton is the model's structure with no parameter memory. Binding a unit puts
zero-copy views of the unit's read buffer in place of its meta tensors; unbinding puts
the meta tensors back, so the views (and the buffer) are no longer referenced by the
model. No byte of a unit is copied on CPU, except where the stored bytes are not the
model's tensor: a weight stored as GGML blocks (a GGUF model) is dequantized when bound,
a linear layer's packed for PyTorch's int4 kernels (:mod:`.int4_packed`), and an
embedding's stays blocks, its rows dequantized per lookup (:mod:`.quantized_tables`); the
bytes so made are counted by the binder (:attr:`Binding.made_nbytes`).
"""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass

import torch
from torch import nn

from layerfit.errors import FactoryImportError, ManifestError
from layerfit.store.manifest import ALIGN, Encoding, Manifest, Segment
from layerfit.store.model_spec import ModelSpec
from layerfit.store.trust import check_trusted


@dataclass(frozen=True)
class Binding:
    """One place a tensor is bound: ``module.<attr>`` in its parameter or buffer dict."""

    module: nn.Module
    attr: str
    kind: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # from the segment start
    nbytes: int
    meta: torch.Tensor  # the skeleton's own tensor, restored on unbind
    stride: tuple[int, ...] | None = None  # the stored strides; None: row-major
    encoding: Encoding | None = None  # stored as GGML blocks, dequantized when bound
    packed: bool = False  # a linear layer's quantized weight, bound as a packed operand
    table: bool = False  # an embedding's quantized table, bound as its blocks (rows dequantized per lookup)

    @property
    def made_nbytes(self) -> int:
        """Bytes binding makes beside the read buffer: a quantized tensor's values, or its
        packed operand (int4 codes and a bf16 scale and zero per 32, or bf16)."""
        return self.made_when(streamed=False)

    def made_when(self, *, streamed: bool) -> int:
        """`made_nbytes` of a unit held (bound for good) or `streamed` (bound for a pass,
        where a packed weight computed in bf16 keeps its blocks: :mod:`.int4_packed`)."""
        if self.encoding is None or self.table:
            return 0
        if self.packed:
            from layerfit.engine.int4_packed import made_nbytes, operand_nbytes

            if self.encoding.int4_rows:
                return made_nbytes(self.encoding.ggml, self.shape, self.encoding.int4_rows, streamed=streamed)
            return operand_nbytes(self.encoding.ggml, self.shape, streamed=streamed)
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def read_nbytes(self) -> int:
        """Bytes of its stored tensor that binding reads: all of them, but for a weight in
        the int4 form bound as views of its codes and scales, whose heads (kept for
        ``--dequantize`` and other CPUs' layouts) it never touches."""
        if self.packed and self.encoding is not None and self.encoding.int4_rows:
            from layerfit.engine.int4_packed import read_nbytes

            return read_nbytes(self.encoding.ggml, self.shape, self.encoding.int4_rows)
        return self.nbytes

    def view(self, buffer: torch.Tensor, start: int, streamed: bool = False) -> torch.Tensor:
        """The tensor as a view of ``buffer`` (uint8) from byte ``start``, in the layout it
        was stored in (the model's own); a quantized tensor is dequantized from its blocks
        into a tensor of its own, with the values transformers' GGUF loader gives (float32
        dequantization, then the model's dtype). A packed weight of a `streamed` unit that
        computes in bf16 stays its blocks, dequantized by rows in each product."""
        if self.encoding is not None:
            if self.table:
                from layerfit.engine.quantized_tables import QuantizedTable

                return QuantizedTable(buffer[start : start + self.nbytes], self.encoding.ggml, self.shape, self.dtype)
            if self.packed:
                from layerfit.engine.int4_packed import (
                    PackedWeight,
                    call_packed,
                    operand,
                    operand_of_form,
                )

                stored = buffer[start : start + self.nbytes]
                if self.encoding.int4_rows:
                    weight = operand_of_form(stored, self.encoding.ggml, self.shape, self.encoding.int4_rows,
                                             streamed=streamed)
                else:
                    weight = operand(stored, self.encoding.ggml, self.shape, streamed=streamed)
                call_packed(self.module)  # its call runs the operand without F.linear's override
                return PackedWeight(weight, self.dtype)
            return self.dequantized(buffer[start : start + self.nbytes])
        typed = buffer[start : start + self.nbytes].view(self.dtype)
        return typed.view(self.shape) if self.stride is None else typed.as_strided(self.shape, self.stride)

    def dequantized(self, blocks: torch.Tensor, rows: int | None = None) -> torch.Tensor:
        """The values of ``blocks``: the whole tensor, or its first ``rows`` rows (a table
        read by rows)."""
        from layerfit.engine.dequantize import dequantize

        assert self.encoding is not None
        if self.encoding.int4_rows:  # a linear layer's weight, bound whole: its blocks rebuilt
            from layerfit.store.int4_form import to_blocks

            assert rows is None
            blocks = to_blocks(blocks, self.encoding.ggml, self.shape, self.encoding.int4_rows)
        shape = self.shape if rows is None else (rows, *self.shape[1:])
        if self.encoding.transposed:
            shape = shape[:-2] + (shape[-1], shape[-2])
        values = dequantize(blocks, self.encoding.ggml, shape, torch.float32)
        if self.dtype != torch.float32:
            values = values.to(self.dtype)
        # transposed in place, as transformers' GGUF loader leaves it (column-major): the
        # same layout runs the same kernels, so the product is transformers' to the bit
        return values.transpose(-1, -2) if self.encoding.transposed else values

    def attach(self, tensor: torch.Tensor) -> None:
        """Put ``tensor`` in this place, requiring grad where the model's own tensor does.

        The flag changes results, not only autograd: ``matmul`` folds a non-contiguous
        batched input into one GEMM when the weight requires grad and into a batched GEMM
        otherwise, so ``F.linear`` on a sliced hidden state (a language model's head with
        ``logits_to_keep``) rounds differently for a plain tensor than for the model's
        parameter, even under ``no_grad``. A view of the buffer will not do: under
        ``no_grad`` its own views (``weight.t()``) do not require grad, so a parameter is
        bound as a detached alias of the bytes (same memory, not a view) that requires grad.
        """
        if self.meta is not None and self.meta.requires_grad and not (self.packed or self.table):
            tensor = tensor.detach().requires_grad_(True)
        (self.module._parameters if self.kind == "param" else self.module._buffers)[self.attr] = tensor


def build_skeleton(manifest: Manifest, where: str = "the prepared model") -> nn.Module:
    """The model rebuilt on the meta device from the manifest's factory and arguments:
    the zoo's, or a factory trusted to run (:mod:`layerfit.store.trust`); ``where``
    names the prepared folder in a refusal."""
    check_trusted(manifest.model["source"], manifest.model["name"], where)
    spec = ModelSpec(manifest.model["source"], manifest.model["name"], manifest.model.get("kwargs", {}))
    with torch.device("meta"):
        try:
            model = spec.instantiate("the manifest's factory or arguments changed: prepare the model again")
        except FactoryImportError as exc:
            if not _loads_weights(exc.__cause__):
                raise
            raise FactoryImportError(
                f"factory {spec.name!r} loads its weights itself (from_pretrained), which cannot be rebuilt "
                "without weights: build the model from its config in the factory (e.g. "
                "AutoModelForCausalLM.from_config(config)), or prepare the Hugging Face folder directly "
                "with `layerfit prepare hf:FOLDER`"
            ) from exc.__cause__
    _check_every_tensor_is_stored(model, manifest)
    return model.eval()


def _loads_weights(exc: BaseException | None) -> bool:
    """Whether ``exc`` was raised inside a model class's ``from_pretrained`` (a factory
    that loads its own weights, which Hugging Face refuses on the meta device): a frame
    of its traceback is a method of that name called on an ``nn.Module`` subclass. A
    config's or a tokenizer's ``from_pretrained`` (a factory that builds from a config
    it reads) is not one."""
    if exc is None:
        return False
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_name != "from_pretrained":
            continue
        owner = frame.f_locals.get("cls", frame.f_locals.get("self"))
        owner = owner if isinstance(owner, type) else type(owner)
        if issubclass(owner, nn.Module):
            return True
    return False


def report_device(model: nn.Module, device: torch.device) -> None:
    """Make each module of ``model`` whose class reports a ``device`` (Hugging Face's
    models: their first parameter's) report ``device``, where the engine runs it.

    A skeleton's parameters are on the meta device between passes, and code that creates
    tensors on ``model.device`` (Whisper's generate makes its decoder's first tokens so)
    would make meta tensors. Each such module's class is swapped for a subclass of it
    (same name) that overrides only the property; other instances are untouched.
    """
    made: dict[type, type] = {}
    for module in model.modules():
        cls = type(module)
        if not isinstance(getattr(cls, "device", None), property):
            continue
        if cls not in made:
            made[cls] = type(
                cls.__name__,
                (cls,),
                {"device": property(lambda self: device), "__module__": cls.__module__, "__qualname__": cls.__qualname__},
            )
        module.__class__ = made[cls]


def _check_every_tensor_is_stored(model: nn.Module, manifest: Manifest) -> None:
    """Refuse a skeleton with a parameter or buffer the store neither holds nor lists as
    unused: left on the meta device it would run as garbage (PyTorch computes with it
    on CPU without complaint), so the output would not be the model's."""
    known = {p for seg in manifest.segments for t in seg.tensors for p in t.places} | set(manifest.graph.unused)
    places: dict[int, list[str]] = {}  # a tied tensor is covered by any of its places
    for name, module in model.named_modules(remove_duplicate=False):
        for attr, t in [*module._parameters.items(), *module._buffers.items()]:
            if t is not None:
                places.setdefault(id(t), []).append(f"{name}.{attr}" if name else attr)
    missing = [ps[0] for ps in places.values() if not known.intersection(ps)]
    if missing:
        raise ManifestError(
            f"the prepared model stores no weights for {', '.join(missing[:5])}"
            f"{' ...' if len(missing) > 5 else ''}: its manifest does not match the model's "
            "factory (edited, or the factory changed since); prepare the model again"
        )


def segment_bindings(
    model: nn.Module, segment: Segment, base: int = 0, modules: dict[str, nn.Module] | None = None,
    *, packed: bool = False,
) -> list[Binding]:
    """Every place a segment's tensors are bound in ``model``; with ``packed``, a linear
    layer's quantized weight is bound as a packed operand (:mod:`.int4_packed`).

    ``base`` is where the segment starts inside the buffer region it is read into (a
    block of several segments is read as one range). ``modules`` is
    ``dict(model.named_modules())``, passed by callers that bind often (re-partitioning
    at run time) so each lookup is one dict access rather than a walk down the tree.
    """
    out = []
    for t in segment.tensors:
        for place in t.places:
            module_name, _, attr = place.rpartition(".")
            try:
                if modules is not None:
                    module = modules[module_name]
                else:
                    module = model.get_submodule(module_name) if module_name else model
            except (AttributeError, KeyError) as exc:
                raise ManifestError(f"the model has no module {module_name!r} for {t.name}") from exc
            holder = module._parameters if t.kind == "param" else module._buffers
            if attr not in holder:
                raise ManifestError(f"module {module_name or '<root>'} has no {t.kind} {attr!r}")
            meta = holder[attr]
            if meta is not None and tuple(meta.shape) != t.shape:
                raise ManifestError(
                    f"{place} has shape {tuple(meta.shape)} in the model and {t.shape} in the store"
                )
            blocks = t.encoding is not None and not t.encoding.transposed and attr == "weight" and len(t.shape) == 2
            runs_packed = blocks and packed and isinstance(module, nn.Linear)
            table = blocks and not t.encoding.int4_rows and type(module) is nn.Embedding and module.max_norm is None
            out.append(
                Binding(module, attr, t.kind, t.torch_dtype, t.shape, base + t.offset, t.nbytes, meta, t.stride,
                        t.encoding, runs_packed, table)
            )
    return out


def read_extent(bindings: list[Binding], nbytes: int) -> int:
    """The bytes of a unit of ``nbytes`` from its start that binding ``bindings`` (all its
    places) reads, in whole pages: less than the unit only where its last tensors' tails go
    unread (:attr:`Binding.read_nbytes`)."""
    end = max((b.offset + b.read_nbytes for b in bindings), default=nbytes)
    return min(nbytes, -(-end // ALIGN) * ALIGN)


def bind(bindings: list[Binding], buffer: torch.Tensor, base: int, streamed: bool = False) -> None:
    """Point every binding at its bytes in ``buffer`` (a uint8 tensor) from ``base``;
    ``streamed``: for one pass (:meth:`Binding.view`)."""
    for b in bindings:
        b.attach(b.view(buffer, base + b.offset, streamed))


def unbind(bindings: list[Binding]) -> None:
    """Restore the meta tensors so nothing in the model references the buffer."""
    for b in bindings:
        if b.kind == "param":
            b.module._parameters[b.attr] = b.meta
        else:
            b.module._buffers[b.attr] = b.meta
