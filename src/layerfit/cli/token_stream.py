"""The streamer ``layerfit generate`` hands to Hugging Face's ``generate``: it prints each
new token as it is made and notes when it came, for the latencies the summary reports.

``generate`` calls ``put`` once with the prompt, then once per new token, each right
after the forward pass that made it, and ``end`` when it stops. The prompt latency is
the time to the first new token (the prompt's pass); the decode rate counts the tokens
after it over their time. The engine's ``last_weights_peak`` is read after every pass,
so the peak reported is the most any pass held.

Imports transformers (and so PyTorch): the command imports it when it runs.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from transformers import TextStreamer
from transformers.generation.streamers import BaseStreamer


class TokenStream(BaseStreamer):
    """Prints the new tokens (text through ``tokenizer``, else their ids; nothing when
    ``show`` is false) and records each one's id and arrival time, and the most weight
    bytes ``weights_peak()`` reported after any pass, and the storage bytes ``bytes_read()``
    counts at each token."""

    def __init__(
        self, tokenizer: Any | None, show: bool, weights_peak: Callable[[], int],
        bytes_read: Callable[[], int] = lambda: 0,
    ) -> None:
        self._text = TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True) if show and tokenizer else None
        self._ids = show and tokenizer is None
        self._weights_peak = weights_peak
        self._bytes_read = bytes_read
        self.read_at: list[int] = []  # storage bytes read so far, as each token came
        self.started = time.perf_counter()
        self.prompt_tokens: int | None = None  # set by the first put
        self.tokens: list[int] = []
        self.times: list[float] = []
        self.peak_bytes = 0

    def begin(self) -> None:
        """Start the clock: call right before ``generate``."""
        self.started = time.perf_counter()

    def put(self, value: Any) -> None:
        """The prompt (first call) or the next token, as a tensor of batch one."""
        now = time.perf_counter()
        ids = [int(i) for i in value.reshape(-1).tolist()]
        if self.prompt_tokens is None:
            self.prompt_tokens = len(ids)
        else:
            self.tokens.extend(ids)
            self.times.extend([now] * len(ids))
            self.read_at.extend([self._bytes_read()] * len(ids))
            self.peak_bytes = max(self.peak_bytes, self._weights_peak())
            if self._ids:
                sys.stdout.write(("" if len(self.tokens) == len(ids) else " ") + " ".join(map(str, ids)))
                sys.stdout.flush()
        if self._text is not None:
            self._text.put(value)

    def end(self) -> None:
        """The last token came: flush the text held back and end the line."""
        if self._text is not None:
            self._text.end()
        elif self._ids:
            sys.stdout.write("\n")
            sys.stdout.flush()

    @property
    def prompt_latency_s(self) -> float | None:
        """Seconds from the start to the first new token (None: none came)."""
        return self.times[0] - self.started if self.times else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """New tokens after the first per second of their time (None: fewer than two)."""
        if len(self.times) < 2 or self.times[-1] <= self.times[0]:
            return None
        return (len(self.times) - 1) / (self.times[-1] - self.times[0])

    @property
    def read_bytes_per_token(self) -> float | None:
        """Storage bytes read per new token after the first (the decode steps the rate
        counts; None: fewer than two)."""
        if len(self.read_at) < 2:
            return None
        return (self.read_at[-1] - self.read_at[0]) / (len(self.read_at) - 1)


__all__ = ["TokenStream"]
