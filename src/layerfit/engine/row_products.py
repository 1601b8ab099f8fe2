"""What the products that go over a weight part by part share (issue #54).

:class:`~layerfit.engine.int4_packed.BlockRows` and :class:`~layerfit.engine.q6k_packed.Q6KStripes`
are multiplied from their first bytes to their last, and the engine may give each part
back to the read buffer once the product has used it (their ``used`` callback). Such a
weight is then not there to multiply again: :func:`begin_product` refuses a second product
in one pass, in one line that says what to do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from layerfit.errors import LayerfitError


class PartProduct(Protocol):
    """A weight multiplied part by part whose parts the engine may give back as used."""

    type_name: str
    shape: tuple[int, int]
    used: Callable[[int], None] | None
    spent: bool


def begin_product(weight: PartProduct) -> None:
    """A product of `weight` begins: refuse it if an earlier one gave its bytes back; mark
    it spent if this one will."""
    if weight.spent:
        raise LayerfitError(
            f"a {weight.type_name} weight {list(weight.shape)} whose bytes were given back as its "
            "product used them ran a second product in one pass: load the model with read_ahead=False"
        )
    weight.spent = weight.used is not None


__all__ = ["PartProduct", "begin_product"]
