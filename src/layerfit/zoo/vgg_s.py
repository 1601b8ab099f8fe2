"""VGG-S / CNN-S (Chatfield et al., "Return of the devil in the details", BMVC 2014).

The "slow" network of the paper's Table 1, as in the Caffe model zoo's ``VGG_CNN_S``:
conv1 96×7×7/2 + LRN + 3×3/3 max pool; conv2 256×5×5 (pad 1) + 2×2/2 max pool;
conv3–5 512×3×3; 3×3/3 max pool; fc6 and fc7 of 4096; fc8. Caffe pools round up
(``ceil_mode``). At 224×224 the last feature map is 6×6, so fc6 has 18432 inputs. MASA's
EmotionNet is this architecture with 7 outputs (378 MB, Table 6.1 of the thesis).
"""

from __future__ import annotations

import torch
from torch import nn


class VGGS(nn.Module):
    """CNN-S: five conv layers and three fully connected layers; input 224×224."""

    def __init__(self, num_classes: int = 1000, dropout: float = 0.5) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 96, 7, 2), nn.ReLU(),
            nn.LocalResponseNorm(5, alpha=0.0005, beta=0.75, k=2.0),
            nn.MaxPool2d(3, 3, ceil_mode=True),
            nn.Conv2d(96, 256, 5, padding=1), nn.ReLU(), nn.MaxPool2d(2, 2, ceil_mode=True),
            nn.Conv2d(256, 512, 3, padding=1), nn.ReLU(),
            nn.Conv2d(512, 512, 3, padding=1), nn.ReLU(),
            nn.Conv2d(512, 512, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(3, 3, ceil_mode=True),
        )
        self.classifier = nn.Sequential(
            nn.Linear(512 * 6 * 6, 4096), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def vgg_s(num_classes: int = 1000) -> VGGS:
    """VGG-S (CNN-S) with ``num_classes`` outputs."""
    return VGGS(num_classes)
