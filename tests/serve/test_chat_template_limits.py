"""Chat templates under the server (review 2026-12-07 §2a; issue 38): a chat is rendered before
its request waits for the engine, so a slow render holds no one; the probe's wedging template
is a 400 naming the file within the deadline, and the server serves on."""

from __future__ import annotations

import json
import shutil
import threading
import urllib.request
from pathlib import Path

import openai
import pytest

from speculant.serve import load_engine
from speculant.serve.app import create_app

GENEROUS_S = 60.0  # far above the 2 s render deadline
LOOP = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
HI = [{"role": "user", "content": "hi"}]


class RenderWaitsForACompletion:
    """The engine, with a ``prepare_chat`` that returns only once a completion has had the
    engine's turn: a server that rendered inside the engine's turn could never answer both."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.is_rendering = threading.Event()
        self.has_generated = threading.Event()
        self.saw_a_completion = False

    def prepare_chat(self, messages, options):
        self.is_rendering.set()
        self.saw_a_completion = self.has_generated.wait(GENEROUS_S)
        return self.engine.prepare_chat(messages, options)

    def __getattr__(self, name):  # package, tokenizer, stream: the engine's
        return getattr(self.engine, name)

    def decode(self, prompt, options):  # a completion has the engine's turn
        self.has_generated.set()
        return self.engine.decode(prompt, options)

    def chat_stream(self, messages, options):  # what a server that renders in the engine's
        return self.engine.stream(*self.prepare_chat(messages, options))  # turn calls


def client_of(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0,
                         timeout=GENEROUS_S)


def test_a_chat_renders_before_it_waits_for_the_engine(serve_app, engine):
    slow = RenderWaitsForACompletion(engine)
    client = client_of(serve_app(create_app(slow, "slow")))
    answers: dict[str, object] = {}
    chat = threading.Thread(target=lambda: answers.update(chat=client.chat.completions.create(
        model="slow", messages=HI, max_tokens=4)), daemon=True)
    chat.start()
    assert slow.is_rendering.wait(GENEROUS_S)
    completion = client.completions.create(model="slow", prompt="hello", max_tokens=4)
    assert completion.usage.completion_tokens == 4
    chat.join(GENEROUS_S)
    assert slow.saw_a_completion and answers["chat"].choices[0].message.content is not None


@pytest.fixture(scope="module")
def looping_base(serve_app, chat_package, tmp_path_factory) -> str:
    """A server whose template runs the probe's 10¹⁰-step loop on the message 'loop'."""
    root = Path(shutil.copytree(chat_package, tmp_path_factory.mktemp("loops") / "pkg"))
    config = json.loads((root / "tokenizer_config.json").read_text())
    config["chat_template"] = ("{% if messages[-1].content == 'loop' %}" + LOOP +
                               "{% endif %}" + config["chat_template"])
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    return serve_app(create_app(load_engine(str(root)), "loops"))


def test_the_wedging_template_is_a_400_and_the_server_serves_on(looping_base):
    client = client_of(looping_base)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="loops", max_tokens=4,
                                       messages=[{"role": "user", "content": "loop"}])
    assert "tokenizer_config.json" in refused.value.message
    assert "within 2 s" in refused.value.message
    with pytest.raises(openai.BadRequestError):  # streamed: refused before the 200
        client.chat.completions.create(model="loops", max_tokens=4, stream=True,
                                       messages=[{"role": "user", "content": "loop"}])
    assert client.chat.completions.create(model="loops", messages=HI, max_tokens=4).choices
    assert client.completions.create(model="loops", prompt="hello", max_tokens=4).choices
    with urllib.request.urlopen(f"{looping_base}/health", timeout=GENEROUS_S) as health:
        assert health.status == 200
