"""Typed bodies of the generation routes: Triton's generate extension and the OpenAI
completions and chat completions.

Each is validated before anything else reads it, so a malformed field is refused in one
place, a 400 naming the field. The OpenAI bodies declare the fields the API has that the
server does not implement (``n``, ``logprobs``, penalties …) so that their default
values pass — clients send them — and any other value is refused naming the field,
never ignored; a field the API does not have is refused too.

Two extension fields, in every body: ``prompt_lookup`` (0 to
:data:`~layerfit.schedule.decoding.lookup.MAX_PROMPT_LOOKUP`), the tokens a greedy request
proposes per step from its own n-grams (0: none; absent: the server's ``--prompt-lookup``
for the model), and ``draft`` (true or false: whether the model's draft model, given by
``--draft``, proposes them; absent: it does when the model has one and the request asks
no prompt lookup). The tokens are the same either way; only the passes differ.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from layerfit.schedule.decoding.lookup import MAX_PROMPT_LOOKUP
from layerfit.schedule.decoding.sampling import Sampling

DEFAULT_MAX_TOKENS = 16  # the OpenAI completions default; the same for every route
MAX_STOPS = 4  # stop strings a request may give (OpenAI's limit)
MAX_STOP_CHARACTERS = 1024  # each: every token's text is searched for the start of one


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SamplingFields(_Strict):
    """The sampling parameters, as both APIs name them."""

    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=100)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    prompt_lookup: int | None = Field(default=None, ge=0, le=MAX_PROMPT_LOOKUP)  # an extension
    draft: bool | None = None  # an extension: the model's draft proposes (default: when it has one)

    @model_validator(mode="after")
    def _bounded_stops(self) -> SamplingFields:
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if len(stops) > MAX_STOPS or any(len(s) > MAX_STOP_CHARACTERS for s in stops):
            raise ValueError(f"stop: give at most {MAX_STOPS} strings of at most {MAX_STOP_CHARACTERS} characters each")
        return self

    def sampling(self, default_temperature: float) -> Sampling:
        return Sampling(
            temperature=default_temperature if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            seed=self.seed,
        )


class TritonGenerate(SamplingFields):
    """``POST /v2/models/{name}/generate``: ``text_input`` and the parameters, at the top
    level (as model inputs) or in ``parameters`` (as request parameters); greedy unless a
    temperature is given."""

    text_input: str
    parameters: SamplingFields | None = None
    stream: bool | None = None

    def merged(self) -> SamplingFields:
        """The parameters, those in ``parameters`` over those at the top level."""
        top = self.model_dump(include=set(SamplingFields.model_fields), exclude_none=True)
        inner = self.parameters.model_dump(exclude_none=True) if self.parameters is not None else {}
        return SamplingFields(**{**top, **inner})


class StreamOptions(_Strict):
    include_usage: bool = False


class _OpenAIRequest(SamplingFields):
    """Fields both OpenAI routes share; sampled at temperature 1 unless given (the API's
    default)."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    @model_validator(mode="after")
    def _only_what_is_served(self) -> _OpenAIRequest:
        unsupported = {
            "n": (self.n != 1, "only n=1 (one choice per request) is served"),
            "frequency_penalty": (self.frequency_penalty != 0, "penalties are not served: leave it 0"),
            "presence_penalty": (self.presence_penalty != 0, "penalties are not served: leave it 0"),
            "logit_bias": (bool(self.logit_bias), "logit_bias is not served"),
        }
        for name, (given, why) in unsupported.items():
            if given:
                raise ValueError(f"{name}: {why}")
        return self


class CompletionRequest(_OpenAIRequest):
    """``POST /v1/completions``: a prompt (text, one text in a list, or token ids)."""

    # tried in this order, stopping at the first that fits: a list of a million ids is
    # validated once as ids (pydantic's "smart" union also tried it as strings, making an
    # error object per id: 16 times the memory and time)
    prompt: str | list[int] | list[str] = Field(union_mode="left_to_right")
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str) and len(self.prompt) != 1:
            raise ValueError("prompt: give one prompt per request (a list of several is not served)")
        for name, given in (("echo", self.echo), ("logprobs", self.logprobs), ("best_of", self.best_of not in (None, 1)),
                            ("suffix", self.suffix)):
            if given:
                raise ValueError(f"{name}: not served by this server")
        return self


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # name, tool_call_id …: the template may read them

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatRequest(_OpenAIRequest):
    """``POST /v1/chat/completions``: messages, put through the tokenizer's chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False

    @model_validator(mode="after")
    def _served(self) -> ChatRequest:
        if self.logprobs:
            raise ValueError("logprobs: not served by this server")
        return self

    def limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


__all__ = [
    "DEFAULT_MAX_TOKENS",
    "ChatRequest",
    "CompletionRequest",
    "SamplingFields",
    "TritonGenerate",
]
