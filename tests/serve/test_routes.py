"""The OpenAI routes through the official client: the server's text is the engine's."""

from __future__ import annotations

import json

import pytest

from speculant import GenerationOptions

MODEL = "fixture"  # conftest.MODEL

PROMPT = "hello world"
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]


def test_models_and_health(client, raw):
    assert [m.id for m in client.models.list().data] == [MODEL]
    status, _, body = raw("GET", "/health")
    assert status == 200 and json.loads(body)["status"] == "ok"


@pytest.mark.parametrize("extra, options", [
    ({}, {}),
    ({"proposer": "chained", "k": 3}, {"proposer": "chained", "k": 3}),
    ({"proposer": "prompt_lookup", "k": 2}, {"proposer": "prompt_lookup", "k": 2}),
])
def test_completion_is_the_engines_text(client, engine, extra, options):
    expected = engine.generate(PROMPT, GenerationOptions(max_new_tokens=24, **options))
    answer = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24,
                                       extra_body=extra)
    assert answer.choices[0].text == expected.text
    assert answer.choices[0].finish_reason == expected.finish_reason == "length"
    assert answer.usage.completion_tokens == len(expected.token_ids) == 24
    assert answer.usage.prompt_tokens == expected.num_prompt_tokens


def test_streamed_completion_with_usage(client, engine):
    expected = engine.generate(PROMPT, GenerationOptions(max_new_tokens=20, proposer="chained"))
    chunks = list(client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=20, stream=True,
        stream_options={"include_usage": True}, extra_body={"proposer": "chained"}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) > 2  # pieces, not one blob
    assert "".join(texts) == expected.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20


def test_sampling_with_a_seed_is_the_engines(client, engine):
    options = dict(max_new_tokens=24, temperature=2.0, top_p=0.99, seed=7)
    expected = engine.generate(PROMPT, GenerationOptions(**options))
    answer = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24,
                                       temperature=2.0, top_p=0.99, seed=7)
    assert answer.choices[0].text == expected.text
    greedy = engine.generate(PROMPT, GenerationOptions(max_new_tokens=24))
    assert expected.text != greedy.text  # the sampling settings reached the engine


def test_stop_string_ends_the_text_before_it(client, engine):
    full = engine.generate(PROMPT, GenerationOptions(max_new_tokens=40)).text
    stop = full[10:13]
    expected = engine.generate(PROMPT, GenerationOptions(max_new_tokens=40, stop=(stop,)))
    assert expected.text == full[:full.index(stop)]
    answer = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, stop=[stop])
    assert answer.choices[0].text == expected.text
    assert answer.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40,
                                         stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == expected.text


def test_chat_is_the_engines_chat(client, engine):
    expected = engine.chat(MESSAGES, GenerationOptions(max_new_tokens=16))
    answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16)
    message = answer.choices[0].message
    assert message.role == "assistant" and message.content == expected.text
    assert answer.usage.prompt_tokens == expected.num_prompt_tokens
    completion = engine.generate(PROMPT, GenerationOptions(max_new_tokens=16))
    assert expected.text != completion.text  # the template was applied


def test_streamed_chat(client, engine):
    expected = engine.chat(MESSAGES, GenerationOptions(max_new_tokens=16, proposer="chained"))
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_completion_tokens=16, stream=True,
        stream_options={"include_usage": True}, extra_body={"proposer": "chained"}))
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == expected.text
    assert chunks[-1].usage.total_tokens == expected.num_prompt_tokens + 16
