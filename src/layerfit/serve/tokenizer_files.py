"""The tokenizer files of a prepared language model, checked before transformers reads them.

A prepared folder holds the tokenizer files of the Hugging Face folder it was prepared
from, and the server hands them to ``AutoTokenizer`` on a model's first generation
request. What transformers and the ``tokenizers`` library do with broken files is
theirs to say, as a traceback: so the server reads every JSON file of the tokenizer
first, through :func:`layerfit.strict_json.parse` (bounded in size and nesting, one line
for any breakage), and refuses a ``tokenizer_config.json`` that maps the tokenizer to
code of the folder (``auto_map``): the server never runs a model's own code, so such a
tokenizer could not load. :class:`~layerfit.serve.registry.ModelRegistry` checks this when
it loads a model, so a model with a broken tokenizer stays UNAVAILABLE with the reason.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from layerfit import strict_json

TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                  "chat_template.json")
"""The JSON files ``AutoTokenizer`` may read from a folder."""

MAX_TOKENIZER_FILE = 256 * 2**20
"""The largest tokenizer file read (the largest published ``tokenizer.json`` are ~35 MB)."""


def tokenizer_problem(directory: Path) -> str | None:
    """Why the tokenizer files in ``directory`` cannot be used, in one line, or None
    (also when there are none: a model without a tokenizer does not generate, no fault)."""
    for name in TOKENIZER_JSON:
        path = directory / name
        try:
            info = path.lstat()
        except FileNotFoundError:
            continue
        except OSError as exc:
            return f"{name} cannot be read: {exc.strerror or exc}"
        if not stat.S_ISREG(info.st_mode):
            return f"{name} is not a regular file"
        if info.st_size > MAX_TOKENIZER_FILE:
            return f"{name} is {info.st_size:,} bytes, more than the {MAX_TOKENIZER_FILE:,} a tokenizer file may have"
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as file:
                raw = file.read(MAX_TOKENIZER_FILE + 1)
        except OSError as exc:
            return f"{name} cannot be read: {exc.strerror or exc}"
        try:
            document = strict_json.parse(raw, name, MAX_TOKENIZER_FILE)
        except strict_json.JSONTextError as exc:
            return str(exc)
        if name in ("tokenizer.json", "tokenizer_config.json") and not isinstance(document, dict):
            return f"{name} is not a JSON object"
        if name == "tokenizer_config.json" and "auto_map" in document:
            return ("tokenizer_config.json maps the tokenizer to code in the folder (auto_map); the server never "
                    "runs a model's own code: prepare it from a folder whose tokenizer transformers has built in")
    return None


__all__ = ["MAX_TOKENIZER_FILE", "TOKENIZER_JSON", "tokenizer_problem"]
