"""The ``layerfit`` command: parses arguments, calls the library, prints results.

Thin by design: every command is a few lines over a library function. Errors caused by
the user (:class:`~layerfit.errors.LayerfitError`) are printed as one line without a
traceback and exit with status 2. One module per command group, outside the library's
layers (nothing in the library imports this package):

* :mod:`.app` — the typer app, ``main``, ``--version``, ``--trust-factory``
* :mod:`.serve` — ``serve``
* :mod:`.config_options` — option groups that map one to one onto a config class;
  :mod:`.runtime_options` (``serve``, ``schedule run``:
  :class:`~layerfit.schedule.RuntimeConfig`) and :mod:`.engine_options` (``run``,
  ``tradeoff delay``: :class:`~layerfit.engine.config.EngineConfig`) are its two tables
* :mod:`.zoo` — ``zoo``
* :mod:`.memory` — ``plan``
* :mod:`.schedule` — ``schedule graph|profiles|contention|bound|generate|run``
* :mod:`.tradeoff` — ``tradeoff parts|delay``, ``profile``, ``partition``
  (:mod:`.parts_search` runs ``tradeoff parts``' search, imported when it runs)
* :mod:`.models` — ``prepare``, ``inspect``, ``verify``, ``run``
* :mod:`.generate` — ``generate`` (:mod:`.token_stream` prints and times its tokens,
  imported when it runs)
* :mod:`.trace` — ``plot-trace``

Importing it imports no PyTorch: the commands import what they use when they run.
"""

from __future__ import annotations

from layerfit.cli.app import app, console, main, print_json

# Each module registers its commands on ``app``; the order is ``layerfit --help``'s.
from layerfit.cli import serve, zoo, memory, schedule, tradeoff, models, generate, trace  # noqa: E402, F401, I001  isort: skip

__all__ = ["app", "console", "main", "print_json"]
