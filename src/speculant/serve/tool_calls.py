"""Tool calls: a model's answer parsed back into OpenAI's ``tool_calls``, and the grammar that
forces a call.

``tool_choice: "auto"`` (the default with ``tools``): the tools reach the chat template (its
``tools`` variable) and the answer is parsed for calls in the common formats:

* Hermes, Qwen 2.5 / 3: ``<tool_call>{"name": …, "arguments": {…}}</tool_call>``, one or more;
* Mistral: ``[TOOL_CALLS][{"name": …, "arguments": {…}}, …]``;
* Llama 3.1+ JSON: the whole answer ``{"name": …, "parameters": {…}}`` (after an optional
  ``<|python_tag|>``), or several separated by ``;``.

Only the request's tool names count as calls; anything else stays content. ``"required"``
and a named function force a call as vLLM does, independent of the model's own format: the
answer is decoded under a grammar (workflow/constraint.py) that admits only the call as
JSON — the named function's arguments, or ``[{"name": …, "parameters": {…}}, …]`` over the
request's tools — and that JSON becomes the calls.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from speculant import Grammar

HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
MISTRAL = "[TOOL_CALLS]"
PYTHON_TAG = "<|python_tag|>"
NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text of an object

    def as_openai(self) -> dict:
        return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


def parse_tool_calls(text: str, names: set[str]) -> tuple[str | None, list[ParsedCall]]:
    """``(content, calls)`` of an answer: the calls it makes to tools in ``names`` in any of
    the formats above, and the text around them (None when there is none); no call: the
    text unchanged and ``[]``."""
    if "<tool_call>" in text:
        calls = [_call(found, names) for found in HERMES.findall(text)]
        if calls and all(calls):
            return _content(text[:text.index("<tool_call>")]), calls  # type: ignore[misc]
    if MISTRAL in text:
        head, _, tail = text.partition(MISTRAL)
        calls = _calls_in(tail.strip(), names)
        if calls:
            return _content(head), calls
    stripped = text.strip().removeprefix(PYTHON_TAG).strip()
    if stripped.startswith(("{", "[")):
        calls = _calls_in(stripped, names)
        if calls:
            return None, calls
    return text, []


def _calls_in(text: str, names: set[str]) -> list[ParsedCall]:
    """The calls of JSON ``text``: a call object, a list of them, or objects joined by
    ``;`` — all of them calls, or none."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while at < len(text):
        try:
            value, at = decoder.raw_decode(text, at)
        except ValueError:
            return []
        found.extend(value if isinstance(value, list) else [value])
        at = len(text) - len(text[at:].lstrip().removeprefix(";").lstrip())
    calls = [_call_of(value, names) for value in found]
    return calls if calls and all(calls) else []  # type: ignore[return-value]


def _call(json_text: str, names: set[str]) -> ParsedCall | None:
    try:
        return _call_of(json.loads(json_text), names)
    except ValueError:
        return None


def _call_of(value: Any, names: set[str]) -> ParsedCall | None:
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(value["name"], json.dumps(arguments, ensure_ascii=False))


def _content(text: str) -> str | None:
    return text.strip() or None


@dataclass(frozen=True)
class ToolAnswer:
    """How a chat's answer becomes tool calls: parsed from the model's format
    (``grammar`` None: ``tool_choice`` auto), or forced by ``grammar`` (``required``, or the
    function ``named``)."""

    names: frozenset[str]
    named: str | None = None
    grammar: Grammar | None = None

    @classmethod
    def of(cls, body: Any) -> ToolAnswer:
        """Of a chat request (``tools``, ``tool_choice``, ``parallel_tool_calls``)."""
        tools, choice = body.tool_list or [], body.tool_choice
        named = None if choice is None or isinstance(choice, str) else choice.function.name
        is_forced = bool(tools) and (named is not None or choice == "required")
        return cls(frozenset(t["function"]["name"] for t in tools), named,
                   forced_grammar(tools, named, body.parallel_tool_calls) if is_forced
                   else None)

    def parse(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        """``(content, calls)`` of an answer."""
        if self.grammar is None:
            return parse_tool_calls(text, set(self.names))
        calls = forced_calls(text, self.named)
        return (None if calls else text), calls


def forced_grammar(tools: list[dict], named: str | None,
                   parallel: bool | None) -> Grammar:
    """The grammar of a forced call: the arguments of ``named``, or (``"required"``) a
    non-empty list of calls of the tools (one at most where ``parallel`` is False)."""
    parameters = {t["function"]["name"]: t["function"].get("parameters") or NO_ARGUMENTS
                  for t in tools}
    if named is not None:
        return Grammar.json_schema(parameters[named])
    call = {"anyOf": [{"type": "object", "properties": {"name": {"const": name},
                                                         "parameters": schema},
                       "required": ["name", "parameters"], "additionalProperties": False}
                      for name, schema in parameters.items()]}
    return Grammar.json_schema({"type": "array", "items": call, "minItems": 1,
                                **({"maxItems": 1} if parallel is False else {})})


def forced_calls(text: str, named: str | None) -> list[ParsedCall]:
    """The calls of an answer decoded under :func:`forced_grammar` (none where it was cut
    short before the JSON closed)."""
    try:
        value = json.loads(text)
    except ValueError:
        return []
    if named is not None:
        return [ParsedCall(named, json.dumps(value, ensure_ascii=False))]
    return [ParsedCall(c["name"], json.dumps(c["parameters"], ensure_ascii=False))
            for c in value]
