"""Chat templates (text/chat.py): rendered with jinja2 as transformers renders them, read from
``tokenizer_config.json``; `Engine.chat` / `chat_stream`, end-of-turn stops; the CLI's
`speculant chat` and `generate --chat`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import speculant
from builders import definition as fx
from builders.writers import write_decoder_package
from speculant import MetadataError, RequestError
from speculant.cli import full_app
from speculant.text.chat import ChatTemplate, load_chat_template

ROLE_CHECK = ("{% if message['role'] not in ['system', 'user', 'assistant'] %}"
              "{{ raise_exception('unknown role ' + message['role']) }}{% endif %}")
TEMPLATE = """{{ bos_token }}{% for message in messages %}
""" + ROLE_CHECK + """
{{ message['role'] }}
{{ message['content'] }}</s>
{% endfor %}
{% if add_generation_prompt %}
assistant
{% endif %}
"""
CONFIG = {"chat_template": TEMPLATE, "bos_token": "(", "eos_token": {"content": "</s>"}}
MESSAGES = [{"role": "user", "content": "def "}]


def with_config(root: Path, config) -> Path:
    (root / "tokenizer_config.json").write_text(
        config if isinstance(config, str) else json.dumps(config), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def chat_root(tmp_path_factory) -> Path:
    return with_config(write_decoder_package(tmp_path_factory.mktemp("chat") / "pkg"), CONFIG)


@pytest.fixture(scope="module")
def engine(chat_root) -> speculant.Engine:
    return speculant.load(chat_root)


def test_rendered_as_transformers_renders_it(engine):
    """trim_blocks and lstrip_blocks: block tags leave no newlines; bos_token from the
    config; the generation prompt opens the assistant's turn."""
    assert engine.render_chat(MESSAGES) == "(user\ndef </s>\nassistant\n"
    two = [{"role": "system", "content": "be brief"}, *MESSAGES]
    assert engine.chat_template.render(two, add_generation_prompt=False) == \
        "(system\nbe brief</s>\nuser\ndef </s>\n"


def test_the_end_of_turn_token_stops_a_chat(engine):
    assert engine.chat_template.end_of_turn_texts() == ("</s>",)
    """With the package's EOS stopping off, the template's end-of-turn token still stops."""
    messages = [{"role": "user", "content": "a"}]  # the fixture ends this turn at token 20
    chat = engine.chat(messages, max_new_tokens=40, stop_on_eos=False)
    assert chat.finish_reason == "stop" and chat.token_ids[-1] == fx.EOS_ID  # not the budget
    assert len(chat.token_ids) < 40
    assert engine.generate(engine.render_chat(messages), 40, stop_on_eos=False).finish_reason \
        == "length"  # without the end-of-turn stop it runs on
    plain = engine.generate(engine.render_chat(messages), 40, stop_on_eos=False,
                            stop_token_ids=[fx.EOS_ID])
    assert chat.token_ids == plain.token_ids and chat.text == plain.text
    assert chat.finish_reason == plain.finish_reason


def test_chat_stream_equals_chat(engine):
    stream = engine.chat_stream(MESSAGES, max_new_tokens=30, proposer="prompt_lookup", k=2)
    assert "".join(stream) == engine.chat(MESSAGES, 30).text == stream.result.text


def test_a_longer_turn_ending_becomes_a_stop_string(tmp_path):
    config = dict(CONFIG, chat_template=TEMPLATE.replace("</s>", "))"))
    template = load_chat_template(with_config(tmp_path, config) / "tokenizer.json")
    assert template.end_of_turn_texts() == ("))", "</s>")


def test_raise_exception_is_a_request_error(engine):
    with pytest.raises(RequestError) as caught:
        engine.chat([{"role": "robot", "content": "hi"}], 4)
    assert "unknown role robot" in str(caught.value) and caught.value.paths == ["messages"]


@pytest.mark.parametrize(("messages", "path"), [
    ([], "messages"), ("hi", "messages"), ([{"role": "user"}], "messages[0].content"),
    ([{"role": "user", "content": 3}], "messages[0].content"), (["hi"], "messages[0]"),
    ([{"role": "user", "content": "\ud800"}], "messages[0].content"),
])
def test_bad_messages(engine, messages, path):
    with pytest.raises(RequestError) as caught:
        engine.chat(messages, 4)
    assert caught.value.paths == [path]


def test_a_package_without_a_template(tmp_path):
    engine = speculant.load(write_decoder_package(tmp_path / "plain"))
    assert engine.chat_template is None
    with pytest.raises(RequestError) as caught:
        engine.chat(MESSAGES, 4)
    assert "tokenizer_config.json" in str(caught.value) and "Remedy" in str(caught.value)


@pytest.mark.parametrize("config", ["{not json", "[1, 2]", {"chat_template": 3},
                                    {"chat_template": "{% for %}"}])
def test_a_broken_config_is_refused_at_load(tmp_path, config):
    root = with_config(write_decoder_package(tmp_path / "broken"), config)
    with pytest.raises(MetadataError) as caught:
        speculant.load(root)
    assert "tokenizer_config.json" in str(caught.value)


def test_named_templates_pick_the_default(tmp_path):
    config = dict(CONFIG, chat_template=[{"name": "tool_use", "template": "x"},
                                         {"name": "default", "template": TEMPLATE}])
    template = load_chat_template(with_config(tmp_path, config) / "tokenizer.json")
    assert isinstance(template, ChatTemplate) and template.name == "default"


# -- the CLI ----------------------------------------------------------------------------------
def test_generate_chat(chat_root, engine):
    expected = engine.chat(MESSAGES, 20)
    result = CliRunner().invoke(full_app(), ["generate", str(chat_root), "--chat", "--prompt",
                                             "def ", "--max-new-tokens", "20"])
    assert result.exit_code == 0, result.output
    assert result.stdout == expected.text + "\n"


def test_interactive_chat_keeps_the_conversation(chat_root, engine):
    first = engine.chat(MESSAGES, 8)
    follow = [*MESSAGES, {"role": "assistant", "content": first.text},
              {"role": "user", "content": "ab"}]
    second = engine.chat(follow, 8)
    fresh = engine.chat([{"role": "user", "content": "ab"}], 8)
    assert first.text and second.text and fresh.text and second.text != fresh.text
    result = CliRunner().invoke(full_app(), ["chat", str(chat_root), "--max-new-tokens", "8"],
                                input="def \nab\n/stats\n/reset\nab\n/exit\nnever sent\n")
    assert result.exit_code == 0, result.output
    answers = [line.removeprefix("> ") for line in result.stdout.split("\n> ")]
    assert first.text in answers[0] and second.text in result.stdout
    assert fresh.text in result.stdout.split(second.text, 1)[1]
    assert "mean accepted length" in result.stderr and "tokens in" in result.stderr
    assert "never" not in result.stdout


def test_chat_without_a_template_fails_cleanly(tmp_path):
    root = write_decoder_package(tmp_path / "plain")
    result = CliRunner().invoke(full_app(), ["chat", str(root)], input="hi\n")
    assert result.exit_code == 2 and "RequestError" in result.stderr
    assert "Traceback" not in result.output


def test_chat_with_options_the_engine_refuses_fails_before_the_first_turn(chat_root):
    result = CliRunner().invoke(full_app(), ["chat", str(chat_root), "--proposer", "chained"],
                                input="hi\n")
    assert result.exit_code == 2 and "speculative" in result.stderr
    assert "> " not in result.stdout
