"""The prepared-model store: manifest + aligned, checksummed weight segments.

Names load on first use (:mod:`layerfit.lazy`), so that importing a light submodule
(``layerfit.store.outputs``) does not import PyTorch.
"""

from __future__ import annotations

from layerfit.lazy import lazy_exports

_EXPORTS = {
    "ALIGN": "manifest",
    "MANIFEST": "manifest",
    "WEIGHTS": "manifest",
    "Manifest": "manifest",
    "Segment": "manifest",
    "TensorLayout": "manifest",
    "read_manifest": "manifest",
    "ModelSpec": "model_spec",
    "resolve": "model_spec",
    "SegmentReader": "reader",
    "aligned_buffer": "reader",
    "check_weights_file": "reader",
    "verify_segment": "reader",
    "example_call": "examples",
    "example_input": "examples",
    "prepare": "writer",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
