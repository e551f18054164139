"""The tool-call parser (serve/tool_calls.py): the common formats become OpenAI's calls;
anything else stays content."""

from __future__ import annotations

import json

import pytest

from speculant.serve.tool_calls import ParsedCall, forced_calls, forced_grammar, parse_tool_calls

NAMES = {"weather", "time"}


def call(name: str, **arguments) -> ParsedCall:
    return ParsedCall(name, json.dumps(arguments))


@pytest.mark.parametrize("text, content, calls", [
    ('<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     None, [call("weather", city="Paris")]),
    ('Let me check.\n<tool_call>{"name": "weather", "arguments": {"city": "Oslo"}}</tool_call>'
     '\n<tool_call>{"name": "time", "arguments": {}}</tool_call>',
     "Let me check.", [call("weather", city="Oslo"), call("time")]),
    ('<tool_call>{"name": "time", "arguments": {}}', None, [call("time")]),  # cut at the end
    ('[TOOL_CALLS][{"name": "weather", "arguments": {"city": "Rome"}}, '
     '{"name": "time", "arguments": {"zone": "CET"}}]', None,
     [call("weather", city="Rome"), call("time", zone="CET")]),
    ('{"name": "weather", "parameters": {"city": "Lima"}}', None, [call("weather", city="Lima")]),
    ('<|python_tag|>{"name": "time", "parameters": {}}; {"name": "weather", "parameters": '
     '{"city": "Kyiv"}}', None, [call("time"), call("weather", city="Kyiv")]),
    ('{"name": "weather", "arguments": "{\\"city\\": \\"Bern\\"}"}', None,
     [call("weather", city="Bern")]),
])
def test_formats_become_calls(text, content, calls):
    assert parse_tool_calls(text, NAMES) == (content, calls)


@pytest.mark.parametrize("text", [
    "It is sunny in Paris.",
    '{"name": "stocks", "parameters": {}}',  # not one of the tools
    '{"city": "Paris"}',  # JSON that is not a call
    '<tool_call>{"name": "weather", "arguments": {"city": </tool_call>',  # broken JSON
    '{"name": "weather", "parameters": {}} and then some words',
    '[TOOL_CALLS] nothing',
])
def test_anything_else_stays_content(text):
    assert parse_tool_calls(text, NAMES) == (text, [])


def test_a_call_has_an_openai_id_and_json_arguments():
    shaped = call("weather", city="Paris").as_openai()
    assert shaped["id"].startswith("call_") and shaped["type"] == "function"
    assert json.loads(shaped["function"]["arguments"]) == {"city": "Paris"}


TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "time"}}]


def test_a_named_call_is_its_arguments():
    grammar = forced_grammar(TOOLS, "weather", None)
    assert json.loads(grammar.source) == TOOLS[0]["function"]["parameters"]
    assert forced_calls('{"city": "Paris"}', "weather") == [call("weather", city="Paris")]


def test_a_required_call_is_a_list_of_calls_of_the_tools():
    schema = json.loads(forced_grammar(TOOLS, None, False).source)
    assert schema["minItems"] == 1 and schema["maxItems"] == 1
    names = [option["properties"]["name"]["const"] for option in schema["items"]["anyOf"]]
    assert names == ["weather", "time"]
    assert "maxItems" not in json.loads(forced_grammar(TOOLS, None, None).source)
    text = '[{"name": "time", "parameters": {}}]'
    assert forced_calls(text, None) == [call("time")]
    assert forced_calls('[{"name": "time", "param', None) == []  # cut short
