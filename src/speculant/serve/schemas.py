"""Request bodies of the OpenAI routes, validated by pydantic where they enter.

Fields a request leaves out take the server's defaults (a :class:`GenerationOptions` built
from the command line), so a field set to ``null`` (``"proposer": null``: plain decoding)
differs from one left out. Fields speculant does not know (``metadata``, ``reasoning_effort``,
a client's newer ones) are ignored and logged once per name, as vLLM does; OpenAI fields it
knows but does not implement are accepted only at their neutral value (penalties 0, no
``logit_bias``, no ``suffix``).
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
MAX_CHOICES = 16  # n: choices of one request, decoded one after another
MAX_TOP_LOGPROBS = 20  # vLLM's and OpenAI's chat limit

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


class JsonSchemaFormat(_Body):
    name: str = "response"
    description: str | None = None
    schema_: dict | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    """``text``, ``json_object`` (any JSON object) or ``json_schema`` (an instance of
    ``json_schema.schema``): the two JSON kinds are decoded under a grammar."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_present(self):
        if self.type == "json_schema" and (self.json_schema is None or
                                           self.json_schema.schema_ is None):
            raise ValueError("type json_schema needs json_schema.schema")
        return self


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
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] = 1
    response_format: ResponseFormat | None = None
    # neutral values only
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
    echo: bool = False  # the prompt before the completion (and its logprobs, with logprobs)
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    best_of: int | None = None
    suffix: Literal[None] = None

    @model_validator(mode="after")
    def _best_of_is_n(self):
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError(f"best_of must equal n ({self.n}): every choice is returned")
        return self


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


class FunctionDefinition(_Body):
    name: Annotated[str, Field(min_length=1, max_length=64)]
    description: str | None = None
    parameters: dict | None = None  # a JSON schema (None: no arguments)
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class ChatRequest(_Common):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    @model_validator(mode="after")
    def _check_tools(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        names = [tool.function.name for tool in self.tools or ()]
        if len(set(names)) != len(names):
            raise ValueError("two tools have one name")
        choice = self.tool_choice
        if choice not in (None, "none", "auto") and not names:
            raise ValueError("tool_choice names a call, and the request has no tools")
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise ValueError(f"tool_choice names {choice.function.name!r}, which is not "
                             f"one of the tools ({', '.join(names)})")
        if choice not in (None, "none", "auto") and self.response_format is not None and \
                self.response_format.type != "text":
            raise ValueError("tool_choice forcing a call and response_format cannot both "
                             "constrain the answer")
        return self

    @property
    def tool_list(self) -> list[dict] | None:
        """The tools as the chat template reads them (None: none, or ``tool_choice``
        ``none``)."""
        if not self.tools or self.tool_choice == "none":
            return None
        return [tool.model_dump(exclude_none=True, by_alias=True) for tool in self.tools]
