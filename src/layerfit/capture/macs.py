"""Multiply-accumulate counts of one module call, from its input and output shapes.

SwapNet's delay model predicts a unit's kernel time from its MACs ``f``; only the
modules that own parameters need a count, and for those the count follows from shapes.
Modules we do not know are counted as one MAC per output element, which is the right
order of magnitude for the normalisation and activation layers that make up the rest.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def _numel(x: object) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel()
    if isinstance(x, (tuple, list)):
        return sum(_numel(v) for v in x)
    if isinstance(x, dict):
        return sum(_numel(v) for v in x.values())
    return 0


def module_macs(module: nn.Module, inputs: tuple, output: object) -> int:
    """MACs of ``module(*inputs) -> output``."""
    out = _numel(output)
    if isinstance(module, nn.modules.conv._ConvNd):
        kernel = math.prod(module.kernel_size)
        if isinstance(module, nn.modules.conv._ConvTransposeNd):
            return _numel(inputs[:1]) * (module.out_channels // module.groups) * kernel
        return out * (module.in_channels // module.groups) * kernel
    if isinstance(module, nn.Linear):
        return out * module.in_features
    if isinstance(module, nn.Bilinear):
        return out * module.in1_features * module.in2_features
    if isinstance(module, nn.Embedding | nn.EmbeddingBag):
        return 0
    if isinstance(module, nn.MultiheadAttention):
        q = inputs[0] if inputs else None
        if isinstance(q, torch.Tensor):
            tokens = q.numel() // module.embed_dim
            return 4 * tokens * module.embed_dim * module.embed_dim + 2 * tokens * tokens * module.embed_dim
        return out
    return out
