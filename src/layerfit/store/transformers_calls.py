"""transformers called as layerfit needs it: quietly, and by the keywords its version takes.

transformers logs what it finds while it loads (missing and unexpected keys, progress
bars) and renamed ``torch_dtype`` to ``dtype`` in 4.56; layerfit reports what matters in
its own words and supports the versions on either side of the rename.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' own loading chatter (missing/unexpected key reports, progress bars)
    silenced for the call: layerfit reports what matters in its own words."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def dtype_keyword() -> str:
    """The name transformers' loaders take the dtype by (``torch_dtype`` before 4.56)."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
