"""AgeNet and GenderNet (Levi & Hassner, "Age and gender classification using CNNs", 2015).

The same small network with 8 age groups or 2 genders as outputs, as in the authors'
Caffe deploy files: conv1 96×7×7/4, conv2 256×5×5, conv3 384×3×3, each followed by ReLU
and 3×3/2 max pooling (rounding up, as Caffe does), the first two also by local response
normalisation; then fc6 and fc7 of 512 with dropout, and fc8. Input 227×227 crops, so
the last feature map is 7×7 and fc6 has 18816 inputs. MASA (EdgeCaffe) schedules both
(44 MB each, Table 6.1 of the thesis).
"""

from __future__ import annotations

import torch
from torch import nn


class LeviHassnerNet(nn.Module):
    """Three conv layers and three fully connected layers; input 227×227."""

    def __init__(self, num_classes: int, dropout: float = 0.5) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 96, 7, 4), nn.ReLU(), nn.MaxPool2d(3, 2, ceil_mode=True),
            nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75),
            nn.Conv2d(96, 256, 5, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2, ceil_mode=True),
            nn.LocalResponseNorm(5, alpha=1e-4, beta=0.75),
            nn.Conv2d(256, 384, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2, ceil_mode=True),
        )
        self.classifier = nn.Sequential(
            nn.Linear(384 * 7 * 7, 512), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(512, 512), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(512, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def agenet(num_classes: int = 8) -> LeviHassnerNet:
    """AgeNet: 8 age groups (0-2, 4-6, 8-13, 15-20, 25-32, 38-43, 48-53, 60-)."""
    return LeviHassnerNet(num_classes)


def gendernet(num_classes: int = 2) -> LeviHassnerNet:
    """GenderNet: 2 outputs (male, female)."""
    return LeviHassnerNet(num_classes)
