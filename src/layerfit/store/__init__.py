"""The prepared-model store: manifest + aligned, checksummed weight segments."""

from layerfit.store.manifest import (
    ALIGN,
    MANIFEST,
    WEIGHTS,
    Manifest,
    Segment,
    TensorLayout,
    read_manifest,
)
from layerfit.store.model_spec import ModelSpec, resolve
from layerfit.store.reader import SegmentReader, aligned_buffer, check_weights_file, verify_segment
from layerfit.store.writer import example_input, prepare

__all__ = [
    "ALIGN",
    "MANIFEST",
    "WEIGHTS",
    "Manifest",
    "ModelSpec",
    "Segment",
    "SegmentReader",
    "TensorLayout",
    "aligned_buffer",
    "check_weights_file",
    "example_input",
    "prepare",
    "read_manifest",
    "resolve",
    "verify_segment",
]
