"""Vision Transformers (Dosovitskiy et al., 2021) in torchvision's ``vit_*_16`` layout.

None of the papers layerfit follows evaluates a Transformer (SwapNet and the MASA thesis
name them as future work), yet attention models are what edge users increasingly run.
These entries give the zoo, the benches and the tests one: a patch convolution, a class
token, a learned position embedding, pre-norm encoder blocks of
``nn.MultiheadAttention`` and a two-layer GELU MLP, a final LayerNorm and a linear head,
with torchvision's module and parameter names (``encoder.layers.encoder_layer_0
.self_attention.in_proj_weight`` ...), so a torchvision checkpoint converted to
safetensors would load into it.

``nn.MultiheadAttention`` owns ``in_proj_weight`` beside its child ``out_proj`` and reads
``out_proj.weight`` in its own forward, which is what
:meth:`layerfit.capture.units.UnitRecorder._merge_subtrees` streams as one unit.

One departure from torchvision: the position embedding is resampled (bicubic, as timm's
``dynamic_img_size``) to the input's patch grid on every call instead of being fixed to
224 px, so the model runs on the tests' small inputs too. At the native grid the
resampling is the identity, bit for bit, and it only depends on the input's shape.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

SIZES: dict[str, tuple[int, int, int, int]] = {
    "s": (384, 12, 6, 1536),  # width, blocks, heads, MLP width (DeiT-S / ViT-S)
    "b": (768, 12, 12, 3072),  # ViT-Base
}


class EncoderBlock(nn.Module):
    """Pre-norm block: ``x + attention(ln_1(x))``, then ``x + mlp(ln_2(x))``."""

    def __init__(self, width: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(width, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, mlp), nn.GELU(), nn.Linear(mlp, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        x = x + y
        return x + self.mlp(self.ln_2(x))


class Encoder(nn.Module):
    """Position embedding (class token's and a ``side`` × ``side`` grid's), blocks, final norm."""

    def __init__(self, blocks: int, width: int, heads: int, mlp: int, side: int) -> None:
        super().__init__()
        self.side = side
        self.pos_embedding = nn.Parameter(torch.empty(1, side * side + 1, width).normal_(std=0.02))
        self.layers = nn.Sequential(OrderedDict(
            (f"encoder_layer_{i}", EncoderBlock(width, heads, mlp)) for i in range(blocks)
        ))
        self.ln = nn.LayerNorm(width, eps=1e-6)

    def forward(self, x: torch.Tensor, grid: torch.Size) -> torch.Tensor:
        """``x``: class token then the patches of a ``grid`` (rows, columns), row-major."""
        return self.ln(self.layers(x + self._position(grid)))

    def _position(self, grid: torch.Size) -> torch.Tensor:
        token, patches = self.pos_embedding[:, :1], self.pos_embedding[:, 1:]
        patches = patches.reshape(1, self.side, self.side, -1).permute(0, 3, 1, 2)
        patches = F.interpolate(patches, size=grid, mode="bicubic", align_corners=False)
        return torch.cat([token, patches.flatten(2).transpose(1, 2)], 1)


class VisionTransformer(nn.Module):
    """Patch convolution, class token, encoder, linear head on the class token."""

    def __init__(self, size: str = "b", image: int = 224, patch: int = 16, num_classes: int = 1000) -> None:
        super().__init__()
        if size not in SIZES:
            raise ValueError(f"unknown ViT size {size!r}: one of {', '.join(SIZES)}")
        width, blocks, heads, mlp = SIZES[size]
        self.conv_proj = nn.Conv2d(3, width, patch, patch)
        self.class_token = nn.Parameter(torch.zeros(1, 1, width))
        self.encoder = Encoder(blocks, width, heads, mlp, image // patch)
        self.heads = nn.Sequential()
        self.heads.add_module("head", nn.Linear(width, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_proj(x)
        grid = x.shape[-2:]
        x = x.flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], 1)
        return self.heads(self.encoder(x, grid)[:, 0])


def vit_s16(num_classes: int = 1000) -> VisionTransformer:
    """ViT-S/16 (DeiT-S width): 384 wide, 12 blocks of 6 heads, 22.1 M parameters."""
    return VisionTransformer("s", num_classes=num_classes)


def vit_b16(num_classes: int = 1000) -> VisionTransformer:
    """ViT-B/16: 768 wide, 12 blocks of 12 heads, 86.6 M parameters (torchvision ``vit_b_16``)."""
    return VisionTransformer("b", num_classes=num_classes)
