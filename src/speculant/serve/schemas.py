"""Request bodies of the OpenAI routes, validated by pydantic where they enter.

Fields a request leaves out take the server's defaults (a :class:`GenerationOptions` built
from the command line), so a field set to ``null`` (``"proposer": null``: plain decoding)
differs from one left out. Fields speculant does not know (``metadata``, ``reasoning_effort``,
a client's newer ones) are ignored and logged once per name, as vLLM does; OpenAI fields it
knows but does not implement are accepted only at their neutral value (``n: 1``, no
``logprobs``, penalties 0, no ``logit_bias``, no ``suffix``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Annotated, Any, Literal

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
log = logging.getLogger("speculant.serve")
_LOGGED: set[str] = set()  # unknown field names already logged


class _Body(BaseModel):
    """Strict types; unknown fields kept aside (``model_extra``), logged once per name and
    otherwise ignored."""

    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)

    @model_validator(mode="after")
    def _log_unknown_fields(self):
        for name in self.model_extra or ():
            where = f"{type(self).__name__}.{name}"
            if where not in _LOGGED:
                _LOGGED.add(where)
                log.info("ignoring the unknown request field %r (%s; logged once)", name,
                         type(self).__name__)
        return self


class StreamOptions(_Body):
    include_usage: bool = False


class _Common(_Body):
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


class TextPart(_Body):
    type: Literal["text"]
    text: str


class FunctionCall(_Body):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Body):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool's answer names the call

    @model_validator(mode="after")
    def _has_content(self):
        if self.content is None and not self.tool_calls:
            raise ValueError(f"a {self.role} message needs content")
        return self

    def as_dict(self, *, has_developer_role: bool = True) -> dict[str, Any]:
        """The message as a chat template reads it (transformers' form): ``developer`` as
        ``system`` where the template has no developer role; tool calls with their
        arguments parsed (templates write them with ``tojson``)."""
        content = self.content if isinstance(self.content, str) else \
            "".join(part.text for part in self.content or ())
        role = "system" if self.role == "developer" and not has_developer_role else self.role
        message: dict[str, Any] = {"role": role, "content": content}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": call.id, "type": "function",
                 "function": {"name": call.function.name,
                              "arguments": _parsed(call.function.arguments)}}
                for call in self.tool_calls]
        return message


def _parsed(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments  # a template that writes text gets the text


class ChatRequest(_Common):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: Literal[False] | None = None
    top_logprobs: Literal[None] = None
