"""Request bodies of the OpenAI routes, validated by pydantic where they enter.

Fields a request leaves out take the server's defaults (a :class:`GenerationOptions` built
from the command line), so a field set to ``null`` (``"proposer": null``: plain decoding)
differs from one left out. OpenAI fields speculant does not implement are accepted only at
their neutral value (``n: 1``, ``logprobs: null``, penalties 0); unknown fields are refused.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from speculant import GenerationOptions
from speculant.speculative.kinds import NAMES

PROPOSERS = NAMES  # the kinds registry's names: chained, draft, prompt_lookup
MAX_STOP_STRINGS = 4  # OpenAI's limit
MAX_STOP_CHARS = 256

# request field -> GenerationOptions field
_OPTION_FIELDS = {"max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens",
                  "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                  "min_p": "min_p", "seed": "seed", "stop": "stop", "proposer": "proposer",
                  "k": "k"}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # accepted, unused
    # neutral values only
    n: Literal[1] = 1
    presence_penalty: Literal[0, 0.0] = 0.0
    frequency_penalty: Literal[0, 0.0] = 0.0
    logit_bias: Annotated[dict, Field(max_length=0)] | None = None
    # extensions (speculant): sampling and speculation
    top_k: Annotated[int, Field(ge=0)] | None = None
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    proposer: Literal[PROPOSERS] | None = None  # type: ignore[valid-type]
    k: Annotated[int, Field(ge=1)] | None = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, stop: str | list[str] | None) -> list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop
        if stops is None:
            return None
        if len(stops) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings")
        if any(not s or len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"a stop string has 1 to {MAX_STOP_CHARS} characters")
        return stops

    @model_validator(mode="after")
    def _check_stream_options(self):
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream=true")
        return self

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def options(self, defaults: GenerationOptions) -> GenerationOptions:
        """The server's defaults, replaced by every option field this request set."""
        changes = {}
        for name in self.model_fields_set & _OPTION_FIELDS.keys():
            value = getattr(self, name)
            if name == "stop":
                value = tuple(value or ())
            elif value is None and name not in ("proposer", "k"):
                continue  # null: the default (proposer and k: null is a value)
            changes[_OPTION_FIELDS[name]] = value
        return dataclasses.replace(defaults, **changes)


class CompletionRequest(_Common):
    prompt: Annotated[str, Field(min_length=1)] | Annotated[list[int], Field(min_length=1)]
    echo: Literal[False] = False
    logprobs: Literal[None] = None
    best_of: Literal[1] | None = None
    suffix: Literal[None] = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def as_dict(self) -> dict[str, str]:
        content = self.content if isinstance(self.content, str) else \
            "".join(part.text for part in self.content)
        return {"role": self.role, "content": content}


class ChatRequest(_Common):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: Literal[False] | None = None
    top_logprobs: Literal[None] = None
