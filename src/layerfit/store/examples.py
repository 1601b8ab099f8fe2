"""The seeded default input of a prepared model: what ``prepare`` captures with when no
example is given, and what ``layerfit run`` calls the model with when no ``--input`` is."""

from __future__ import annotations

import torch

from layerfit.errors import InputError
from layerfit.store.manifest import DTYPES, Manifest


def example_input(
    shape: tuple[int, ...], dtype: str = "float32", seed: int = 0, *, low: int = 0, high: int = 32
) -> torch.Tensor:
    """The seeded default input of a prepared model (also used by ``layerfit run``).

    Integer inputs are ids in [``low``, ``high``): by default below any plausible
    vocabulary; a Hugging Face model's derived inputs name their own range (its
    vocabulary, two token types, an attention mask of ones)."""
    gen = torch.Generator().manual_seed(seed)
    if dtype not in DTYPES:
        raise InputError(f"unsupported input dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    if DTYPES[dtype].is_floating_point:
        return torch.randn(shape, generator=gen, dtype=DTYPES[dtype])
    return torch.randint(low, high, shape, generator=gen, dtype=DTYPES[dtype])


def example_call(manifest: Manifest, seed: int | None = None) -> tuple[tuple, dict[str, torch.Tensor]]:
    """The seeded default call of a prepared model, ``(args, kwargs)``: one input of its
    shape, or (prepared from an example of keyword arguments) one tensor per keyword.
    ``seed`` defaults to the manifest's."""
    seed = manifest.seed if seed is None else seed
    if not manifest.input_keywords:
        low, high = manifest.input_range()
        return (example_input(manifest.input_shape, manifest.input_dtype, seed, low=low, high=high),), {}
    return (), {
        name: example_input(shape, dtype, seed + k, low=manifest.input_range(name)[0], high=manifest.input_range(name)[1])
        for k, (name, shape, dtype) in enumerate(manifest.input_keywords)
    }
