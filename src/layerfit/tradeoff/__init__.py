"""Trade-offs between memory and speed, one subpackage per paper reproduced.

* :mod:`layerfit.tradeoff.parts` - Minakova & Stefanov (2022): the memory-throughput
  trade-off of CNN-based applications (buffer reuse, processing by parts, the genetic
  search).
* :mod:`layerfit.tradeoff.swapnet` - SwapNet: the delay model, the block partition under
  a budget, run-time re-partitioning and several models sharing one budget.
* :mod:`layerfit.tradeoff.delay` - Demand Layering's minimal-delay buffer size (Section
  V-D), a search over the streaming engine's budget.

The package needs its ``tradeoff`` extra (pymoo, PyYAML): importing it without the
extra is one line naming the install. It imports neither subpackage, so SwapNet's
modules do not import the Minakova half (nor PyYAML) they never use.
"""

from layerfit.extras import ensure

ensure("tradeoff")
