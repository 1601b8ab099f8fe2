"""New tokens to text as they come: what each token adds, and where a stop string ends it.

A token's text is not always its own: a byte-level tokenizer splits a character over
tokens, and a word-level one puts a space between words. So the whole completion is
decoded after each token and what is new since the text given out is the token's delta.
Text that may be the start of a stop string, or ends in an unfinished character, is held
back until the next token says whether it is; a stop string found ends the text before it
(the stop string itself is not returned, as in the OpenAI API).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

REPLACEMENT = "\ufffd"  # what decoding gives for bytes of a character still unfinished


class TextStream:
    """The text of one completion, token by token, cut at the first of ``stops``."""

    def __init__(self, tokenizer: Any, stops: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stops = tuple(s for s in stops if s)
        self.ids: list[int] = []
        self.text = ""  # given out so far
        self.stopped = False

    def push(self, token: int) -> str:
        """The text ``token`` adds that is safe to give out now ("" while held back)."""
        self.ids.append(token)
        full = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        cut = self._first_stop(full)
        if cut is not None:
            self.stopped = True
            return self._give(full[:cut])
        if full.endswith(REPLACEMENT):
            return ""
        return self._give(full[: len(full) - self._held(full)])

    def finish(self) -> str:
        """The text held back, given out at the end (no stop string came)."""
        if self.stopped or not self.ids:
            return ""
        return self._give(self.tokenizer.decode(self.ids, skip_special_tokens=True))

    def _give(self, upto: str) -> str:
        delta = upto[len(self.text):] if upto.startswith(self.text) else ""
        if delta:
            self.text += delta
        return delta

    def _first_stop(self, full: str) -> int | None:
        """Where the first stop string begins in ``full`` (searching only text that may
        hold a new one), or None."""
        start = max(0, len(self.text) - max((len(s) for s in self.stops), default=0))
        found = [i for i in (full.find(s, start) for s in self.stops) if i >= 0]
        return min(found) if found else None

    def _held(self, full: str) -> int:
        """How many characters at the end of ``full`` begin some stop string."""
        for size in range(min(len(full), max((len(s) for s in self.stops), default=0)), 0, -1):
            if any(s.startswith(full[-size:]) for s in self.stops):
                return size
        return 0


__all__ = ["TextStream"]
