"""`speculant chat` (chat_repl.py) driven as a user types: prompt_toolkit reads keys from a
pipe (Enter is ``\\r``, Alt-Enter ``\\x1b\\r``, Ctrl-C ``\\x03``, Ctrl-D ``\\x04``), the engine
is the chained fixture with a chat template, and Ctrl-C during an answer is raised from
inside the decode or between its pieces."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput
from typer.testing import CliRunner

import speculant
from builders.writers import write_chained_package
from speculant.chat_repl import ChatRepl, TerminalReader, default_history_path
from speculant.cli import full_app
from speculant.workflow.options import GenerationOptions
from speculant.workflow.target_pass import TargetPass

# Only characters of the fixture vocabulary (letters, space, parentheses, newline).
CHAT_TEMPLATE = ("{% for m in messages %}({{ m.role }}) {{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}(assistant) {% endif %}")
OLD_CAP = 64  # the answer cap the chat had


@pytest.fixture(scope="module")
def chat_root(tmp_path_factory) -> Path:
    root = write_chained_package(tmp_path_factory.mktemp("repl") / "chat", max_context=200)
    (root / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHAT_TEMPLATE, "bos_token": "", "eos_token": "</s>"}))
    return root


@pytest.fixture(scope="module")
def engine(chat_root) -> speculant.Engine:
    return speculant.load(chat_root)


class Recording:
    """The engine, recording each prompt it is asked to stream; ``interrupt_after=n``: the
    next answer is interrupted (Ctrl-C) after ``n`` pieces."""

    def __init__(self, engine: speculant.Engine, interrupt_after: int | None = None) -> None:
        self.engine, self.interrupt_after = engine, interrupt_after
        self.prompts: list[str] = []

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def stream(self, prompt, options):
        self.prompts.append(prompt)
        real = self.engine.stream(prompt, options)
        if self.interrupt_after is None:
            return real
        after, self.interrupt_after = self.interrupt_after, None
        return Interrupted(real, after)


class Interrupted:
    def __init__(self, real, after: int) -> None:
        self.real, self.after = real, after

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.real.close()

    def __iter__(self) -> Iterator[str]:
        for i, piece in enumerate(self.real):
            if i == self.after:
                raise KeyboardInterrupt
            yield piece

    def close(self) -> None:
        self.real.close()

    @property
    def result(self):
        return self.real.result


def chat(engine, keys: str, *, history: Path | None = None, system: str | None = None,
         **settings) -> tuple[ChatRepl, str, list]:
    """Run the chat on ``keys``; the REPL, what it wrote and its notices and errors."""
    out, notices = io.StringIO(), []
    with create_pipe_input() as keyboard:
        keyboard.send_text(keys)
        repl = ChatRepl(engine, GenerationOptions.of(**settings), TerminalReader(
            history, input=keyboard, output=DummyOutput()), out, say=notices.append,
            show_error=notices.append, show_stats=notices.append, system=system)
        repl.run()  # returns: a test that hangs here means a key was not handled
    return repl, out.getvalue(), notices


def answer_of(engine, messages) -> speculant.Generation:
    return engine.chat(messages, 10_000)


def test_an_answer_runs_to_the_end_of_turn_or_context_not_to_a_cap(engine):
    repl, out, _ = chat(engine, "hello\r\x04")
    expected = answer_of(engine, [{"role": "user", "content": "hello"}])
    assert len(expected.token_ids) > OLD_CAP
    assert repl.last.token_ids == expected.token_ids and expected.text in out


def test_max_new_tokens_caps_an_answer_when_set(engine):
    repl, _, notices = chat(engine, "/set max_new_tokens 5\rhello\r\x04")
    assert len(repl.last.token_ids) == 5 and any("cut at max_new_tokens" in n for n in notices)


def test_ctrl_c_between_pieces_stops_the_answer_and_keeps_the_conversation(engine):
    recording = Recording(engine, interrupt_after=3)
    repl, out, notices = chat(recording, "hello\rab\r/bye\r")
    partial = repl.messages[1]["content"]
    full = answer_of(engine, [{"role": "user", "content": "hello"}]).text
    assert partial and full.startswith(partial) and len(partial) < len(full)
    assert any("stopped" in n for n in notices)
    # the second turn was asked with the first: the user's line and the part shown
    assert repl.messages[:2] == [{"role": "user", "content": "hello"},
                                 {"role": "assistant", "content": partial}]
    assert recording.prompts[1] == engine.render_chat(repl.messages[:3])
    assert repl.messages[3]["content"] == answer_of(engine, repl.messages[:3]).text


def test_ctrl_c_inside_a_decode_step_keeps_the_conversation(engine, monkeypatch):
    """The interrupt lands inside the decode (during a target pass, as SIGINT would): the
    answer stops, the engine stays usable, and the next answer is the one a fresh engine
    gives for the conversation so far."""
    original, calls = TargetPass.run, []

    def interrupted_run(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)
    monkeypatch.setattr(TargetPass, "run", interrupted_run)
    repl, _, notices = chat(engine, "hello\rab\r\x04")
    monkeypatch.undo()
    assert any("stopped" in n for n in notices) and len(repl.messages) == 4
    assert repl.messages[3]["content"] == answer_of(engine, repl.messages[:3]).text


@pytest.mark.parametrize("key", ["\x03", "\x04"], ids=["ctrl-c", "ctrl-d"])
def test_ctrl_c_or_ctrl_d_at_the_prompt_leaves_cleanly(engine, key):
    recording = Recording(engine)
    repl, _, _ = chat(recording, "hello\r" + key + "never sent\r")
    assert len(recording.prompts) == 1 and len(repl.messages) == 2


def test_commands_are_handled_here_and_never_sent(engine):
    recording = Recording(engine)
    repl, _, notices = chat(recording, "/help\r/?\r/nonsense\r/set temperature 0.7\r"
                                       "/set top_p 2\r/set proposer nothing\r/set\r/stats\r/bye\r"
                                       "never sent\r")
    assert recording.prompts == []
    assert sum("/clear" in str(n) for n in notices) == 2  # /help and /?
    assert any("unknown command /nonsense" in str(n) for n in notices)
    assert repl.options.temperature == 0.7 and repl.options.top_p == 1.0  # 2 was refused
    assert repl.options.proposer is None  # the unknown proposer was refused
    assert any("top_p" in str(n) and "RequestError" in type(n).__name__ for n in notices)
    assert any("temperature=0.7" in str(n) for n in notices) and "no answer yet" in notices


def test_clear_forgets_the_conversation(engine):
    recording = Recording(engine)
    repl, _, _ = chat(recording, "hello\r/clear\rab\r\x04", system="be brief")
    assert recording.prompts[1] == engine.render_chat([
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"}])


def test_multi_line_input_by_block_and_alt_enter(engine):
    recording = Recording(engine)
    chat(recording, '"""ab\rcd"""\r/clear\rx\x1b\ry\r/clear\r"""/not a command"""\r\x04')
    assert recording.prompts == [engine.render_chat([{"role": "user", "content": text}])
                                 for text in ("ab\ncd", "x\ny", "/not a command")]


def test_history_is_kept_in_a_file(engine, tmp_path):
    history = tmp_path / "data" / "chat_history"
    chat(engine, "/help\r\x04", history=history)
    assert "/help" in history.read_text()
    assert default_history_path().name == "chat_history"
    assert "speculant" in default_history_path().parts[-2]


def test_a_conversation_that_fills_the_context_says_so_and_goes_on(engine):
    recording = Recording(engine)
    repl, _, notices = chat(recording, "a" * 300 + "\rab\r\x04")
    assert any("fills the context" in str(n) for n in notices)
    assert [m["content"] for m in repl.messages if m["role"] == "user"] == ["ab"]


def test_the_command_speculates_by_default_and_reads_a_pipe(chat_root, engine):
    runner = CliRunner()
    result = runner.invoke(full_app(), ["chat", str(chat_root)], input="hello\n/stats\n")
    assert result.exit_code == 0, result.output
    assert "speculation: chained" in result.stderr
    assert "proposer" in result.stderr and "chained" in result.stderr.split("counters")[1]
    expected = answer_of(engine, [{"role": "user", "content": "hello"}])
    assert expected.text in result.stdout
    plain = runner.invoke(full_app(), ["chat", str(chat_root), "--no-speculative"],
                          input="hello\n")
    assert plain.exit_code == 0 and "speculation: none" in plain.stderr
    assert expected.text in plain.stdout  # greedy either way: the same answer
