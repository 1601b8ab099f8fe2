"""AlexNet (Krizhevsky et al., 2012) in its single-tower form ("one weird trick", 2014).

The single-GPU variant (64/192/384/256/256 filters, no grouped convolutions) as used by
the common PyTorch layout, with 6×6 adaptive average pooling before the classifier.
"""

from __future__ import annotations

import torch
from torch import nn


class AlexNet(nn.Module):
    """Five conv layers with three max pools, then three fully connected layers."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.5) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(), nn.MaxPool2d(3, 2),
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(),
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(dropout), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(),
            nn.Dropout(dropout), nn.Linear(4096, 4096), nn.ReLU(),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def alexnet(num_classes: int = 1000) -> AlexNet:
    """Single-tower AlexNet with ``num_classes`` outputs."""
    return AlexNet(num_classes)
