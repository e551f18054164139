"""The request fields agent frameworks send: unknown fields are ignored (logged once), the
``developer`` and ``tool`` roles and an assistant's ``tool_calls`` are accepted."""

from __future__ import annotations

import json
import logging

from speculant import GenerationOptions
from speculant.serve.schemas import Message

MODEL = "fixture"  # conftest.MODEL
JSON = {"Content-Type": "application/json"}


def test_unknown_fields_are_ignored_and_logged_once(client, engine, caplog):
    expected = engine.generate("hello", GenerationOptions(max_new_tokens=6))
    with caplog.at_level(logging.INFO, logger="speculant.serve"):
        for _ in range(2):
            answer = client.completions.create(
                model=MODEL, prompt="hello", max_tokens=6,
                extra_body={"metadata": {"run": "a"}, "reasoning_effort": "low",
                            "stream_options": None, "some_future_field": [1, 2]})
            assert answer.choices[0].text == expected.text
    logged = [r.getMessage() for r in caplog.records if "unknown request field" in
              r.getMessage()]
    assert sorted(m.split("'")[1] for m in logged) == ["metadata", "reasoning_effort",
                                                       "some_future_field"]


def test_unknown_fields_in_a_chat_and_its_messages_are_ignored(raw, engine):
    messages = [{"role": "user", "content": "hi there", "refusal": None, "annotations": []}]
    status, _, body = raw("POST", "/v1/chat/completions", json.dumps({
        "model": MODEL, "messages": messages, "max_tokens": 5, "metadata": {"x": "y"},
        "store": False, "service_tier": "auto"}), JSON)
    assert status == 200, body
    expected = engine.chat([{"role": "user", "content": "hi there"}], max_new_tokens=5)
    assert json.loads(body)["choices"][0]["message"]["content"] == expected.text


def test_developer_is_system_where_the_template_has_no_developer_role(client, engine):
    developer = [{"role": "developer", "content": "be brief"},
                 {"role": "user", "content": "hi there"}]
    system = [{"role": "system", "content": "be brief"}, developer[1]]
    expected = engine.chat(system, GenerationOptions(max_new_tokens=8))
    answer = client.chat.completions.create(model=MODEL, messages=developer, max_tokens=8)
    assert answer.choices[0].message.content == expected.text
    assert answer.usage.prompt_tokens == expected.num_prompt_tokens


def test_developer_stays_developer_where_the_template_knows_it():
    message = Message(role="developer", content="be brief")
    assert message.as_dict(has_developer_role=True)["role"] == "developer"
    assert message.as_dict(has_developer_role=False)["role"] == "system"


def test_tool_results_and_earlier_calls_reach_the_template(client, engine):
    call = {"id": "call one", "type": "function",
            "function": {"name": "weather", "arguments": json.dumps({"city": "Paris"})}}
    messages = [{"role": "user", "content": "weather in paris"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call one", "content": "sunny"}]
    rendered = [Message.model_validate(m).as_dict() for m in messages]
    assert rendered[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert rendered[1]["content"] == "" and rendered[2]["tool_call_id"] == "call one"
    expected = engine.chat(rendered, GenerationOptions(max_new_tokens=8))
    answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)
    assert answer.choices[0].message.content == expected.text
    assert answer.usage.prompt_tokens == expected.num_prompt_tokens


def test_a_message_without_content_or_calls_is_400(raw):
    status, _, body = raw("POST", "/v1/chat/completions", json.dumps({
        "model": MODEL, "messages": [{"role": "user"}], "max_tokens": 4}), JSON)
    assert status == 400 and "content" in json.loads(body)["error"]["message"]
