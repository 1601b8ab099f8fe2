"""PoseNet (Kendall, Grimes & Cipolla, ICCV 2015): 6-DoF camera pose from one image.

GoogLeNet with its softmax classifiers replaced by pose regressors, as in the authors'
Caffe model: the final branch average-pools the 1024-channel inception 5b output, adds a
2048-wide fully connected layer with ReLU (``cls3_fc1_pose``) and regresses position
(``xyz``, 3 values) and orientation quaternion (``wpqr``, 4 values). The two auxiliary
regressors serve only training and are left out. The output is one tensor ``(N, 7)``:
``xyz`` then ``wpqr``. Input 224×224.
"""

from __future__ import annotations

import torch
from torch import nn

from layerfit.zoo.googlenet import GoogLeNetTrunk


class PoseNet(nn.Module):
    """GoogLeNet trunk + pose regressor head; returns ``cat([xyz, wpqr], 1)``."""

    def __init__(self, hidden: int = 2048, dropout: float = 0.5) -> None:
        super().__init__()
        self.trunk = GoogLeNetTrunk()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc_pose = nn.Linear(self.trunk.out_channels, hidden)
        self.relu = nn.ReLU()
        self.dropout = nn.Dropout(dropout)
        self.fc_xyz = nn.Linear(hidden, 3)
        self.fc_wpqr = nn.Linear(hidden, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.avgpool(self.trunk(x)), 1)
        x = self.dropout(self.relu(self.fc_pose(x)))
        return torch.cat([self.fc_xyz(x), self.fc_wpqr(x)], 1)


def posenet() -> PoseNet:
    """PoseNet (GoogLeNet-based camera pose regressor)."""
    return PoseNet()
