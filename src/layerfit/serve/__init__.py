"""HTTP inference server speaking the Open Inference Protocol (KServe v2), layer 8.

Layered as Seldon MLServer is: HTTP (:mod:`~layerfit.serve.app`, FastAPI on uvicorn) →
data plane (:mod:`~layerfit.serve.dataplane`) → model registry
(:mod:`~layerfit.serve.registry`) → :class:`layerfit.Runtime`, with typed protocol
messages (:mod:`~layerfit.serve.types`), tensor codecs for JSON and binary data
(:mod:`~layerfit.serve.codec`) and one error type mapped to ``{"error": ...}``
(:mod:`~layerfit.serve.errors`).

``ServeSettings``, ``serve``, ``build`` and ``ServerThread`` load on first use, so that
importing this package does not import FastAPI.
"""

from __future__ import annotations

from layerfit.extras import ensure
from layerfit.lazy import lazy_exports

ensure("serve")  # FastAPI, uvicorn, orjson, prometheus-client: one line naming the extra

_EXPORTS = {
    "ServeSettings": "server",
    "ServerThread": "server",
    "build": "server",
    "serve": "server",
    "create_app": "app",
    "DataPlane": "dataplane",
    "ModelRegistry": "registry",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
