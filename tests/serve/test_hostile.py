"""Malformed and hostile requests get OpenAI-style 4xx errors; the server keeps serving."""

from __future__ import annotations

import json

import openai
import pytest

from builders.writers import write_decoder_package
from speculant.serve import load_engine
from speculant.serve.app import MAX_BODY_BYTES, create_app

MODEL = "fixture"  # conftest.MODEL
JSON = {"Content-Type": "application/json"}


def _completion(**fields) -> str:
    return json.dumps({"model": MODEL, "prompt": "hello", "max_tokens": 4, **fields})


@pytest.mark.parametrize("body, param", [
    ("{not json", None),
    ("[1, 2, 3]", None),
    ("", None),
    (json.dumps({"prompt": "hello"}), "model"),
    (_completion(max_tokens=0), "max_tokens"),
    (_completion(max_tokens="4"), "max_tokens"),
    (_completion(temperature=-1), "temperature"),
    (_completion(temperature="hot"), "temperature"),
    (_completion(top_p=0), "top_p"),
    (_completion(prompt=""), "prompt"),
    (_completion(prompt=[]), "prompt"),
    (_completion(stop=["a", "b", "c", "d", "e"]), "stop"),
    (_completion(stop=[""]), "stop"),
    (_completion(n=17), "n"),
    (_completion(n=2, best_of=3), None),
    (_completion(logprobs=21), "logprobs"),
    (_completion(response_format={"type": "json_schema"}), "response_format"),
    (_completion(proposer="eagle7"), "proposer"),
    (_completion(k=0), "k"),
    (_completion(presence_penalty=0.5), "presence_penalty"),
    (_completion(stream_options={"include_usage": True}), None),  # without stream=true
])
def test_bad_body_is_400(raw, body, param):
    status, headers, answer = raw("POST", "/v1/completions", body, JSON)
    assert status == 400, answer
    error = json.loads(answer)["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert error["param"].split(".")[0] == param


def test_refused_at_admission_is_400_also_when_streaming(client):
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model=MODEL, prompt="hello", max_tokens=4, stream=stream,
                                      extra_body={"proposer": "chained", "k": 99})
        assert "k" in refused.value.message


def test_prompt_over_the_context_is_400(client):
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="ab" * 200, max_tokens=4)


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="gpt-4", prompt="hello", max_tokens=4)
    assert missing.value.code == "model_not_found"


def test_unknown_route_and_method_are_json(raw):
    status, _, body = raw("GET", "/v1/nothing")
    assert status == 404 and "error" in json.loads(body)
    status, _, body = raw("GET", "/v1/completions")
    assert status == 405 and "error" in json.loads(body)


def test_oversized_bodies_are_413(raw):
    limit = MAX_BODY_BYTES
    declared = {**JSON, "Content-Length": str(limit + 1)}
    status, _, body = raw("POST", "/v1/completions", b"x", declared)
    assert status == 413 and json.loads(body)["error"]["code"] == "body_too_large"
    big = _completion(prompt="a" * (limit + 10)).encode()
    status, _, body = raw("POST", "/v1/completions", iter([big[:1000], big[1000:]]),
                          {**JSON, "Transfer-Encoding": "chunked"})  # no Content-Length
    assert status == 413, body


def test_chat_without_a_template_is_400(serve_app, tmp_path):
    package = write_decoder_package(tmp_path / "decoder")
    base = serve_app(create_app(load_engine(str(package)), "decoder"))
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="decoder", messages=[{"role": "user",
                                                                   "content": "hi"}])
    assert "chat template" in refused.value.message
    assert client.completions.create(model="decoder", prompt="ab", max_tokens=2).choices


def test_still_serving_after_all_of_it(client, raw):
    for body in ("{", "\x00\xff", json.dumps({"model": MODEL, "messages": "hi"}),
                 json.dumps({"model": MODEL, "messages": [{"role": "robot", "content": ""}]})):
        status, _, _ = raw("POST", "/v1/chat/completions", body, JSON)
        assert status == 400
    answer = client.completions.create(model=MODEL, prompt="hello", max_tokens=5)
    assert answer.usage.completion_tokens == 5
