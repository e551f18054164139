"""What agent frameworks ask of the server, through the official ``openai`` client, on the demo
pair with a Hermes-style chat template: ``response_format`` (JSON mode and JSON schema, with
and without speculation), ``tools`` / ``tool_choice``, ``logprobs`` / ``top_logprobs``, ``n``
and ``echo``."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from pathlib import Path

import openai
import pytest

import speculant
from speculant import GenerationOptions, Grammar
from speculant.serve.app import create_app

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema validates the outputs")
MODEL = "demo-chat"
HERMES_TEMPLATE = """\
{%- if tools %}<|im_start|>system
You may call these functions:
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
Call one as <tool_call>{"name": ..., "arguments": ...}</tool_call>.<|im_end|>
{% endif %}
{%- for m in messages %}
{%- if m.role == "assistant" and m.tool_calls %}<|im_start|>assistant
{%- for call in m.tool_calls %}
<tool_call>{{ {"name": call.function.name, "arguments": call.function.arguments} | tojson }}
</tool_call>
{%- endfor %}<|im_end|>
{% elif m.role == "tool" %}<|im_start|>user
<tool_response>{{ m.content }}</tool_response><|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
PET = {"type": "object",
       "properties": {"name": {"type": "string", "maxLength": 12},
                      "age": {"type": "integer", "minimum": 0, "maximum": 30},
                      "kind": {"enum": ["cat", "dog"]}},
       "required": ["name", "age", "kind"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                                    "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The time now"}}
ASK = [{"role": "user", "content": "Describe a pet as JSON."}]


def write_demo_chat(root: Path) -> Path:
    demo = Path(speculant.__file__).parent / "demo"
    shutil.copytree(demo, root)
    (root / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": HERMES_TEMPLATE, "bos_token": "", "eos_token": "</s>"}))
    return root


@pytest.fixture(scope="module")
def demo_chat(tmp_path_factory) -> speculant.Engine:
    return speculant.load(write_demo_chat(tmp_path_factory.mktemp("agents") / MODEL))


@pytest.fixture(scope="module")
def agent_client(serve_app, demo_chat) -> openai.OpenAI:
    base = serve_app(create_app(demo_chat, MODEL))
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


def json_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "pet", "schema": schema,
                                                   "strict": True}}


@pytest.fixture(scope="module")
def needs_llguidance():
    pytest.importorskip("llguidance", reason="the structured extra is not installed")


@pytest.mark.parametrize("extra", [{}, {"proposer": "chained", "k": 4},
                                   {"proposer": "prompt_lookup", "k": 3}])
def test_json_schema_answers_validate_and_speculation_changes_nothing(
        needs_llguidance, agent_client, demo_chat, extra):
    prompt, options = demo_chat.prepare_chat(ASK, GenerationOptions(
        max_new_tokens=60, grammar=Grammar.json_schema(PET)))
    expected = demo_chat.generate(prompt, dataclasses.replace(options, stop=()))  # the grammar
    # ends the answer, not the template's end-of-turn text
    answer = agent_client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=60, response_format=json_format(PET),
        extra_body=extra)
    content = answer.choices[0].message.content
    assert content == expected.text and answer.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(content), PET)


def test_json_mode_answers_an_object(needs_llguidance, agent_client):
    answer = agent_client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=60, response_format={"type": "json_object"})
    choice = answer.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict)
    else:
        assert choice.message.content.startswith("{")


def test_a_streamed_json_schema_answer_is_the_same(needs_llguidance, agent_client):
    whole = agent_client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=60, response_format=json_format(PET))
    chunks = list(agent_client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=60, response_format=json_format(PET),
        stream=True, extra_body={"proposer": "chained"}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content


def test_required_tool_choice_forces_a_call(needs_llguidance, agent_client):
    answer = agent_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}],
        max_tokens=80, tools=[WEATHER, CLOCK], tool_choice="required",
        extra_body={"proposer": "chained"})
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    for call in choice.message.tool_calls:
        assert call.id.startswith("call_") and call.type == "function"
        arguments = json.loads(call.function.arguments)
        tool = {"get_weather": WEATHER, "get_time": CLOCK}[call.function.name]
        jsonschema.validate(arguments, tool["function"].get("parameters", {}))


def test_a_named_tool_choice_calls_that_function(needs_llguidance, agent_client):
    answer = agent_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Oslo?"}],
        max_tokens=60, tools=[WEATHER, CLOCK],
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call, = answer.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_a_streamed_forced_call_arrives_as_a_tool_calls_delta(needs_llguidance, agent_client):
    chunks = list(agent_client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather?"}], max_tokens=60,
        tools=[WEATHER], tool_choice="required", stream=True))
    calls = [d for c in chunks if c.choices and (d := c.choices[0].delta).tool_calls]
    assert calls and calls[0].tool_calls[0].function.name == "get_weather"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_auto_tools_reach_the_template_and_plain_text_stays_content(agent_client, demo_chat):
    ask = [{"role": "user", "content": "Hello there"}]
    without = agent_client.chat.completions.create(model=MODEL, messages=ask, max_tokens=8)
    expected = demo_chat.chat(ask, GenerationOptions(max_new_tokens=8)) and \
        demo_chat.generate(*demo_chat.prepare_chat(ask, GenerationOptions(max_new_tokens=8),
                                                   tools=[WEATHER]))
    answer = agent_client.chat.completions.create(model=MODEL, messages=ask, max_tokens=8,
                                                  tools=[WEATHER])
    assert answer.usage.prompt_tokens > without.usage.prompt_tokens + 20  # tools rendered
    assert answer.usage.prompt_tokens == expected.num_prompt_tokens
    assert answer.choices[0].message.content == expected.text
    assert answer.choices[0].message.tool_calls is None
    none = agent_client.chat.completions.create(model=MODEL, messages=ask, max_tokens=8,
                                                tools=[WEATHER], tool_choice="none")
    assert none.usage.prompt_tokens == without.usage.prompt_tokens


def test_a_tool_turn_round_trips(agent_client):
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "C"}'}}
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "21 C, sunny"}]
    answer = agent_client.chat.completions.create(model=MODEL, messages=messages,
                                                  max_tokens=6, tools=[WEATHER])
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_chat_logprobs_are_the_engines(agent_client, demo_chat):
    expected = demo_chat.chat(ASK, GenerationOptions(max_new_tokens=12, logprobs=3))
    for extra in ({}, {"proposer": "chained", "k": 4}):
        answer = agent_client.chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=12, logprobs=True, top_logprobs=3,
            extra_body=extra)
        content = answer.choices[0].logprobs.content
        assert len(content) == len(expected.token_ids) == answer.usage.completion_tokens
        for got, entry in zip(content, expected.logprobs, strict=True):
            assert abs(got.logprob - entry.logprob) < 1e-4 and len(got.top_logprobs) == 3
            assert got.top_logprobs[0].logprob >= got.top_logprobs[1].logprob
            assert bytes(got.bytes).decode() == got.token


def test_streamed_chat_logprobs_are_the_whole_answers(agent_client):
    whole = agent_client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=12,
                                                 logprobs=True, top_logprobs=1)
    chunks = list(agent_client.chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=12, logprobs=True, top_logprobs=1,
        stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [e.logprob for e in streamed] == [e.logprob for e in whole.choices[0].logprobs.content]


def test_completion_logprobs_with_echo(agent_client, demo_chat):
    prompt = "def fib(n):"
    answer = agent_client.completions.create(model=MODEL, prompt=prompt, max_tokens=5,
                                             logprobs=2, echo=True)
    choice = answer.choices[0]
    num_prompt = len(demo_chat.tokenizer.encode(prompt))
    logprobs = choice.logprobs
    assert choice.text.startswith(prompt) and len(choice.text) > len(prompt)
    assert len(logprobs.tokens) == num_prompt + answer.usage.completion_tokens
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert all(lp <= 0 for lp in logprobs.token_logprobs[1:])
    assert "".join(logprobs.tokens) == choice.text
    assert logprobs.text_offset[num_prompt] == len(prompt)
    plain = agent_client.completions.create(model=MODEL, prompt=prompt, max_tokens=5)
    assert plain.choices[0].logprobs is None and choice.text == prompt + plain.choices[0].text


def test_n_choices_with_a_seed(agent_client):
    asked = dict(model=MODEL, messages=ASK, max_tokens=10, temperature=1.0, seed=5)
    one = agent_client.chat.completions.create(**asked)
    three = agent_client.chat.completions.create(n=3, **asked)
    texts = [c.message.content for c in three.choices]
    assert [c.index for c in three.choices] == [0, 1, 2]
    assert texts[0] == one.choices[0].message.content  # choice 0 keeps the seed
    assert len(set(texts)) > 1  # the others have seeds of their own
    assert three.usage.completion_tokens == 30 and three.usage.prompt_tokens == \
        one.usage.prompt_tokens
    again = agent_client.chat.completions.create(n=3, **asked)
    assert [c.message.content for c in again.choices] == texts


def test_streamed_n_choices_come_one_after_another(agent_client):
    chunks = list(agent_client.completions.create(
        model=MODEL, prompt="x = ", max_tokens=6, n=2, temperature=1.0, seed=3, stream=True,
        stream_options={"include_usage": True}))
    whole = agent_client.completions.create(model=MODEL, prompt="x = ", max_tokens=6, n=2,
                                            temperature=1.0, seed=3)
    for index in (0, 1):
        text = "".join(c.choices[0].text for c in chunks if c.choices and
                       c.choices[0].index == index)
        assert text == whole.choices[index].text
    assert chunks[-1].usage.completion_tokens == 12


def test_without_llguidance_a_grammar_is_400(agent_client, monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)
    with pytest.raises(openai.BadRequestError) as refused:
        agent_client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8,
                                             response_format={"type": "json_object"})
    assert "speculant[structured]" in refused.value.message


@pytest.mark.parametrize("fields, says", [
    ({"tool_choice": "required"}, "no tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
     "not one of the tools"),
    ({"tools": [WEATHER, WEATHER]}, "one name"),
    ({"top_logprobs": 2}, "needs logprobs"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
     "cannot both"),
])
def test_contradictory_requests_are_400(agent_client, fields, says):
    with pytest.raises(openai.BadRequestError) as refused:
        agent_client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=4, **fields)
    assert says in refused.value.message
