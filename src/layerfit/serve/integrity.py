"""Periodic re-verification of a server's models (``--reverify-every SECONDS``).

The engine checks each unit's SHA-256 on its first read (``--verify first``); a weights
file that changes afterwards (a bit flip, a copy over it with the modification time
put back, a half-zeroed file) would then be served without a word. A background thread
re-reads every READY model's weights, a piece at a time, and hashes them; a model whose
bytes no longer match is taken out of service (UNAVAILABLE: 503, not ready) with the
reason, until it is loaded again (``POST /v2/repository/models/NAME/load``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from layerfit.errors import LayerfitError
from layerfit.store.verify import verify_folder

if TYPE_CHECKING:
    from layerfit.schedule.runtime.repository import ModelInfo

log = logging.getLogger("layerfit.serve")


class VerifiedRuntime(Protocol):
    """What re-verification asks of the runtime (:class:`~layerfit.Runtime` is one): its
    models, and taking one out of service."""

    @property
    def models(self) -> Mapping[str, ModelInfo]: ...

    def mark_unavailable(self, name: str, reason: str) -> None: ...


class Reverifier:
    """Re-hashes the runtime's READY models every ``interval`` seconds on its own thread."""

    def __init__(self, runtime: VerifiedRuntime, interval: float) -> None:
        self.runtime = runtime
        self.interval = interval
        self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check_once(self) -> dict[str, str]:
        """Verify every READY model now; the models taken out of service, with why."""
        failed: dict[str, str] = {}
        for name, info in list(self.runtime.models.items()):
            if self._stop.is_set():
                break
            if not info.loaded:
                continue
            try:
                verify_folder(info.directory)
            except (LayerfitError, OSError) as exc:
                reason = (f"its weights failed re-verification ({exc}); fix or prepare the folder again, "
                          "then load it")
                self.runtime.mark_unavailable(name, reason)
                failed[name] = reason
                log.warning("model %s taken out of service: %s", name, reason)
        self.failures += len(failed)
        return failed

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check_once()
            except Exception:  # never let the thread die silently: log and go on
                log.exception("re-verification failed")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="layerfit-reverify", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop after the model being hashed now; never waits (the thread is a daemon)."""
        self._stop.set()
