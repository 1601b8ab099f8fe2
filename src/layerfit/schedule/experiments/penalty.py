"""Page-fault slowdown of a task when physical memory is over-committed.

Calibrated from thesis Fig. 6.3: SceneNet (peak 892 MB) loaded in bulk with less and
less RAM; execution time relative to 1 GB. The over-commit ratio is
``r = memory in use / physical memory``:

=========  ======  ========================  ===========================
RAM        r       fully connected layers    convolutional layers
=========  ======  ========================  ===========================
2 GB       0.44    1.0×                      1.0×
1 GB       0.87    1.0×                      1.0×
512 MB     1.74    2.5× (text of §6.1.2)     ≈1.0× ("negligible")
256 MB     3.48    7.2× (whole network)      7.2× (whole network)
=========  ======  ========================  ===========================

At 256 MB the thesis gives only the whole network's slowdown; it is used for both
classes. The memory-heavy curve runs through (1, 1), (1.74, 2.5), (3.48, 7.2); the
light curve through (1, 1), (1.74, 1.0), (3.48, 7.2); both are piecewise linear and
continue with their last slope beyond 3.48. A task's weight between the curves is its
share of physical memory relative to ``heavy_share``: the thesis explains the split by
page-fault probability growing with a layer's memory, and SceneNet's fc layers each
need well over a quarter of 512 MB while its conv layers need a few MB.

The slowdown is evaluated when a task starts, with the memory in use at that moment
(including the task itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Point = tuple[float, float]


def _interpolate(points: Sequence[Point], x: float) -> float:
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = points[-2], points[-1]
    return y1 + (y1 - y0) * (x - x1) / (x1 - x0)


@dataclass(frozen=True)
class PagingModel:
    """Slowdown factor as a function of over-commit ratio and the task's memory share."""

    heavy: tuple[Point, ...] = ((1.0, 1.0), (1.74, 2.5), (3.48, 7.2))
    light: tuple[Point, ...] = ((1.0, 1.0), (1.74, 1.0), (3.48, 7.2))
    heavy_share: float = 0.25

    def slowdown(self, overcommit_ratio: float, task_share: float) -> float:
        """How many times longer a task takes; 1.0 while memory is not over-committed."""
        if overcommit_ratio <= 1.0:
            return 1.0
        weight = min(1.0, max(0.0, task_share) / self.heavy_share)
        heavy = _interpolate(self.heavy, overcommit_ratio)
        light = _interpolate(self.light, overcommit_ratio)
        return max(1.0, weight * heavy + (1.0 - weight) * light)

    def describe(self) -> dict[str, object]:
        return {
            "source": "thesis Fig. 6.3 (SceneNet bulk, 892 MB peak, 2 GB/1 GB/512 MB/256 MB RAM)",
            "heavy_points": [list(p) for p in self.heavy],
            "light_points": [list(p) for p in self.light],
            "heavy_share": self.heavy_share,
        }
