"""layerfit: run deep neural networks within a memory budget smaller than the networks.

The public entry points are re-exported here; see ``DESIGN.md`` for the layer map.
"""

from __future__ import annotations

from layerfit.errors import LayerfitError

__all__ = ["LayerfitError"]
__version__ = "0.1.0"
